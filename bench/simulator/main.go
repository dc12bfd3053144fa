// Command simulator replays access traces on the tiers' eviction
// strategies and on a reference W-TinyLFU (otter), beside Belady's optimum
// and a static frequency oracle, and prints hit ratios.
//
//	cd bench/simulator && go run .            # tables
//	go run . -json                            # one JSON object
//	go run . -trace ../testdata/x.trace ...   # other recorded traces
//
// It is a module of its own, as otter keeps its simulator, so that the
// comparison cache stays out of the kvsidecar module and the sidecar
// binary. Traces: the synthetic 80-20 and Zipf(0.99) traces of
// `sidecar bench kv` (same seed, same numbers) and every *.trace recorded
// by `sidecar serve --kv-trace` under ../testdata.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvsidecar/kvsidecar/bench/workload/cachesim"
	"github.com/kvsidecar/kvsidecar/tiers"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "simulator:", err)
		os.Exit(1)
	}
}

// Report is what the simulator prints with -json.
type Report struct {
	DefaultStrategy string `json:"default_strategy"`
	// Runs is the number of draws every figure is the mean of.
	Runs       int               `json:"runs"`
	Contenders []string          `json:"contenders"`
	Traces     []TraceInfo       `json:"traces"`
	Rows       []cachesim.Row    `json:"rows"`
	Standing   []DefaultStanding `json:"default_standing"`
	// Tuner is the AdaptiveTuner's eviction knob on the shifting trace
	// (TunerItems items, TunerAccesses accesses, an epoch of TunerEpoch).
	Tuner         []TunerRow `json:"tuner"`
	TunerItems    int        `json:"tuner_items"`
	TunerAccesses int        `json:"tuner_accesses"`
	TunerEpoch    int        `json:"tuner_epoch"`
}

// TraceInfo describes one trace.
type TraceInfo struct {
	Name     string `json:"name"`
	Items    int    `json:"items"`
	Accesses int    `json:"accesses"`
	// Recorded traces: what the store served while they were recorded.
	Source string               `json:"source,omitempty"`
	Stats  *cachesim.TraceStats `json:"recorded,omitempty"`
}

// DefaultStanding is the default strategy against W-TinyLFU and Belady on
// one trace at one size, in percentage points.
type DefaultStanding struct {
	Trace        string  `json:"trace"`
	SizePct      int     `json:"size_pct"`
	Default      float64 `json:"default"`
	WTinyLFU     float64 `json:"w_tinylfu"`
	Belady       float64 `json:"belady"`
	VsWTinyLFU   float64 `json:"vs_w_tinylfu_points"`
	BeladyGapPts float64 `json:"belady_gap_points"`
}

type options struct {
	items, accesses int
	seed            uint64
	runs            int
	sizes           []int
	traces          []string
	asJSON          bool
	tunerEpoch      int
}

func parse(args []string) (options, error) {
	fs := flag.NewFlagSet("simulator", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.items, "items", 10_000, "items of the synthetic traces")
	fs.IntVar(&o.accesses, "accesses", 100_000, "accesses of the synthetic traces")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the first draw of the synthetic traces (1 is sidecar bench kv's)")
	fs.IntVar(&o.runs, "runs", 5, "draws of the synthetic traces (seeds seed, seed+1, ...) and replays of recorded ones; figures are means")
	sizes := fs.String("sizes", "10,20,50", "cache sizes, percent of a trace's items")
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON object")
	fs.IntVar(&o.tunerEpoch, "tuner-epoch", 1000, "accesses between two steps of the AdaptiveTuner's balance on the shifting trace (0: leave that section out)")
	fs.Func("trace", "a recorded trace file (repeatable; default: ../testdata/*.trace)", func(s string) error {
		o.traces = append(o.traces, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 100 {
			return o, fmt.Errorf("bad size %q", s)
		}
		o.sizes = append(o.sizes, n)
	}
	if o.items < 10 || o.accesses < o.items || o.runs < 1 || o.tunerEpoch < 0 {
		return o, fmt.Errorf("want at least 10 items, as many accesses and one run")
	}
	if o.traces == nil {
		o.traces, _ = filepath.Glob(filepath.Join("..", "testdata", "*.trace"))
	}
	return o, nil
}

func run(args []string, w io.Writer) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	r, err := simulate(o)
	if err != nil {
		return err
	}
	if o.asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return writeTable(w, r)
}

// contenders are the default strategy first, then W-TinyLFU, then the
// other tiers strategies.
func contenders() []cachesim.Contender {
	cs := []cachesim.Contender{cachesim.TiersStrategy(tiers.DefaultStrategy), wTinyLFU}
	for _, s := range tiers.Strategies() {
		if s != tiers.DefaultStrategy {
			cs = append(cs, cachesim.TiersStrategy(s))
		}
	}
	return cs
}

func simulate(o options) (Report, error) {
	r := Report{DefaultStrategy: tiers.DefaultStrategy, Runs: o.runs}
	sets := make([][]cachesim.Trace, o.runs)
	for i := range sets {
		rng := rand.New(rand.NewPCG(o.seed+uint64(i), 2))
		sets[i] = []cachesim.Trace{
			cachesim.Uniform8020(o.items, o.accesses, rng),
			cachesim.Zipf(o.items, o.accesses, 0.99, rng),
		}
	}
	for _, t := range sets[0] {
		r.Traces = append(r.Traces, TraceInfo{Name: t.Name, Items: t.Items, Accesses: t.Accesses(), Source: "synthetic"})
	}
	for _, path := range o.traces {
		t, st, err := cachesim.ReadTraceFile(path)
		if err != nil {
			return r, err
		}
		if t.Accesses() == 0 {
			return r, fmt.Errorf("%s: no accesses", path)
		}
		for i := range sets {
			sets[i] = append(sets[i], t)
		}
		r.Traces = append(r.Traces, TraceInfo{Name: t.Name, Items: t.Items, Accesses: t.Accesses(), Source: path, Stats: &st})
	}
	cs := contenders()
	for _, c := range cs {
		r.Contenders = append(r.Contenders, c.Name)
	}
	rows, err := cachesim.RunAveraged(sets, o.sizes, cs)
	if err != nil {
		return r, err
	}
	r.Rows = rows
	if o.tunerEpoch > 0 {
		if r.Tuner, err = simulateTuner(o); err != nil {
			return r, err
		}
		r.TunerItems, r.TunerAccesses, r.TunerEpoch = o.items, o.accesses, o.tunerEpoch
	}
	for _, row := range rows {
		d, wt := row.HitRates[0], row.HitRates[1]
		r.Standing = append(r.Standing, DefaultStanding{Trace: row.Trace, SizePct: row.SizePct,
			Default: d, WTinyLFU: wt, Belady: row.Belady,
			VsWTinyLFU: 100 * (d - wt), BeladyGapPts: 100 * (row.Belady - d)})
	}
	return r, nil
}

func writeTable(w io.Writer, r Report) error {
	fmt.Fprintln(w, "traces:")
	for _, t := range r.Traces {
		if t.Stats == nil {
			fmt.Fprintf(w, "  %s: %d accesses over %d keys (%s)", t.Name, t.Accesses, t.Items, t.Source)
		} else {
			fmt.Fprintf(w, "  %s: %d accesses, at most %d keys alive (%s); recorded %d gets (%d hits), %d puts, %d deletes",
				t.Name, t.Accesses, t.Items, t.Source, t.Stats.Gets, t.Stats.Hits, t.Stats.Puts, t.Stats.Deletes)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nhit ratio, %%, mean of %d runs\n", r.Runs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "trace\tsize\tentries\tbelady\tstatic\t")
	for i, c := range r.Contenders {
		if i == 0 {
			c += " (default)"
		}
		fmt.Fprintf(tw, "%s\t", c)
	}
	fmt.Fprintln(tw)
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%d%%\t%d\t%.1f\t%.1f\t", row.Trace, row.SizePct, row.Capacity, 100*row.Belady, 100*row.Static)
		for _, h := range row.HitRates {
			fmt.Fprintf(tw, "%.1f\t", 100*h)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s against W-TinyLFU (otter) and Belady, points\n", r.DefaultStrategy)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "trace\tsize\tdefault − w-tinylfu\tbelady − default\t\n")
	for _, s := range r.Standing {
		fmt.Fprintf(tw, "%s\t%d%%\t%+.1f\t%.1f\t\n", s.Trace, s.SizePct, s.VsWTinyLFU, s.BeladyGapPts)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeTunerTable(w, r)
}
