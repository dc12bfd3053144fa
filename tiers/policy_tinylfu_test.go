package tiers

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// replay runs keys through a cache of capacity entries over pol and
// returns the hit ratio.
func replay(pol Policy, capacity int, keys []int) float64 {
	sim := &policySim{pol: pol, cap: capacity, present: map[string]bool{}}
	hits := 0
	for _, k := range keys {
		if hit, _ := sim.access(strconv.Itoa(k), Hint{}); hit {
			hits++
		}
	}
	return float64(hits) / float64(len(keys))
}

// TestTinyLFUWindowAdapts: the hill climber grows the admission window
// where recency pays and keeps it small where frequency does.
func TestTinyLFUWindowAdapts(t *testing.T) {
	const capacity, n = 100, 60_000
	// Recency: each key is used three times within a few steps, then never
	// again (i, i-1, i-2, i+1, i, i-1, ...). LRU hits two accesses in three;
	// a 1% window lets each new key be judged, and lose, before its reuse.
	var recent []int
	for i := 2; len(recent) < n; i++ {
		recent = append(recent, i, i-1, i-2)
	}
	lru := replay(newLRU(), capacity, recent)
	p := newTinyLFU()
	got := replay(p, capacity, recent)
	if p.share < 0.2 || got < lru-0.05 {
		t.Errorf("recency trace: window share %.3f, hit ratio %.3f against LRU's %.3f", p.share, got, lru)
	}
	// Frequency: independent accesses, 80% of them to a fifth of the keys.
	rng := rand.New(rand.NewPCG(1, 2))
	freq := make([]int, n)
	for i := range freq {
		if rng.Float64() < 0.8 {
			freq[i] = rng.IntN(200)
		} else {
			freq[i] = 200 + rng.IntN(800)
		}
	}
	lfu := replay(newLFU(), capacity, freq)
	p = newTinyLFU()
	got = replay(p, capacity, freq)
	// LFU with exact counts is at its best here; the sketch comes within a
	// point.
	if p.share > 0.2 || got < lfu-0.01 {
		t.Errorf("frequency trace: window share %.3f, hit ratio %.3f against LFU's %.3f", p.share, got, lfu)
	}
}
