package cachesim

// The AdaptiveTuner's eviction knob on a trace whose pattern changes
// midway: a Tunable tiers strategy run at fixed balances and with the
// tuner's hill climber (tiers.BalanceClimber) moving the balance every
// epoch, as the live tuner does every TunerOptions.Every.

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// Shifting is a trace whose pattern changes midway: the first half draws
// from n items by Zipf(0.99) (a stable popular set: frequency pays), the
// second from n other items through a window of n/10 that slides by one
// item every 4 accesses (what is hot now was not before and will not be
// again: recency pays, and the first half's counts mislead).
func Shifting(n, accesses int, rng *rand.Rand) Trace {
	first := Zipf(n, accesses/2, 0.99, rng)
	t := Trace{Name: "shifting", Items: n, Keys: first.Keys}
	w := max(n/10, 1)
	for i := range accesses - accesses/2 {
		start := i / 4
		t.Keys = append(t.Keys, uint64(n+(start+rng.IntN(w))%n))
	}
	return t
}

// tunedPolicy is a cache of capacity entries over a Tunable tiers strategy
// whose balance a climber moves every epoch accesses, or fixed when climb
// is nil.
type tunedPolicy struct {
	*tiersPolicy
	tun          tiers.Tunable
	climb        *tiers.BalanceClimber
	epoch        int
	hits, n      int
	label        string
	trajectory   []float64
	keepHistory  bool
	lastBalances []float64
}

// NewTiersBalance returns a cache of capacity entries run by a Tunable tiers
// strategy (weighted, hybrid) at a fixed balance (tiers.Tunable).
func NewTiersBalance(strategy string, capacity int, balance float64) (Policy, error) {
	p, err := newTunable(strategy, capacity)
	if err != nil {
		return nil, err
	}
	p.tun.SetBalance(balance)
	p.label = fmt.Sprintf("%s@%.1f", strategy, balance)
	return p, nil
}

// NewTiersTuned returns a cache of capacity entries run by a Tunable tiers
// strategy whose balance tiers.BalanceClimber moves every epoch accesses
// (step: its first step; 0: the tuner's default).
func NewTiersTuned(strategy string, capacity, epoch int, step float64) (Policy, error) {
	p, err := newTunable(strategy, capacity)
	if err != nil {
		return nil, err
	}
	if epoch < 1 {
		return nil, fmt.Errorf("cachesim: epoch %d", epoch)
	}
	p.climb = tiers.NewBalanceClimber(p.tun.Balance(), step)
	p.epoch = epoch
	p.label = strategy + "+tuner"
	return p, nil
}

func newTunable(strategy string, capacity int) (*tunedPolicy, error) {
	base, err := NewTiers(strategy, capacity)
	if err != nil {
		return nil, err
	}
	tp := base.(*tiersPolicy)
	tun, ok := tp.pol.(tiers.Tunable)
	if !ok {
		return nil, fmt.Errorf("cachesim: strategy %q has no balance to tune", strategy)
	}
	return &tunedPolicy{tiersPolicy: tp, tun: tun}, nil
}

func (p *tunedPolicy) Name() string { return p.label }

func (p *tunedPolicy) Get(k uint64) bool {
	hit := p.tiersPolicy.Get(k)
	if p.climb == nil {
		return hit
	}
	p.n++
	if hit {
		p.hits++
	}
	if p.n == p.epoch {
		p.tun.SetBalance(p.climb.Next(float64(p.hits) / float64(p.n)))
		p.trajectory = append(p.trajectory, p.tun.Balance())
		p.hits, p.n = 0, 0
	}
	return hit
}

// Balances returns the balance after each epoch of a tuned policy (nil for
// a fixed one or another Policy).
func Balances(p Policy) []float64 {
	if tp, ok := p.(*tunedPolicy); ok {
		return tp.trajectory
	}
	return nil
}

// ReplayPhases runs t through p like Replay and returns the hit ratio of
// the accesses before position cut, after it, and of all of them.
func ReplayPhases(t Trace, p Policy, cut int) (first, second, all float64) {
	var h, n [2]int
	for i, k := range t.Keys {
		if t.deleted(i) {
			p.Delete(k)
			continue
		}
		ph := 0
		if i >= cut {
			ph = 1
		}
		n[ph]++
		if p.Get(k) {
			h[ph]++
		} else {
			p.Set(k)
		}
	}
	return ratio(h[0], n[0]), ratio(h[1], n[1]), ratio(h[0]+h[1], n[0]+n[1])
}
