package index

import (
	"math"
	"sort"
)

type scored struct {
	slot  uint32
	score float64
}

// topN keeps the n best scored items (a min-heap on score, ties: the larger
// slot is worse, so results are deterministic).
type topN struct {
	n int
	h []scored
}

func newTopN(n int) *topN { return &topN{n: n, h: make([]scored, 0, min(n, 1024))} }

func (t *topN) len() int { return len(t.h) }

// worse reports whether a ranks below b.
func worse(a, b scored) bool {
	if a.score != b.score {
		return a.score < b.score
	}
	return a.slot > b.slot
}

func (t *topN) push(s scored) {
	if math.IsNaN(s.score) {
		return
	}
	if len(t.h) < t.n {
		t.h = append(t.h, s)
		for i := len(t.h) - 1; i > 0; {
			p := (i - 1) / 2
			if !worse(t.h[i], t.h[p]) {
				break
			}
			t.h[i], t.h[p] = t.h[p], t.h[i]
			i = p
		}
		return
	}
	if !worse(t.h[0], s) {
		return
	}
	t.h[0] = s
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(t.h) && worse(t.h[l], t.h[m]) {
			m = l
		}
		if r < len(t.h) && worse(t.h[r], t.h[m]) {
			m = r
		}
		if m == i {
			break
		}
		t.h[i], t.h[m] = t.h[m], t.h[i]
		i = m
	}
}

// sorted returns the items best first.
func (t *topN) sorted() []scored {
	sort.Slice(t.h, func(i, j int) bool { return worse(t.h[j], t.h[i]) })
	return t.h
}
