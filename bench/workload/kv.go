package workload

// KV core benchmarks (MEM-002 and friends): eviction hit rates beside
// Belady's optimum, per-tier latency, archive throughput against plain
// files, compression ratios and the amortized cost of a turn.

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/workload/cachesim"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// KVOptions configure RunKV. The zero value runs the full benchmark in a
// temporary directory.
type KVOptions struct {
	// Quick shrinks latency, throughput and amortization runs so the whole
	// benchmark takes well under two minutes on two cores. Hit-rate traces
	// keep their full size (10,000 items, 100,000 accesses) either way.
	Quick bool
	// Dir is a scratch directory for archive and plain files. Empty means
	// a temporary directory, removed afterwards.
	Dir string
	// Items and Accesses size the hit-rate traces. Zero means 10,000 and
	// 100,000.
	Items, Accesses int
	// Seed makes traces and data reproducible. Zero means 1.
	Seed uint64
	// Strategies to replay. Nil means every strategy and preset.
	Strategies []string
}

func (o *KVOptions) validate() error {
	if o.Items == 0 {
		o.Items = 10_000
	}
	if o.Accesses == 0 {
		o.Accesses = 100_000
	}
	if o.Items < 10 || o.Accesses < o.Items {
		return fmt.Errorf("bench: kv: want at least 10 items and as many accesses, got %d and %d", o.Items, o.Accesses)
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Strategies == nil {
		o.Strategies = tiers.Strategies()
	}
	for _, s := range o.Strategies {
		if _, err := tiers.NewPolicy(s); err != nil {
			return fmt.Errorf("bench: kv: %w", err)
		}
	}
	return nil
}

// KVReport is the result of RunKV.
type KVReport struct {
	Quick           bool                 `json:"quick"`
	DefaultStrategy string               `json:"default_strategy"`
	HitRates        []KVHitRate          `json:"hit_rates"`
	Reach90         []KVReach            `json:"reach_90"`
	Latency         []KVLatency          `json:"latency"`
	Throughput      []KVThroughput       `json:"archive_throughput"`
	Compression     []KVCompression      `json:"compression"`
	Amortization    []KVAmortization     `json:"amortization"`
	MeasuredCosts   kv.AmortizationStats `json:"measured_costs"`
	Notes           []string             `json:"notes"`
	DurationSeconds float64              `json:"duration_seconds"`
}

// KVHitRate is one strategy on one trace at one cache size.
type KVHitRate struct {
	Trace    string  `json:"trace"`
	SizePct  int     `json:"size_pct"`
	Capacity int     `json:"capacity"`
	Strategy string  `json:"strategy"`
	HitRate  float64 `json:"hit_rate"`
	Belady   float64 `json:"belady"`
	// StaticOracle keeps the capacity most frequent items of the whole
	// trace (known in advance): the best an online policy can expect when
	// accesses are independent, as in both traces. Belady also knows the
	// order of accesses and no online policy can approach it on small
	// caches.
	StaticOracle float64 `json:"static_oracle"`
	// GapPoints is (Belady − HitRate) in percentage points.
	GapPoints float64 `json:"gap_points"`
}

// KVReach says at which cache size a 90% hit rate is reachable on a trace:
// by Belady's optimum and by the default strategy (0: at none tried).
type KVReach struct {
	Trace          string  `json:"trace"`
	BeladyPct      int     `json:"belady_size_pct"`
	DefaultPct     int     `json:"default_size_pct"`
	CompulsoryMiss float64 `json:"compulsory_miss_rate"`
}

// KVLatency is get and put latency of one tier for one block size.
type KVLatency struct {
	Tier      string  `json:"tier"`
	BlockSize int     `json:"block_bytes"`
	Ops       int     `json:"ops"`
	GetP50Ms  float64 `json:"get_p50_ms"`
	GetP99Ms  float64 `json:"get_p99_ms"`
	PutP50Ms  float64 `json:"put_p50_ms"`
	PutP99Ms  float64 `json:"put_p99_ms"`
}

// KVThroughput compares the archive with plain files holding the same bytes.
type KVThroughput struct {
	Op           string  `json:"op"`
	Bytes        int64   `json:"bytes"`
	ArchiveMBps  float64 `json:"archive_mb_per_s"`
	PlainMBps    float64 `json:"plain_mb_per_s"`
	RatioToPlain float64 `json:"ratio_to_plain"`
}

// KVCompression is the archive's compression ratio (raw/stored) of a kind
// of data with one codec.
type KVCompression struct {
	Data  string  `json:"data"`
	Codec string  `json:"codec"`
	Raw   int     `json:"raw_bytes"`
	Ratio float64 `json:"ratio"`
}

// KVAmortization is the cost per turn over T turns of one prefix when the
// KV block is reloaded from one tier: measured (mean of the first T turns
// of a real session) and from the formula (C_compute+(T−1)·C_load)/T.
type KVAmortization struct {
	Tier       string  `json:"tier"`
	Turns      int     `json:"turns"`
	MeasuredMs float64 `json:"measured_ms"`
	FormulaMs  float64 `json:"formula_ms"`
	Speedup    float64 `json:"speedup"`
}

// RunKV runs the KV benchmarks.
func RunKV(opts KVOptions) (KVReport, error) {
	if err := opts.validate(); err != nil {
		return KVReport{}, err
	}
	start := time.Now()
	dir, cleanup, err := scratchDir(opts.Dir, "kvbench-")
	if err != nil {
		return KVReport{}, fmt.Errorf("bench: kv: %w", err)
	}
	defer cleanup()
	r := KVReport{Quick: opts.Quick, DefaultStrategy: tiers.DefaultStrategy}
	if r.HitRates, r.Reach90, err = kvHitRates(opts); err != nil {
		return r, err
	}
	if r.Latency, err = kvLatency(opts, filepath.Join(dir, "latency")); err != nil {
		return r, err
	}
	if r.Throughput, err = kvThroughput(opts, filepath.Join(dir, "throughput")); err != nil {
		return r, err
	}
	r.Compression = kvCompression(opts)
	if r.Amortization, r.MeasuredCosts, err = kvAmortization(opts, filepath.Join(dir, "amortization")); err != nil {
		return r, err
	}
	r.Notes = kvNotes(r)
	r.DurationSeconds = time.Since(start).Seconds()
	return r, nil
}

// kvHitRates replays the 80-20 and Zipf(0.99) traces on every strategy
// at 10, 20 and 50% of the items, beside Belady and the static oracle.
func kvHitRates(o KVOptions) ([]KVHitRate, []KVReach, error) {
	rng := rand.New(rand.NewPCG(o.Seed, 2))
	traces := []cachesim.Trace{
		cachesim.Uniform8020(o.Items, o.Accesses, rng),
		cachesim.Zipf(o.Items, o.Accesses, 0.99, rng),
	}
	cs := make([]cachesim.Contender, len(o.Strategies))
	for i, s := range o.Strategies {
		cs[i] = cachesim.TiersStrategy(s)
	}
	sim, err := cachesim.Run(traces, []int{10, 20, 50}, cs)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: kv: %w", err)
	}
	var rows []KVHitRate
	var reach []KVReach
	for _, tr := range traces {
		distinct := map[uint64]bool{}
		for _, k := range tr.Keys {
			distinct[k] = true
		}
		re := KVReach{Trace: tr.Name, CompulsoryMiss: float64(len(distinct)) / float64(len(tr.Keys))}
		for _, r := range sim {
			if r.Trace != tr.Name {
				continue
			}
			if r.Belady >= 0.9 && re.BeladyPct == 0 {
				re.BeladyPct = r.SizePct
			}
			for i, s := range o.Strategies {
				hr := r.HitRates[i]
				rows = append(rows, KVHitRate{Trace: r.Trace, SizePct: r.SizePct, Capacity: r.Capacity, Strategy: s,
					HitRate: hr, Belady: r.Belady, StaticOracle: r.Static, GapPoints: 100 * (r.Belady - hr)})
				if s == tiers.DefaultStrategy && hr >= 0.9 && re.DefaultPct == 0 {
					re.DefaultPct = r.SizePct
				}
			}
		}
		reach = append(reach, re)
	}
	return rows, reach, nil
}

// kvFP16 makes KV-like data: normally distributed values stored as fp16.
func kvFP16(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 3))
	b := make([]byte, n&^1)
	for i := 0; i+1 < len(b); i += 2 {
		binary.LittleEndian.PutUint16(b[i:], tiers.F32ToF16(float32(rng.NormFloat64())))
	}
	return b
}

func kvLatency(o KVOptions, dir string) ([]KVLatency, error) {
	var rows []KVLatency
	for _, size := range []int{128 << 10, 1 << 20, 16 << 20} {
		ops := 200
		switch {
		case size >= 16<<20 && o.Quick:
			ops = 8
		case size >= 16<<20:
			ops = 24
		case o.Quick:
			ops = 50
		}
		vals := make([]tiers.Value, ops)
		for i := range vals {
			vals[i] = tiers.Value{Meta: tiers.Meta{DType: tiers.DTypeF16, Tokens: int64(size / (128 << 10))}, Data: kvFP16(size, uint64(i))}
		}
		for _, tier := range benchTiers {
			row := KVLatency{Tier: tier, BlockSize: size, Ops: ops}
			puts, gets, err := kvTierLatency(tier, filepath.Join(dir, strconv.Itoa(size)), int64(size), vals)
			if err != nil {
				return nil, fmt.Errorf("bench: kv: latency of %s: %w", tier, err)
			}
			row.GetP50Ms, row.GetP99Ms = percentileMs(gets, 0.5), percentileMs(gets, 0.99)
			row.PutP50Ms, row.PutP99Ms = percentileMs(puts, 0.5), percentileMs(puts, 0.99)
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// kvTierLatency puts vals into a store where they land in tier, then gets
// them back, timing each call.
func kvTierLatency(tier, dir string, size int64, vals []tiers.Value) (puts, gets []time.Duration, err error) {
	so, err := tierOptions(tier, dir, size, 2*int64(len(vals))*size+1<<20, nil)
	if err != nil {
		return nil, nil, err
	}
	st, err := tiers.Open(so)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		st.Close()
		os.RemoveAll(dir)
	}()
	for i, v := range vals {
		t0 := time.Now()
		if err := st.Put("k"+strconv.Itoa(i), v, tiers.PutOptions{}); err != nil {
			return nil, nil, err
		}
		puts = append(puts, time.Since(t0))
	}
	for i := range vals {
		t0 := time.Now()
		_, t, err := st.Get("k" + strconv.Itoa(i))
		if err != nil || t.String() != tier {
			return nil, nil, fmt.Errorf("get: %v (served by %s)", err, t)
		}
		gets = append(gets, time.Since(t0))
	}
	return puts, gets, nil
}

// kvThroughput writes and reads the same fp16 blocks through the archive
// and as plain files (create, write, fsync, close, fsync the folder), in
// the same run, and reports the ratio.
func kvThroughput(o KVOptions, dir string) ([]KVThroughput, error) {
	n, size := 64, 1<<20
	if o.Quick {
		n = 24
	}
	vals := make([][]byte, n)
	for i := range vals {
		vals[i] = kvFP16(size, uint64(100+i))
	}
	total := int64(n * size)
	plainDir := filepath.Join(dir, "plain")
	if err := os.MkdirAll(plainDir, 0o700); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	a, err := tiers.OpenArchive(tiers.ArchiveOptions{Dir: filepath.Join(dir, "archive")})
	if err != nil {
		return nil, err
	}
	defer a.Close()
	syncDir := func(d string) error {
		f, err := os.Open(d)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	}
	// Alternate the two so that disk state and CPU frequency affect both alike.
	var plainW, archW, plainR, archR time.Duration
	for i, v := range vals {
		t0 := time.Now()
		name := filepath.Join(plainDir, strconv.Itoa(i))
		f, err := os.Create(name)
		if err != nil {
			return nil, err
		}
		if _, err := f.Write(v); err != nil {
			return nil, err
		}
		if err := f.Sync(); err != nil {
			return nil, err
		}
		f.Close()
		if err := syncDir(plainDir); err != nil {
			return nil, err
		}
		plainW += time.Since(t0)
		t0 = time.Now()
		if err := a.Put(strconv.Itoa(i), tiers.Value{Meta: tiers.Meta{DType: tiers.DTypeF16}, Data: v}, false); err != nil {
			return nil, err
		}
		archW += time.Since(t0)
	}
	for i := range vals {
		t0 := time.Now()
		if _, err := os.ReadFile(filepath.Join(plainDir, strconv.Itoa(i))); err != nil {
			return nil, err
		}
		plainR += time.Since(t0)
		t0 = time.Now()
		if _, _, err := a.Get(strconv.Itoa(i)); err != nil {
			return nil, err
		}
		archR += time.Since(t0)
	}
	mbps := func(d time.Duration) float64 { return float64(total) / 1e6 / d.Seconds() }
	return []KVThroughput{
		{Op: "write", Bytes: total, ArchiveMBps: mbps(archW), PlainMBps: mbps(plainW), RatioToPlain: plainW.Seconds() / archW.Seconds()},
		{Op: "read", Bytes: total, ArchiveMBps: mbps(archR), PlainMBps: mbps(plainR), RatioToPlain: plainR.Seconds() / archR.Seconds()},
	}, nil
}

// kvConversation makes conversation-like text: chat turns in JSON lines
// built from a Zipf-distributed vocabulary. Synthetic, but with the
// repetition (roles, keys, frequent words) real chat logs have.
func kvConversation(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 4))
	words := strings.Fields(`the a to and of I you it is that in for on this with
		be can do have what how not are my your we they please thanks question answer code
		function error file data model token memory session cache context prompt user assistant
		server request response time test run build value key list return string number table
		query index search result because should would could about which there their when then
		example python golang config deploy latency budget archive tier window summary fact`)
	cdf := make([]float64, len(words))
	sum := 0.0
	for i := range words {
		sum += 1 / float64(i+1)
		cdf[i] = sum
	}
	var b strings.Builder
	for turn := 0; b.Len() < n; turn++ {
		role := "user"
		if turn%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `{"role":%q,"turn":%d,"content":"`, role, turn)
		for range 8 + rng.IntN(60) {
			k, _ := slices.BinarySearch(cdf, rng.Float64()*sum)
			b.WriteString(words[min(k, len(words)-1)])
			if rng.IntN(12) == 0 {
				b.WriteString(". ")
			} else {
				b.WriteByte(' ')
			}
		}
		b.WriteString("\"}\n")
	}
	return []byte(b.String()[:n])
}

func kvCompression(o KVOptions) []KVCompression {
	size := 4 << 20
	if o.Quick {
		size = 1 << 20
	}
	fp16 := kvFP16(size, 7)
	text := kvConversation(size, 8)
	ratio := func(data []byte, d tiers.DType, lossy bool) float64 {
		stored := tiers.StoredSize(data, d, lossy)
		return float64(len(data)) / float64(stored)
	}
	return []KVCompression{
		{Data: "fp16 KV (normal)", Codec: "zstd", Raw: size, Ratio: ratio(fp16, tiers.DTypeNone, false)},
		{Data: "fp16 KV (normal)", Codec: "planes+zstd", Raw: size, Ratio: ratio(fp16, tiers.DTypeF16, false)},
		{Data: "fp16 KV (normal)", Codec: "q8+zstd (lossy)", Raw: size, Ratio: ratio(fp16, tiers.DTypeF16, true)},
		{Data: "conversation text", Codec: "zstd", Raw: size, Ratio: ratio(text, tiers.DTypeNone, false)},
	}
}

// kvAmortization is RunAmortization's measurement (the reference KV
// computer, a 2,048-token prefix) in the KV report's shape: rows for T a
// power of two, and the measured costs.
func kvAmortization(o KVOptions, dir string) ([]KVAmortization, kv.AmortizationStats, error) {
	r, err := RunAmortization(AmortOptions{Quick: o.Quick, Dir: dir, Seed: o.Seed})
	if err != nil {
		return nil, kv.AmortizationStats{}, err
	}
	ms := func(v float64) time.Duration { return time.Duration(v * 1e6) }
	st := kv.AmortizationStats{MeanComputeCost: ms(r.ComputeMs), MeanLoadCost: map[string]time.Duration{}}
	var rows []KVAmortization
	for _, t := range r.Tiers {
		st.MeanLoadCost[t.Tier] = ms(t.LoadMs)
		for _, turn := range t.Turns {
			if turn.T&(turn.T-1) != 0 {
				continue // powers of two
			}
			rows = append(rows, KVAmortization{
				Tier: t.Tier, Turns: turn.T, MeasuredMs: turn.MeasuredMs, FormulaMs: turn.FormulaMs,
				Speedup: t.MissMs / max(turn.MeasuredMs, 1e-9),
			})
		}
	}
	return rows, st, nil
}

func kvNotes(r KVReport) []string {
	var notes []string
	worst := map[string]float64{}
	for _, h := range r.HitRates {
		worst[h.Strategy] = max(worst[h.Strategy], h.GapPoints)
	}
	notes = append(notes, fmt.Sprintf("default strategy %s: worst gap to Belady %.1f points (goal ≤ 5)",
		r.DefaultStrategy, worst[r.DefaultStrategy]))
	best, bestGap := "", math.Inf(1)
	for s, g := range worst {
		if g < bestGap {
			best, bestGap = s, g
		}
	}
	notes = append(notes, fmt.Sprintf("smallest worst-case gap: %s, %.1f points", best, bestGap))
	worstStatic := 0.0
	for _, h := range r.HitRates {
		if h.Strategy == r.DefaultStrategy {
			worstStatic = max(worstStatic, 100*(h.StaticOracle-h.HitRate))
		}
	}
	notes = append(notes, fmt.Sprintf("default strategy %s: worst gap to the static frequency oracle %.1f points", r.DefaultStrategy, worstStatic))
	for _, re := range r.Reach90 {
		b, d := "at no size tried", "at no size tried"
		if re.BeladyPct > 0 {
			b = fmt.Sprintf("from %d%%", re.BeladyPct)
		}
		if re.DefaultPct > 0 {
			d = fmt.Sprintf("from %d%%", re.DefaultPct)
		}
		notes = append(notes, fmt.Sprintf("%s: 90%% hit rate reachable by Belady %s, by %s %s (compulsory misses alone %.1f%%)",
			re.Trace, b, r.DefaultStrategy, d, 100*re.CompulsoryMiss))
	}
	for _, l := range r.Latency {
		if l.Tier == "working" && l.BlockSize == 1<<20 {
			notes = append(notes, fmt.Sprintf("working 1 MiB get p99 %.3f ms (goal < 1 ms)", l.GetP99Ms))
		}
		if l.Tier == "archive" && l.BlockSize == 16<<20 {
			notes = append(notes, fmt.Sprintf("archive 16 MiB get p99 %.1f ms, put p99 %.1f ms (goal < 100 ms)", l.GetP99Ms, l.PutP99Ms))
		}
	}
	for _, t := range r.Throughput {
		notes = append(notes, fmt.Sprintf("archive %s throughput %.2f× plain files (goal ≥ 0.7)", t.Op, t.RatioToPlain))
	}
	return notes
}

// WriteKVTable writes r as tables for people.
func WriteKVTable(w io.Writer, r KVReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "MEM-002 hit rate vs Belady\t\t\t\t\t\t\n")
	fmt.Fprintf(tw, "trace\tsize\tstrategy\thit%%\tbelady%%\tgap\tstatic oracle%%\t\n")
	for _, h := range r.HitRates {
		fmt.Fprintf(tw, "%s\t%d%%\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t\n", h.Trace, h.SizePct, h.Strategy, 100*h.HitRate, 100*h.Belady, h.GapPoints, 100*h.StaticOracle)
	}
	fmt.Fprintf(tw, "\ntier latency (ms)\t\t\t\t\t\t\t\n")
	fmt.Fprintf(tw, "tier\tblock\tops\tget p50\tget p99\tput p50\tput p99\t\n")
	for _, l := range r.Latency {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t\n", l.Tier, kvSize(l.BlockSize), l.Ops, l.GetP50Ms, l.GetP99Ms, l.PutP50Ms, l.PutP99Ms)
	}
	fmt.Fprintf(tw, "\narchive throughput\t\t\t\t\n")
	fmt.Fprintf(tw, "op\tarchive MB/s\tplain MB/s\tratio\t\n")
	for _, t := range r.Throughput {
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\t\n", t.Op, t.ArchiveMBps, t.PlainMBps, t.RatioToPlain)
	}
	fmt.Fprintf(tw, "\ncompression\t\t\t\n")
	fmt.Fprintf(tw, "data\tcodec\tratio\t\n")
	for _, c := range r.Compression {
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t\n", c.Data, c.Codec, c.Ratio)
	}
	fmt.Fprintf(tw, "\namortized cost per turn (ms)\t\t\t\t\t\n")
	fmt.Fprintf(tw, "tier\tT\tmeasured\tformula\tspeedup\t\n")
	for _, a := range r.Amortization {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.1f×\t\n", a.Tier, a.Turns, a.MeasuredMs, a.FormulaMs, a.Speedup)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nmeasured: compute %.2f ms; load", float64(r.MeasuredCosts.MeanComputeCost)/1e6)
	for _, t := range []string{"focus", "working", "archive"} {
		fmt.Fprintf(w, " %s %.3f ms", t, float64(r.MeasuredCosts.MeanLoadCost[t])/1e6)
	}
	fmt.Fprintln(w)
	for _, n := range r.Notes {
		fmt.Fprintln(w, "- "+n)
	}
	_, err := fmt.Fprintf(w, "(%.1f s)\n", r.DurationSeconds)
	return err
}

func kvSize(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + " MiB"
	}
	return strconv.Itoa(n>>10) + " KiB"
}
