package main

// The AdaptiveTuner's eviction knob (issue 24) on a trace whose pattern
// changes midway: each tunable strategy at every fixed balance (its recency
// share: w-tinylfu's admission window, weighted's recency weight) against
// the same strategy with tiers.BalanceClimber moving the balance every
// epoch, as the live tuner does.

import (
	"fmt"
	"io"
	"math/rand/v2"
	"text/tabwriter"

	"github.com/kvsidecar/kvsidecar/bench/workload/cachesim"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// TunerRow is one strategy at one cache size on the shifting trace: hit
// ratios over the whole trace (first half, second half), means of the runs.
type TunerRow struct {
	Strategy string  `json:"strategy"`
	SizePct  int     `json:"size_pct"`
	Capacity int     `json:"capacity"`
	Belady   float64 `json:"belady"`
	// Fixed has one entry per balance of Balances.
	Fixed []Phases `json:"fixed"`
	// Own is the strategy as the store runs it without the tuner (its
	// initial balance; w-tinylfu with its own window climbing).
	Own   Phases `json:"own"`
	Tuned Phases `json:"tuned"`
	// Otter is otter's W-TinyLFU, for reference.
	Otter Phases `json:"otter"`
	// BestFixed is the best whole-trace figure of Fixed, at BestBalance;
	// TunedVsBest is Tuned's whole-trace figure less it, in points.
	BestFixed   float64 `json:"best_fixed"`
	BestBalance float64 `json:"best_balance"`
	WorstFixed  float64 `json:"worst_fixed"`
	TunedVsBest float64 `json:"tuned_vs_best_points"`
}

// Phases is a hit ratio over a trace and over its two halves.
type Phases struct {
	All    float64 `json:"all"`
	First  float64 `json:"first_half"`
	Second float64 `json:"second_half"`
}

func (p *Phases) add(first, second, all, w float64) {
	p.First += w * first
	p.Second += w * second
	p.All += w * all
}

// Balances are the fixed settings the tuned runs are compared with.
var Balances = []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}

// TunedStrategies are the strategies with a balance.
var TunedStrategies = []string{tiers.StrategyTinyLFU, tiers.StrategyWeighted}

func simulateTuner(o options) ([]TunerRow, error) {
	var rows []TunerRow
	w := 1 / float64(o.runs)
	for _, st := range TunedStrategies {
		for _, pct := range o.sizes {
			capacity := max(1, o.items*pct/100)
			row := TunerRow{Strategy: st, SizePct: pct, Capacity: capacity, Fixed: make([]Phases, len(Balances))}
			for run := range o.runs {
				t := cachesim.Shifting(o.items, o.accesses, rand.New(rand.NewPCG(o.seed+uint64(run), 24)))
				cut := o.accesses / 2
				row.Belady += w * cachesim.Belady(t, capacity)
				for i, b := range Balances {
					p, err := cachesim.NewTiersBalance(st, capacity, b)
					if err != nil {
						return nil, err
					}
					row.Fixed[i].add(phases(t, p, cut, w))
				}
				p, err := cachesim.NewTiersTuned(st, capacity, o.tunerEpoch, 0)
				if err != nil {
					return nil, err
				}
				row.Tuned.add(phases(t, p, cut, w))
				own, err := cachesim.NewTiers(st, capacity)
				if err != nil {
					return nil, err
				}
				row.Own.add(phases(t, own, cut, w))
				ot, err := wTinyLFU.New(capacity)
				if err != nil {
					return nil, err
				}
				row.Otter.add(phases(t, ot, cut, w))
			}
			row.WorstFixed = 1
			for i, f := range row.Fixed {
				if f.All > row.BestFixed {
					row.BestFixed, row.BestBalance = f.All, Balances[i]
				}
				row.WorstFixed = min(row.WorstFixed, f.All)
			}
			row.TunedVsBest = 100 * (row.Tuned.All - row.BestFixed)
			rows = append(rows, row)
		}
	}
	return rows, nil
}

func phases(t cachesim.Trace, p cachesim.Policy, cut int, w float64) (float64, float64, float64, float64) {
	f, s, a := cachesim.ReplayPhases(t, p, cut)
	return f, s, a, w
}

func writeTunerTable(w io.Writer, r Report) error {
	if len(r.Tuner) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nAdaptiveTuner on the shifting trace (%d items: Zipf 0.99, then a sliding window over %d new items; %d accesses; balance climbed every %d accesses), hit ratio %%, whole trace (first half / second half), mean of %d runs\n",
		r.TunerItems, r.TunerItems, r.TunerAccesses, r.TunerEpoch, r.Runs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "strategy\tsize\tbelady\ttuned\town\totter\tbest fixed (at)\tworst fixed\ttuned − best\t")
	for _, b := range Balances {
		fmt.Fprintf(tw, "@%.1f\t", b)
	}
	fmt.Fprintln(tw)
	ph := func(p Phases) string { return fmt.Sprintf("%.1f (%.1f/%.1f)", 100*p.All, 100*p.First, 100*p.Second) }
	for _, row := range r.Tuner {
		fmt.Fprintf(tw, "%s\t%d%%\t%.1f\t%s\t%s\t%s\t%.1f (%.1f)\t%.1f\t%+.1f\t", row.Strategy, row.SizePct, 100*row.Belady, ph(row.Tuned), ph(row.Own), ph(row.Otter),
			100*row.BestFixed, row.BestBalance, 100*row.WorstFixed, row.TunedVsBest)
		for _, f := range row.Fixed {
			fmt.Fprintf(tw, "%.1f\t", 100*f.All)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
