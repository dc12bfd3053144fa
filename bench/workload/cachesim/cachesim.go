// Package cachesim replays access traces against caches that hold a fixed
// number of entries and reports hit ratios, in the manner of otter's
// simulator (benchmarks/simulator): every cache under test implements
// Policy; Belady's optimum and a static frequency oracle are computed
// offline on the same trace; the tiers strategies are driven exactly as a
// tier drives them. W-TinyLFU (otter) plugs in from bench/simulator, a
// module of its own, so that neither the kvsidecar module nor the sidecar
// binary depends on it.
//
// Capacity counts entries, not bytes: a recorded trace's sizes are kept
// in the file but the replay treats every entry alike.
package cachesim

import (
	"fmt"
	"strconv"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// Policy is a cache under test. Replay calls Get for every access, Set
// after each miss and Delete where the trace deletes a key.
type Policy interface {
	// Name says which policy this is.
	Name() string
	// Get reports whether key is cached and records the access.
	Get(key uint64) bool
	// Set caches key after a miss, evicting to stay within capacity. A
	// policy with an admission filter may decline key.
	Set(key uint64)
	// Delete drops key if it is cached, as the store's Delete does.
	Delete(key uint64)
}

// Contender makes a Policy for a capacity.
type Contender struct {
	Name string
	New  func(capacity int) (Policy, error)
}

// Replay runs t through p and returns the hit ratio of its accesses.
func Replay(t Trace, p Policy) float64 {
	hits, n := 0, 0
	for i, k := range t.Keys {
		if t.deleted(i) {
			p.Delete(k)
			continue
		}
		n++
		if p.Get(k) {
			hits++
		} else {
			p.Set(k)
		}
	}
	return ratio(hits, n)
}

func ratio(hits, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(hits) / float64(n)
}

// TiersStrategy is the contender for a tiers strategy name (tiers.NewPolicy).
func TiersStrategy(strategy string) Contender {
	return Contender{Name: strategy, New: func(capacity int) (Policy, error) {
		return NewTiers(strategy, capacity)
	}}
}

// TiersStrategies are the contenders for every tiers strategy and preset.
func TiersStrategies() []Contender {
	var cs []Contender
	for _, s := range tiers.Strategies() {
		cs = append(cs, TiersStrategy(s))
	}
	return cs
}

// tiersPolicy is a cache of capacity entries over a tiers.Policy, used as
// a tier uses it: on a miss, evict the policy's victims until there is
// room, then add.
type tiersPolicy struct {
	pol      tiers.Policy
	capacity int
	keys     map[uint64]string
	present  map[string]bool
}

// NewTiers returns a cache of capacity entries run by a tiers strategy.
// Every key carries the hint {Importance: 0.5, Semantic: 0.5}: traces have
// no scores, so the weighted and hybrid strategies rank by frequency and
// recency alone.
func NewTiers(strategy string, capacity int) (Policy, error) {
	pol, err := tiers.NewPolicy(strategy)
	if err != nil {
		return nil, err
	}
	if capacity < 1 {
		return nil, fmt.Errorf("cachesim: capacity %d", capacity)
	}
	return &tiersPolicy{pol: pol, capacity: capacity, keys: map[uint64]string{}, present: make(map[string]bool, capacity)}, nil
}

func (p *tiersPolicy) Name() string { return p.pol.Name() }

func (p *tiersPolicy) key(k uint64) string {
	s, ok := p.keys[k]
	if !ok {
		s = strconv.FormatUint(k, 36)
		p.keys[k] = s
	}
	return s
}

func (p *tiersPolicy) Get(k uint64) bool {
	s := p.key(k)
	if !p.present[s] {
		return false
	}
	p.pol.Access(s)
	return true
}

func (p *tiersPolicy) Set(k uint64) {
	s := p.key(k)
	for p.pol.Len() >= p.capacity {
		v, ok := p.pol.Victim()
		if !ok {
			break
		}
		p.pol.Remove(v)
		delete(p.present, v)
	}
	p.pol.Add(s, tiers.Hint{Importance: 0.5, Semantic: 0.5})
	p.present[s] = true
}

func (p *tiersPolicy) Delete(k uint64) {
	s := p.key(k)
	if p.present[s] {
		p.pol.Remove(s)
		delete(p.present, s)
	}
}

// Row is every contender on one trace at one cache size, beside the
// offline bounds.
type Row struct {
	Trace    string `json:"trace"`
	SizePct  int    `json:"size_pct"`
	Capacity int    `json:"capacity"`
	// Belady is the optimum: evict the entry used again furthest ahead.
	Belady float64 `json:"belady"`
	// Static keeps the Capacity most frequent keys of the whole trace: the
	// best an online policy can expect when accesses are independent (the
	// synthetic traces); Belady also knows their order.
	Static float64 `json:"static_oracle"`
	// HitRates has one hit ratio per contender, in the order given to Run.
	HitRates []float64 `json:"hit_rates"`
}

// Run replays every trace at every size (a percentage of the trace's
// items) on every contender.
func Run(traces []Trace, sizesPct []int, cs []Contender) ([]Row, error) {
	return RunAveraged([][]Trace{traces}, sizesPct, cs)
}

// RunAveraged is Run over several draws of the same traces (sets[i][j] is
// draw i of trace j), each figure the mean over the draws. Policies that
// seed their hashing at random (otter) get a fresh instance per draw.
func RunAveraged(sets [][]Trace, sizesPct []int, cs []Contender) ([]Row, error) {
	var sum []Row
	for _, traces := range sets {
		rows, err := run(traces, sizesPct, cs)
		if err != nil {
			return nil, err
		}
		if sum == nil {
			sum = rows
			continue
		}
		for i := range sum {
			sum[i].Belady += rows[i].Belady
			sum[i].Static += rows[i].Static
			for j := range sum[i].HitRates {
				sum[i].HitRates[j] += rows[i].HitRates[j]
			}
		}
	}
	n := float64(len(sets))
	for i := range sum {
		sum[i].Belady /= n
		sum[i].Static /= n
		for j := range sum[i].HitRates {
			sum[i].HitRates[j] /= n
		}
	}
	return sum, nil
}

func run(traces []Trace, sizesPct []int, cs []Contender) ([]Row, error) {
	var rows []Row
	for _, t := range traces {
		for _, pct := range sizesPct {
			capacity := max(1, t.Items*pct/100)
			r := Row{Trace: t.Name, SizePct: pct, Capacity: capacity,
				Belady: Belady(t, capacity), Static: StaticOracle(t, capacity)}
			for _, c := range cs {
				p, err := c.New(capacity)
				if err != nil {
					return nil, fmt.Errorf("cachesim: %s: %w", c.Name, err)
				}
				r.HitRates = append(r.HitRates, Replay(t, p))
			}
			rows = append(rows, r)
		}
	}
	return rows, nil
}
