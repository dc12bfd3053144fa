package kv

import (
	"sync"
	"time"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// amortization accumulates the measured costs of GetOrCompute turns.
type amortization struct {
	// mu protects the fields below.
	mu        sync.Mutex
	turns     int64
	computes  int64
	computeNs int64
	saved     int64
	loads     [tiers.TierArchive + 1]int64
	loadNs    [tiers.TierArchive + 1]int64
}

func (a *amortization) load(t tiers.Tier, d time.Duration) {
	a.mu.Lock()
	a.turns++
	a.saved++
	if int(t) < len(a.loads) {
		a.loads[t]++
		a.loadNs[t] += int64(d)
	}
	a.mu.Unlock()
}

func (a *amortization) shared() {
	a.mu.Lock()
	a.turns++
	a.saved++
	a.mu.Unlock()
}

// compute records one compute of duration d, failed ones included (see
// AmortizationStats.Computes).
func (a *amortization) compute(d time.Duration) {
	a.mu.Lock()
	a.turns++
	a.computes++
	a.computeNs += int64(d)
	a.mu.Unlock()
}

// AmortizationStats reports what caching saved, from measured costs.
//
// With C_compute the mean time of a compute (prefill) and C_load the mean
// time of a load, T turns over one prefix cost C_compute + (T−1)·C_load, so
// a turn costs (C_compute + (T−1)·C_load)/T on average instead of
// C_compute. Every figure here is measured by GetOrCompute, none assumed.
type AmortizationStats struct {
	// TotalTurns counts GetOrCompute calls.
	TotalTurns int64 `json:"total_turns"`
	// Computes counts calls that ran compute, failed ones included.
	Computes int64 `json:"computes"`
	// ComputeSaved counts calls served without computing: loaded from a
	// tier or shared with a concurrent compute.
	ComputeSaved int64 `json:"compute_saved"`
	// AmortizationRatio is ComputeSaved / TotalTurns.
	AmortizationRatio float64 `json:"amortization_ratio"`
	// AvgReuseCount is ComputeSaved / Computes: later turns served per
	// compute.
	AvgReuseCount float64 `json:"avg_reuse_count"`
	// EfficiencyGain is what computing every turn would have cost divided
	// by what the turns cost: TotalTurns·C_compute / (Computes·C_compute +
	// Σ load times). 1 means no gain.
	EfficiencyGain float64 `json:"efficiency_gain"`
	// MeanComputeCost is C_compute.
	MeanComputeCost time.Duration `json:"mean_compute_ns"`
	// MeanLoadCost is C_load per tier that served loads ("focus",
	// "working", "archive").
	MeanLoadCost map[string]time.Duration `json:"mean_load_ns"`
	// MeanLoadCostAll is C_load over all tiers.
	MeanLoadCostAll time.Duration `json:"mean_load_all_ns"`
	// TurnsPerCompute is T = TotalTurns / Computes.
	TurnsPerCompute float64 `json:"turns_per_compute"`
	// AmortizedCostPerTurn is (C_compute + (T−1)·C_load)/T for that T.
	AmortizedCostPerTurn time.Duration `json:"amortized_cost_per_turn_ns"`
}

// AmortizationStats returns the measured amortization of GetOrCompute.
func (c *Cache) AmortizationStats() AmortizationStats {
	a := &c.amort
	a.mu.Lock()
	defer a.mu.Unlock()
	s := AmortizationStats{
		TotalTurns:   a.turns,
		Computes:     a.computes,
		ComputeSaved: a.saved,
		MeanLoadCost: map[string]time.Duration{},
	}
	if a.turns > 0 {
		s.AmortizationRatio = float64(a.saved) / float64(a.turns)
	}
	if a.computes > 0 {
		s.AvgReuseCount = float64(a.saved) / float64(a.computes)
		s.MeanComputeCost = time.Duration(a.computeNs / a.computes)
		s.TurnsPerCompute = float64(a.turns) / float64(a.computes)
	}
	var loads, loadNs int64
	for t := range a.loads {
		if a.loads[t] > 0 {
			s.MeanLoadCost[tiers.Tier(t).String()] = time.Duration(a.loadNs[t] / a.loads[t])
			loads += a.loads[t]
			loadNs += a.loadNs[t]
		}
	}
	if loads > 0 {
		s.MeanLoadCostAll = time.Duration(loadNs / loads)
	}
	if cost := float64(a.computeNs + loadNs); cost > 0 && a.computes > 0 {
		s.EfficiencyGain = float64(a.turns) * float64(s.MeanComputeCost) / cost
	}
	if s.TurnsPerCompute >= 1 {
		T := s.TurnsPerCompute
		s.AmortizedCostPerTurn = time.Duration((float64(s.MeanComputeCost) + (T-1)*float64(s.MeanLoadCostAll)) / T)
	}
	return s
}
