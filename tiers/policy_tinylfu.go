package tiers

import (
	"container/list"
	"math"
)

// tinyLFU is W-TinyLFU (Einziger, Friedman and Manes, 2017) as Caffeine
// and otter run it: a small LRU admission window in front of a segmented
// LRU main space (probation and protected), with a frequency sketch
// deciding who enters the main space. O(1) per operation, plus hashing the
// key once when it is added.
//
// A new key enters the window. When the window is over its share, its
// least recent key moves to the head of probation as the candidate. An
// eviction compares the candidate's estimated frequency (or, with no
// candidate pending, the window's least recent key's) with that of
// probation's least recent key and evicts the less frequent, the candidate
// on a tie. A hit in probation moves the key to protected, which holds at
// most 80% of the main space; its overflow goes back to probation.
//
// The sketch counts the accesses of every key the policy has seen, tracked
// or evicted, so a key that comes back is known; its counters are halved
// after every 10 counted accesses per tracked key, so frequency is recent
// frequency. The window's share starts at 1% (at least one key) and is
// tuned by hill climbing on the hit ratio of each such sample: a
// recency-biased workload grows the window, a frequency-biased one shrinks
// it.
//
// A tier is bounded by bytes and tokens, not entries, so the shares apply
// to the keys tracked, and the sketch grows with the most keys ever
// tracked, keeping the counts of the keys tracked when it does.
type tinyLFU struct {
	window, probation, protected *list.List // of *tlfuEntry; front is most recent
	items                        map[string]*tlfuEntry
	cand                         *tlfuEntry // last key moved from the window, not yet judged
	sketch                       cmSketch
	maxLen                       int

	// Hill climbing of the window's share.
	share, step  float64
	hits, misses int
	prevHitRatio float64
}

type tlfuEntry struct {
	key  string
	hash uint64
	seg  *list.List
	elem *list.Element
}

const (
	tlfuInitialShare = 0.01
	tlfuMaxShare     = 0.8
	tlfuProtected    = 0.8    // of the main space
	tlfuStep         = 0.0625 // of the entries, as Caffeine's hill climber
	tlfuStepDecay    = 0.98
	tlfuRestart      = 0.05 // a hit-ratio change that restarts the climb
	tlfuSamplePerKey = 10   // accesses per tracked key between sketch halvings
)

func newTinyLFU() *tinyLFU {
	p := &tinyLFU{
		window: list.New(), probation: list.New(), protected: list.New(),
		items: make(map[string]*tlfuEntry),
		share: tlfuInitialShare, step: -tlfuStep,
	}
	p.sketch.init(16)
	return p
}

func (p *tinyLFU) Name() string { return StrategyTinyLFU }
func (p *tinyLFU) Len() int     { return len(p.items) }

// keyHash is FNV-1a 64 of key.
func keyHash(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	return h
}

func (p *tinyLFU) move(e *tlfuEntry, to *list.List) {
	if e.seg != nil {
		e.seg.Remove(e.elem)
	}
	e.seg, e.elem = to, to.PushFront(e)
}

// growSketch doubles the sketch's rows, carrying over the counts of the
// tracked keys (those of keys evicted earlier are lost). O(tracked keys),
// once per doubling of the most keys ever tracked.
func (p *tinyLFU) growSketch() {
	old := p.sketch
	p.sketch.init(2 * old.width)
	p.sketch.additions = old.additions
	for _, e := range p.items {
		p.sketch.set(e.hash, old.estimate(e.hash))
	}
}

// windowMax is the window's share of the tracked keys, at least one.
func (p *tinyLFU) windowMax() int {
	return max(1, int(math.Round(p.share*float64(len(p.items)))))
}

func (p *tinyLFU) Add(key string, _ Hint) {
	e := &tlfuEntry{key: key, hash: keyHash(key)}
	p.items[key] = e
	p.move(e, p.window)
	if len(p.items) > p.maxLen {
		p.maxLen = len(p.items)
		if 8*p.maxLen > p.sketch.width {
			p.growSketch()
		}
	}
	p.sketch.add(e.hash, tlfuSamplePerKey*p.maxLen)
	p.misses++
	p.climb()
	for p.window.Len() > p.windowMax() {
		c := p.window.Back().Value.(*tlfuEntry)
		p.move(c, p.probation)
		p.cand = c
	}
}

func (p *tinyLFU) Access(key string) {
	e, ok := p.items[key]
	if !ok {
		return
	}
	p.sketch.add(e.hash, tlfuSamplePerKey*p.maxLen)
	p.hits++
	p.climb()
	switch e.seg {
	case p.window:
		p.move(e, p.window)
	case p.probation:
		if p.cand == e {
			p.cand = nil
		}
		p.move(e, p.protected)
		main := len(p.items) - p.window.Len()
		for float64(p.protected.Len()) > tlfuProtected*float64(main) {
			p.move(p.protected.Back().Value.(*tlfuEntry), p.probation)
		}
	case p.protected:
		p.move(e, p.protected)
	}
}

func (p *tinyLFU) Remove(key string) {
	e, ok := p.items[key]
	if !ok {
		return
	}
	if p.cand == e {
		p.cand = nil
	}
	e.seg.Remove(e.elem)
	delete(p.items, key)
}

// Victim duels the candidate (the last key moved from the window, or else
// the window's least recent key) against the main space's least recent
// key (probation's, or protected's when probation is empty) and names the
// less frequent; the candidate loses ties.
func (p *tinyLFU) Victim() (string, bool) {
	c := p.cand
	if c == nil {
		c = back(p.window)
	}
	v := back(p.probation)
	if v == nil {
		v = back(p.protected)
	}
	switch {
	case v == nil && c == nil:
		return "", false
	case v == nil:
		return c.key, true
	case c == nil || c == v:
		return v.key, true
	}
	if p.sketch.estimate(c.hash) > p.sketch.estimate(v.hash) {
		if c == p.cand {
			p.cand = nil // admitted: it stays in probation
		}
		return v.key, true
	}
	return c.key, true
}

func back(l *list.List) *tlfuEntry {
	if b := l.Back(); b != nil {
		return b.Value.(*tlfuEntry)
	}
	return nil
}

// Balance returns the admission window's share of the tracked keys, as a
// share of its largest (tlfuMaxShare): its recency share (Tunable).
func (p *tinyLFU) Balance() float64 { return p.share / tlfuMaxShare }

// SetBalance sets the window's share to b × tlfuMaxShare (b clamped to
// [0,1]); the policy's own hill climbing goes on from there.
func (p *tinyLFU) SetBalance(b float64) { p.share = clamp01(b) * tlfuMaxShare }

// climb adjusts the window's share after every sample of accesses: keep
// going while the hit ratio improves, turn back when it falls, with steps
// that shrink unless the hit ratio jumps.
func (p *tinyLFU) climb() {
	n := p.hits + p.misses
	if n < tlfuSamplePerKey*max(p.maxLen, 16) {
		return
	}
	ratio := float64(p.hits) / float64(n)
	change := ratio - p.prevHitRatio
	amount := p.step
	if change < 0 {
		amount = -p.step
	}
	if math.Abs(change) >= tlfuRestart {
		p.step = math.Copysign(tlfuStep, amount)
	} else {
		p.step = tlfuStepDecay * amount
	}
	p.share = min(tlfuMaxShare, max(0, p.share+amount))
	p.prevHitRatio = ratio
	p.hits, p.misses = 0, 0
}

// cmSketch is a count-min sketch: 4 rows of counters that saturate at 15
// (4 bits, kept in bytes). A row has 8 counters per tracked key (32 bytes
// a key in all, nothing beside a KV block): against otter's 4 per key,
// fewer collisions gain 0.1 to 0.3 points of hit ratio on the synthetic
// traces and lose 0.7 on the recorded sessions at half size
// (bench/simulator).
type cmSketch struct {
	rows      [4][]uint8
	width     int
	mask      uint64
	additions int
}

// init sizes the rows for n counters (a power of two at least n) and
// clears them.
func (s *cmSketch) init(n int) {
	w := 16
	for w < n {
		w *= 2
	}
	s.width, s.mask, s.additions = w, uint64(w-1), 0
	for i := range s.rows {
		s.rows[i] = make([]uint8, w)
	}
}

var cmSeeds = [4]uint64{0x9e3779b97f4a7c15, 0xc2b2ae3d27d4eb4f, 0x165667b19e3779f9, 0x27d4eb2f165667c5}

func (s *cmSketch) index(h uint64, row int) uint64 {
	h += cmSeeds[row] // then splitmix64's finalizer
	h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
	h = (h ^ h>>27) * 0x94d049bb133111eb
	return (h ^ h>>31) & s.mask
}

// add counts one access of h. Once sample accesses have raised a counter
// (saturated keys do not count, so a few hot keys do not age the others),
// it halves every counter.
func (s *cmSketch) add(h uint64, sample int) {
	added := false
	for i := range s.rows {
		if c := &s.rows[i][s.index(h, i)]; *c < 15 {
			*c++
			added = true
		}
	}
	if !added {
		return
	}
	s.additions++
	if s.additions >= sample {
		for i := range s.rows {
			for j := range s.rows[i] {
				s.rows[i][j] >>= 1
			}
		}
		s.additions /= 2
	}
}

// set raises h's counters to at least c.
func (s *cmSketch) set(h uint64, c uint8) {
	for i := range s.rows {
		x := &s.rows[i][s.index(h, i)]
		*x = max(*x, c)
	}
}

func (s *cmSketch) estimate(h uint64) uint8 {
	m := uint8(15)
	for i := range s.rows {
		m = min(m, s.rows[i][s.index(h, i)])
	}
	return m
}
