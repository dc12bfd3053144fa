package llamacpp

// The arrival predictor behind predictive preload (MemGPT design §4.2):
// which session will speak next, from the sessions' own arrival history.
// It does no I/O and owns no lock (the connector holds its mutex around
// every call), so its choices are tested without a server.

import (
	"container/heap"
	"time"
)

// predictLapse is how many of its usual gaps a session may stay away before
// it is no longer expected: a conversation that missed three turns in a row
// has most likely ended, and preloading it would only cost the engine a
// restore and a resident session its slot.
const predictLapse = 4

// rhythm estimates the usual gap, in seconds, between a session's visits:
// an exponential mean of the gaps, where a gap under a quarter of the mean
// is a request within the same visit (a follow-up sent at once) and does
// not count, unless three come in a row (the session now speaks faster),
// and a gap over four times the mean starts the mean again (it now speaks
// slower, or its first gaps were such follow-ups).
type rhythm struct {
	gap   ewma
	short int  // gaps under a quarter of the mean in a row
	burst ewma // the gaps within visits (follow-ups)
}

// rhythmFactor bounds what a gap may differ from the mean and still count
// as one more sample of it.
const rhythmFactor = 4

func (r *rhythm) add(g float64) {
	switch {
	case r.gap.n == 0:
		r.gap = ewma{v: g, n: 1}
	case g > rhythmFactor*r.gap.v:
		if r.short == 0 && r.gap.n == 1 {
			r.burst.add(r.gap.v) // the first gap was a follow-up
		}
		r.gap, r.short = ewma{v: g, n: 1}, 0
	case g < r.gap.v/rhythmFactor:
		r.burst.add(g)
		if r.short++; r.short >= 3 {
			r.gap, r.short, r.burst = ewma{v: g, n: 1}, 0, ewma{}
		}
	default:
		r.gap.add(g)
		r.short = 0
	}
}

// arrival is one session's history: when it last sent a request and the
// usual gap between its visits.
type arrival struct {
	key  string
	last time.Time
	gap  rhythm
	n    int // requests seen
	// h and idx place the entry in one of the predictor's heaps (h nil:
	// in none, lapsed).
	h   *arrivalHeap
	idx int
}

// predictor orders sessions by when they are expected next: a session whose
// rhythm rests on two gaps or more is due its last request plus that
// rhythm; any other (seen once, or its rhythm just changed) is due its last
// request plus the rhythm of all sessions (none known: not predicted). Two
// heaps keep both orders exact in O(log n) per arrival: the first by due
// time, the others by their last request (they share one gap, so that is
// their order too).
type predictor struct {
	byKey  map[string]*arrival
	known  arrivalHeap // own rhythm, by last + gap
	once   arrivalHeap // the common rhythm, by last
	global rhythm      // gaps between two requests of one session, all sessions
}

// ownRhythm reports whether a session's own rhythm is settled enough to
// predict it.
func ownRhythm(a *arrival) bool { return a.gap.gap.n >= 2 }

func newPredictor() *predictor {
	p := &predictor{byKey: map[string]*arrival{}}
	p.known.due = func(a *arrival) time.Time { return a.last.Add(seconds(a.gap.gap.v)) }
	p.once.due = func(a *arrival) time.Time { return a.last }
	return p
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// arrive records a request of session key at now.
func (p *predictor) arrive(key string, now time.Time) {
	a, ok := p.byKey[key]
	if !ok {
		a = &arrival{key: key, idx: -1}
		p.byKey[key] = a
	} else if gap := now.Sub(a.last).Seconds(); gap >= 0 {
		a.gap.add(gap)
		p.global.add(gap)
	}
	a.last = now
	a.n++
	want := &p.once
	if ownRhythm(a) {
		want = &p.known
	}
	if a.h != nil && a.h != want {
		heap.Remove(a.h, a.idx)
	}
	if a.h == want {
		heap.Fix(want, a.idx)
	} else {
		heap.Push(want, a)
	}
}

// remove forgets session key.
func (p *predictor) remove(key string) {
	a, ok := p.byKey[key]
	if !ok {
		return
	}
	if a.h != nil {
		heap.Remove(a.h, a.idx)
	}
	delete(p.byKey, key)
}

// gapOf is the gap a session is expected to keep; false when none is known.
func (p *predictor) gapOf(a *arrival) (time.Duration, bool) {
	switch {
	case ownRhythm(a):
		return seconds(a.gap.gap.v), true
	case p.global.gap.n > 0:
		return seconds(p.global.gap.v), true
	}
	return 0, false
}

// burst returns the usual gap between a session's requests within one
// visit (a follow-up), when it sent any.
func (p *predictor) burst(key string) (time.Duration, bool) {
	a, ok := p.byKey[key]
	if !ok || a.gap.burst.n == 0 {
		return 0, false
	}
	return seconds(a.gap.burst.v), true
}

// due returns when session key is expected next. expected is false when its
// history tells nothing (unknown, or no gap known anywhere); lapsed when it
// stayed away predictLapse gaps.
func (p *predictor) due(key string, now time.Time) (at time.Time, expected, lapsed bool) {
	a, ok := p.byKey[key]
	if !ok {
		return time.Time{}, false, false
	}
	gap, ok := p.gapOf(a)
	if !ok {
		return time.Time{}, false, false
	}
	if now.Sub(a.last) > predictLapse*gap {
		return time.Time{}, true, true
	}
	return a.last.Add(gap), true, false
}

// candidate is a session expected to speak, with when and its usual gap.
type candidate struct {
	key string
	due time.Time
	gap time.Duration
}

// next returns up to k sessions expected to speak, soonest first, skipping
// those skip rejects (resident in a slot, say). Sessions that lapsed leave
// the heaps until they speak again. O((k + skipped + lapsed) log n).
func (p *predictor) next(now time.Time, k int, skip func(key string) bool) []candidate {
	var out []candidate
	var held []*arrival // popped, to push back
	global, hasGlobal := seconds(p.global.gap.v), p.global.gap.n > 0
	for len(out) < k {
		var a *arrival
		var due time.Time
		if p.known.Len() > 0 {
			a, due = p.known.items[0], p.known.due(p.known.items[0])
		}
		if hasGlobal && p.once.Len() > 0 {
			if o := p.once.items[0]; a == nil || o.last.Add(global).Before(due) {
				a, due = o, o.last.Add(global)
			}
		}
		if a == nil {
			break
		}
		heap.Pop(a.h)
		gap, _ := p.gapOf(a)
		if now.Sub(a.last) > predictLapse*gap {
			continue // lapsed: out of the heaps until it speaks again
		}
		held = append(held, a)
		if !skip(a.key) {
			out = append(out, candidate{a.key, due, gap})
		}
		if len(held) > 4*k+64 {
			break // bounded work per call
		}
	}
	for _, a := range held {
		want := &p.once
		if ownRhythm(a) {
			want = &p.known
		}
		heap.Push(want, a)
	}
	return out
}

// arrivalHeap is a min-heap of arrivals by due.
type arrivalHeap struct {
	items []*arrival
	due   func(*arrival) time.Time
}

func (h *arrivalHeap) Len() int { return len(h.items) }
func (h *arrivalHeap) Less(i, j int) bool {
	return h.due(h.items[i]).Before(h.due(h.items[j]))
}
func (h *arrivalHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].idx, h.items[j].idx = i, j
}
func (h *arrivalHeap) Push(x any) {
	a := x.(*arrival)
	a.h, a.idx = h, len(h.items)
	h.items = append(h.items, a)
}
func (h *arrivalHeap) Pop() any {
	a := h.items[len(h.items)-1]
	h.items[len(h.items)-1] = nil
	h.items = h.items[:len(h.items)-1]
	a.h, a.idx = nil, -1
	return a
}
