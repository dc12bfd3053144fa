package tiers

import "container/list"

// scored evicts the entry with the lowest weighted score
//
//	wFreq·frequency + wRec·recency + wHint·hint
//
// where, over the candidates, frequency is the access count divided by the
// largest count (so it lies in [0,1]), recency is the last access placed
// linearly between the oldest candidate (0) and now (1), and hint is the
// entry's Importance (weighted) or Semantic (hybrid) score.
//
// Scores move with time, so no ordered structure stays valid; the
// candidates are the sample least recently used entries (all entries when
// there are fewer), which makes Victim O(sample) and keeps the choice among
// entries that recency alone would already consider.
type scored struct {
	name               string
	wFreq, wRec, wHint float64
	semantic           bool
	sample             int
	tick               uint64
	ll                 *list.List // front is most recent; of *scoredEntry
	items              map[string]*list.Element
}

type scoredEntry struct {
	key   string
	count uint64
	last  uint64
	hint  float64
}

const defaultScoredSample = 64

func newScored(name string, wFreq, wRec, wHint float64, semantic bool) *scored {
	return &scored{name: name, wFreq: wFreq, wRec: wRec, wHint: wHint, semantic: semantic,
		sample: defaultScoredSample, ll: list.New(), items: make(map[string]*list.Element)}
}

func (p *scored) Name() string { return p.name }

// Balance returns the recency share of the frequency and recency weights.
func (p *scored) Balance() float64 {
	if p.wFreq+p.wRec == 0 {
		return 0.5
	}
	return p.wRec / (p.wFreq + p.wRec)
}

// SetBalance splits the frequency and recency weights' sum so that recency
// gets the share b (clamped to [0,1]); the hint weight is unchanged.
func (p *scored) SetBalance(b float64) {
	sum := p.wFreq + p.wRec
	b = clamp01(b)
	p.wRec, p.wFreq = sum*b, sum*(1-b)
}
func (p *scored) Len() int { return len(p.items) }

func (p *scored) Add(key string, h Hint) {
	p.tick++
	hint := clamp01(h.Importance)
	if p.semantic {
		hint = clamp01(h.Semantic)
	}
	p.items[key] = p.ll.PushFront(&scoredEntry{key: key, count: 1, last: p.tick, hint: hint})
}

func (p *scored) Access(key string) {
	if el, ok := p.items[key]; ok {
		p.tick++
		e := el.Value.(*scoredEntry)
		e.count++
		e.last = p.tick
		p.ll.MoveToFront(el)
	}
}

func (p *scored) Remove(key string) {
	if el, ok := p.items[key]; ok {
		p.ll.Remove(el)
		delete(p.items, key)
	}
}

func (p *scored) Victim() (string, bool) {
	back := p.ll.Back()
	if back == nil {
		return "", false
	}
	oldest := back.Value.(*scoredEntry).last
	var maxCount uint64 = 1
	n := 0
	for el := back; el != nil && n < p.sample; el, n = el.Prev(), n+1 {
		maxCount = max(maxCount, el.Value.(*scoredEntry).count)
	}
	span := float64(p.tick - oldest)
	if span == 0 {
		span = 1
	}
	var victim string
	best := 0.0
	n = 0
	for el := back; el != nil && n < p.sample; el, n = el.Prev(), n+1 {
		e := el.Value.(*scoredEntry)
		s := p.wFreq*float64(e.count)/float64(maxCount) +
			p.wRec*float64(e.last-oldest)/span +
			p.wHint*e.hint
		if n == 0 || s < best {
			victim, best = e.key, s
		}
	}
	return victim, true
}
