package workload

// Amortization of a session's prefix KV (issue 7): sessions of T turns over
// one 2,048-token prefix, computed once by the reference KV computer and
// reloaded from Focus, Working or Archive through kv.Cache.GetOrCompute,
// measured against (C_compute + (T−1)·C_load)/T.

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// AmortOptions configure RunAmortization. The zero value runs the full
// benchmark: the default preset (llama3-8b scaled for a CPU), a
// 2,048-token prefix, T = 1..64, the three tiers, in a temporary
// directory, Focus on a CPU device.
type AmortOptions struct {
	// Quick divides the preset further (4× its default scale) so the run
	// takes a few seconds; the prefix and turns stay.
	Quick bool
	// Preset names the reference computer's shape (Presets).
	// Empty means DefaultPreset.
	Preset string
	// Scale overrides the preset's scale (see RefKVOptions).
	// Zero means its default (times 4 when Quick).
	Scale int
	// PrefixTokens is the prefix length. Zero means 2,048.
	PrefixTokens int
	// MaxTurns is the longest session, T. Zero means 64.
	MaxTurns int
	// Sessions per tier, each over its own prefix. Zero means 2.
	Sessions int
	// Tiers to measure, from "focus", "working", "archive". Nil means all.
	Tiers []string
	// Dir is a scratch directory for the Archive. Empty means a
	// temporary directory, removed afterwards.
	Dir string
	// Seed fixes weights and tokens. Zero means 1.
	Seed uint64
	// Device backs Focus (a GPU on a GPU host). Nil means a CPU device
	// owned by each run's store.
	Device gpu.Device
}

func (o *AmortOptions) validate() error {
	if o.PrefixTokens == 0 {
		o.PrefixTokens = 2048
	}
	if o.MaxTurns == 0 {
		o.MaxTurns = 64
	}
	if o.Sessions == 0 {
		o.Sessions = 2
	}
	if o.PrefixTokens < 1 || o.PrefixTokens > kv.MaxDim || o.MaxTurns < 2 || o.MaxTurns > 4096 || o.Scale < 0 || o.Sessions < 1 || o.Sessions > 64 {
		return fmt.Errorf("bench: amortization: prefix %d, turns %d, scale %d, sessions %d", o.PrefixTokens, o.MaxTurns, o.Scale, o.Sessions)
	}
	if o.Tiers == nil {
		o.Tiers = benchTiers
	}
	for _, t := range o.Tiers {
		if t != "focus" && t != "working" && t != "archive" {
			return fmt.Errorf("bench: amortization: unknown tier %q", t)
		}
	}
	if len(o.Tiers) == 0 {
		return fmt.Errorf("bench: amortization: no tier")
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	p, err := LookupPreset(o.Preset)
	if err != nil {
		return fmt.Errorf("bench: amortization: %w", err)
	}
	if o.Scale == 0 {
		o.Scale = p.Scale
		if o.Quick {
			o.Scale *= 4
		}
	}
	return nil
}

// AmortReport is the result of RunAmortization. Marshalled, it is the
// value of the "amortization" member of `sidecar bench --json`.
type AmortReport struct {
	// Preset is the reference computer's effective (scaled) shape.
	Preset       Preset `json:"preset"`
	DType        string `json:"dtype"`
	Device       string `json:"device"`
	PrefixTokens int    `json:"prefix_tokens"`
	BlockBytes   int64  `json:"block_bytes"`
	// ComputeMs is the mean prefill (the reference computer's run) over
	// every tier's sessions, as kv.Cache.AmortizationStats measured it.
	ComputeMs float64 `json:"compute_ms"`
	// LoadMs is C_load per tier, as kv.Cache.AmortizationStats measured it.
	LoadMs map[string]float64 `json:"load_ms"`
	// StoreMs is the cost of putting a computed block into each tier,
	// measured apart; a computing turn costs ComputeMs + StoreMs.
	StoreMs map[string]float64 `json:"store_ms"`
	// Sessions per tier.
	Sessions int `json:"sessions"`
	// Turns is the cost per turn of a T-turn session for T = 1..MaxTurns
	// in TurnsTier (Focus when measured): where a computed block lands.
	TurnsTier string      `json:"turns_tier"`
	Turns     []AmortTurn `json:"turns"`
	// Tiers has every tier's figures and curve.
	Tiers []AmortTier `json:"tiers"`
	// WorkingSpeedup is C_compute / C_load of Working.
	WorkingSpeedup float64 `json:"working_speedup"`
	// MaxFormulaErrorPct is the largest |measured − formula| / formula
	// over every T and tier, in percent.
	MaxFormulaErrorPct float64     `json:"max_formula_error_pct"`
	Goals              []AmortGoal `json:"goals"`
	Quick              bool        `json:"quick"`
	DurationSeconds    float64     `json:"duration_seconds"`
}

// AmortTurn is the cost per turn of a session of T turns: measured (the
// mean wall time of the first T GetOrCompute calls of a session, averaged
// over the sessions) and from the formula (C_compute + (T−1)·C_load)/T
// with that tier's C_compute, the mean wall time of its computing turns
// (AmortTier.MissMs), and C_load, the mean load time GetOrCompute measured
// inside the cache (AmortTier.LoadMs). At T = 1 the two agree by
// construction; beyond, the formula predicts the loads' share.
type AmortTurn struct {
	T          int     `json:"t"`
	MeasuredMs float64 `json:"measured_ms"`
	FormulaMs  float64 `json:"formula_ms"`
}

// AmortTier is one tier's session.
type AmortTier struct {
	Tier string `json:"tier"`
	// ComputeMs is the mean prefill and LoadMs the mean load, both timed
	// inside GetOrCompute (kv.Cache.AmortizationStats).
	ComputeMs float64 `json:"compute_ms"`
	LoadMs    float64 `json:"load_ms"`
	// StoreMs is the mean time of a Put of the block into the tier,
	// timed apart after the sessions.
	StoreMs float64 `json:"store_ms"`
	// MissMs is the mean wall time of the computing turns: C_compute.
	MissMs    float64 `json:"miss_ms"`
	LoadP50Ms float64 `json:"load_p50_ms"`
	LoadP99Ms float64 `json:"load_p99_ms"`
	// Speedup is ComputeMs / LoadMs.
	Speedup float64 `json:"speedup"`
	// Loads counts turns after the first; Hits those served by this tier.
	Loads   int     `json:"loads"`
	Hits    int     `json:"hits"`
	HitRate float64 `json:"hit_rate"`
	// CacheHitRate is the kv.Cache's own hits / (hits + misses).
	CacheHitRate float64     `json:"cache_hit_rate"`
	Turns        []AmortTurn `json:"turns"`
}

// AmortGoal is one of the goals, checked.
type AmortGoal struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target string  `json:"target"`
	Met    bool    `json:"met"`
}

// RunAmortization runs one session of MaxTurns turns per tier: turn 1
// computes the prefix's KV with RefKV through GetOrCompute (which
// stores it), turns 2..T load it from the tier under test (promotion is
// off so it stays there). The mean of the first T turns is the measured
// cost per turn of a T-turn session; each turn starts after a GC.
func RunAmortization(opts AmortOptions) (AmortReport, error) {
	if err := opts.validate(); err != nil {
		return AmortReport{}, err
	}
	start := time.Now()
	ref, err := NewRefKV(RefKVOptions{Preset: opts.Preset, Scale: opts.Scale, Seed: opts.Seed})
	if err != nil {
		return AmortReport{}, fmt.Errorf("bench: amortization: %w", err)
	}
	p := ref.Preset()
	dir, cleanup, err := scratchDir(opts.Dir, "amortbench-")
	if err != nil {
		return AmortReport{}, fmt.Errorf("bench: amortization: %w", err)
	}
	defer cleanup()
	rng := rand.New(rand.NewPCG(opts.Seed, 11))
	prefixes := make([][]int32, opts.Sessions)
	for s := range prefixes {
		prefixes[s] = make([]int32, opts.PrefixTokens)
		for i := range prefixes[s] {
			prefixes[s][i] = int32(rng.IntN(p.Vocab))
		}
	}
	r := AmortReport{
		Preset: p, DType: tiers.DTypeF16.String(), Device: "cpu", PrefixTokens: opts.PrefixTokens,
		BlockBytes: int64(opts.PrefixTokens) * int64(p.KVBytesPerToken(tiers.DTypeF16)),
		LoadMs:     map[string]float64{}, StoreMs: map[string]float64{}, Sessions: opts.Sessions, Quick: opts.Quick,
	}
	if opts.Device != nil {
		r.Device = opts.Device.Name()
	}
	var computeSum float64
	for _, tier := range opts.Tiers {
		at, err := amortTier(opts, tier, filepath.Join(dir, tier), r.BlockBytes, ref, prefixes)
		if err != nil {
			return r, err
		}
		r.Tiers = append(r.Tiers, at)
		r.LoadMs[tier] = at.LoadMs
		r.StoreMs[tier] = at.StoreMs
		computeSum += at.ComputeMs
	}
	r.ComputeMs = computeSum / float64(len(r.Tiers))
	r.TurnsTier, r.Turns = r.Tiers[0].Tier, r.Tiers[0].Turns
	for _, t := range r.Tiers {
		for _, tu := range t.Turns {
			if tu.FormulaMs > 0 {
				r.MaxFormulaErrorPct = max(r.MaxFormulaErrorPct, 100*math.Abs(tu.MeasuredMs-tu.FormulaMs)/tu.FormulaMs)
			}
		}
		if t.Tier == "working" {
			r.WorkingSpeedup = t.Speedup
			r.Goals = append(r.Goals, AmortGoal{Name: fmt.Sprintf("load from working vs compute at %d tokens", r.PrefixTokens),
				Value: t.Speedup, Target: "≥ 20×", Met: t.Speedup >= 20})
		}
	}
	r.Goals = append(r.Goals, AmortGoal{Name: "amortized cost vs formula, worst T and tier",
		Value: r.MaxFormulaErrorPct, Target: "≤ 10%", Met: r.MaxFormulaErrorPct <= 10})
	r.DurationSeconds = time.Since(start).Seconds()
	return r, nil
}

// amortTier runs the sessions on a cache whose blocks land in tier.
func amortTier(o AmortOptions, tier, dir string, blockBytes int64, ref *RefKV, prefixes [][]int32) (AmortTier, error) {
	so, err := tierOptions(tier, dir, blockBytes, 3*blockBytes+1<<20, o.Device)
	if err != nil {
		return AmortTier{}, fmt.Errorf("bench: amortization: %w", err)
	}
	c, err := kv.Open(kv.Options{Store: so})
	if err != nil {
		return AmortTier{}, fmt.Errorf("bench: amortization: %s: %w", tier, err)
	}
	defer func() {
		c.Close()
		os.RemoveAll(dir)
	}()
	at := AmortTier{Tier: tier}
	sums := make([]time.Duration, o.MaxTurns) // per T, over sessions
	var loads, misses []time.Duration
	var last *kv.Block
	for s, tokens := range prefixes {
		query := kv.PrefixQuery(ref.ModelID(), tokens)
		session := fmt.Sprintf("amortization-%d", s)
		var cum time.Duration
		for i := range o.MaxTurns {
			// Each turn starts on a collected heap, so that one turn's
			// garbage (a compute's is large) is not billed to the next.
			runtime.GC()
			t0 := time.Now()
			b, out, err := c.GetOrCompute(context.Background(), session, query, ref.ComputeFunc(tokens))
			d := time.Since(t0)
			if err != nil {
				return at, fmt.Errorf("bench: amortization: %s turn %d: %w", tier, i+1, err)
			}
			if i == 0 {
				if !out.Computed {
					return at, fmt.Errorf("bench: amortization: %s: first turn was not computed", tier)
				}
				misses = append(misses, d)
				last = b
			} else {
				loads = append(loads, d)
				at.Loads++
				if out.Tier.String() == tier {
					at.Hits++
				}
			}
			cum += d
			sums[i] += cum / time.Duration(i+1)
		}
	}
	// The cost of storing a computed block, apart from computing it.
	var store time.Duration
	const puts = 3
	for i := range puts {
		key := fmt.Sprintf("store-%d", i)
		runtime.GC()
		t0 := time.Now()
		if err := c.Put("amortization-store", key, last); err != nil {
			return at, fmt.Errorf("bench: amortization: %s store: %w", tier, err)
		}
		store += time.Since(t0)
		if err := c.Invalidate("amortization-store"); err != nil {
			return at, fmt.Errorf("bench: amortization: %s store: %w", tier, err)
		}
	}
	st := c.AmortizationStats()
	at.CacheHitRate = c.Stats().HitRate
	at.HitRate = float64(at.Hits) / float64(max(1, at.Loads))
	at.ComputeMs = float64(st.MeanComputeCost) / 1e6
	at.LoadMs = float64(st.MeanLoadCost[tier]) / 1e6
	at.StoreMs = float64(store) / puts / 1e6
	at.MissMs = meanMs(misses)
	at.LoadP50Ms = percentileMs(loads, 0.5)
	at.LoadP99Ms = percentileMs(loads, 0.99)
	if at.LoadMs > 0 {
		at.Speedup = at.ComputeMs / at.LoadMs
	}
	// C_compute is what a computing turn costs: the prefill, storing its
	// block, and the collection of the prefill's garbage that the store
	// runs into. (The prefill alone is ComputeMs; StoreMs timed apart
	// misses the collection.)
	cCompute := at.MissMs
	for T := 1; T <= o.MaxTurns; T++ {
		at.Turns = append(at.Turns, AmortTurn{T: T,
			MeasuredMs: float64(sums[T-1]) / float64(len(prefixes)) / 1e6,
			FormulaMs:  (cCompute + float64(T-1)*at.LoadMs) / float64(T),
		})
	}
	return at, nil
}

// amortTableTs are the T rows of the table.
var amortTableTs = []int{1, 2, 3, 4, 8, 16, 32, 64}

// WriteAmortTable writes r as tables for people.
func WriteAmortTable(w io.Writer, r AmortReport) error {
	fmt.Fprintf(w, "KV amortization: %s (scale 1/%d: %d layers, %d KV heads × %d, d_model %d), %d-token prefix = %.1f MiB %s, focus on %s\n",
		r.Preset.Name, r.Preset.Scale, r.Preset.Layers, r.Preset.KVHeads, r.Preset.HeadDim, r.Preset.DModel,
		r.PrefixTokens, float64(r.BlockBytes)/(1<<20), r.DType, r.Device)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "tier\tprefill ms\tstore ms\tcomputing turn ms\tload ms\tload p50\tload p99\tprefill/load\thit rate\t\n")
	for _, t := range r.Tiers {
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.1f\t%.3f\t%.3f\t%.3f\t%.0f×\t%.0f%%\t\n", t.Tier, t.ComputeMs, t.StoreMs, t.MissMs, t.LoadMs, t.LoadP50Ms, t.LoadP99Ms, t.Speedup, 100*t.HitRate)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\ncost per turn of a T-turn session, ms, mean of %d sessions (measured / formula (C_compute+(T−1)·C_load)/T, C_compute = a computing turn)\n", r.Sessions)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "T\t")
	for _, t := range r.Tiers {
		fmt.Fprintf(tw, "%s\t", t.Tier)
	}
	fmt.Fprintf(tw, "\n")
	for _, T := range amortTableTs {
		if len(r.Tiers) == 0 || T > len(r.Tiers[0].Turns) {
			break
		}
		fmt.Fprintf(tw, "%d\t", T)
		for _, t := range r.Tiers {
			tu := t.Turns[T-1]
			fmt.Fprintf(tw, "%.2f / %.2f\t", tu.MeasuredMs, tu.FormulaMs)
		}
		fmt.Fprintf(tw, "\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, g := range r.Goals {
		mark := "met"
		if !g.Met {
			mark = "NOT met"
		}
		fmt.Fprintf(w, "- %s: %.2f (goal %s) %s\n", g.Name, g.Value, g.Target, mark)
	}
	_, err := fmt.Fprintf(w, "(%.1f s)\n", r.DurationSeconds)
	return err
}

// amortColors per tier, for the plot.
var amortColors = map[string]string{"focus": "#d62728", "working": "#1f77b4", "archive": "#2ca02c"}

// WriteAmortSVG writes a line plot of cost per turn against T, on a
// logarithmic cost axis: measured (solid) and formula (dashed) per tier.
func WriteAmortSVG(w io.Writer, r AmortReport) error {
	const (
		width, height          = 760.0, 440.0
		left, right, top, bott = 70.0, 150.0, 40.0, 50.0
	)
	pw, ph := width-left-right, height-top-bott
	maxT := 1
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, t := range r.Tiers {
		for _, tu := range t.Turns {
			maxT = max(maxT, tu.T)
			for _, v := range []float64{tu.MeasuredMs, tu.FormulaMs} {
				if v > 0 {
					lo, hi = min(lo, v), max(hi, v)
				}
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0.001, 1
	}
	ylo, yhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yhi <= ylo {
		yhi = ylo + 1
	}
	x := func(T int) float64 { return left + pw*float64(T-1)/float64(max(1, maxT-1)) }
	y := func(v float64) float64 {
		v = max(v, math.Pow(10, ylo))
		return top + ph*(yhi-math.Log10(v))/(yhi-ylo)
	}
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%.0f" y="22" font-size="14">Cost per turn vs session length: %s, %d-token prefix (%s)</text>`+"\n", left, xmlEscape(r.Preset.Name), r.PrefixTokens, xmlEscape(r.Device))
	// Grid and axes.
	for d := ylo; d <= yhi; d++ {
		yy := y(math.Pow(10, d))
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, yy, left+pw, yy)
		p(`<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, yy+4, amortMs(math.Pow(10, d)))
	}
	for _, T := range []int{1, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256} {
		if T > maxT {
			break
		}
		xx := x(T)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", xx, top, xx, top+ph)
		p(`<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", xx, top+ph+16, T)
	}
	p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	p(`<text x="%.1f" y="%.1f" text-anchor="middle">turns per session T</text>`+"\n", left+pw/2, height-12)
	p(`<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">cost per turn (ms, log)</text>`+"\n", top+ph/2)
	// Curves and legend.
	ly := top + 10
	for _, t := range r.Tiers {
		color := amortColors[t.Tier]
		if color == "" {
			color = "#555"
		}
		for _, formula := range []bool{false, true} {
			p(`<polyline fill="none" stroke="%s" stroke-width="%s"`, color, map[bool]string{false: "2", true: "1.5"}[formula])
			if formula {
				p(` stroke-dasharray="6 4"`)
			}
			p(` points="`)
			for _, tu := range t.Turns {
				v := tu.MeasuredMs
				if formula {
					v = tu.FormulaMs
				}
				p("%.1f,%.1f ", x(tu.T), y(v))
			}
			p(`"/>` + "\n")
			label := t.Tier + " measured"
			dash := ""
			if formula {
				label, dash = t.Tier+" formula", ` stroke-dasharray="6 4"`
			}
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", left+pw+10, ly, left+pw+34, ly, color, dash)
			p(`<text x="%.1f" y="%.1f">%s</text>`+"\n", left+pw+40, ly+4, label)
			ly += 18
		}
	}
	p(`<text x="%.1f" y="%.1f" fill="#555">compute %s</text>`+"\n", left+pw+10, ly+10, amortMs(r.ComputeMs))
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

func amortMs(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%gms", v)
	}
	return fmt.Sprintf("%gµs", v*1000)
}

func xmlEscape(s string) string {
	out := make([]rune, 0, len(s))
	for _, c := range s {
		if c == '<' || c == '>' || c == '&' || c == '"' {
			c = '_'
		}
		out = append(out, c)
	}
	return string(out)
}
