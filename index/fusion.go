package index

import (
	"math"
	"time"

	"github.com/viterin/vek/vek32"
)

// candidate is a document in the fused list.
type candidate struct {
	slot  uint32
	bm25  float64
	cos   float64
	graph float64 // entity graph score (0: not reached)
	rel   float64 // fused relevance in [0,1]
	final float64
}

// fuse merges the retrievers' lists. In hybrid mode every candidate gets both
// exact scores (BM25 and cosine), so weighted fusion never treats "below the
// other list's cut-off" as "no match". The entity graph's list gr (hybrid
// only) adds its candidates and GraphWeight times its normalised score (or
// rank, with RRF). x.mu must be held for reading.
func (x *Index) fuse(mode Mode, qterms []queryTerm, qv []float32, bm, vec, gr []scored) []candidate {
	pos := make(map[uint32]int, len(bm)+len(vec)+len(gr))
	cands := make([]candidate, 0, len(bm)+len(vec)+len(gr))
	add := func(slot uint32) *candidate {
		i, ok := pos[slot]
		if !ok {
			i = len(cands)
			pos[slot] = i
			cands = append(cands, candidate{slot: slot, bm25: math.NaN(), cos: math.NaN()})
		}
		return &cands[i]
	}
	for _, s := range bm {
		add(s.slot).bm25 = s.score
	}
	for _, s := range vec {
		add(s.slot).cos = s.score
	}
	var maxGraph float64
	for _, s := range gr {
		add(s.slot).graph = s.score
		maxGraph = max(maxGraph, s.score)
	}
	gw := x.opts.GraphWeight
	var maxBM, maxCos float64
	for i := range cands {
		c := &cands[i]
		e := x.docs[c.slot]
		if math.IsNaN(c.bm25) {
			c.bm25 = 0
			if mode == ModeHybrid {
				c.bm25 = x.bm.score(e, qterms)
			}
		}
		if math.IsNaN(c.cos) {
			c.cos = 0
			if mode == ModeHybrid && e.doc.Vector != nil {
				c.cos = float64(vek32.Dot(qv, e.doc.Vector))
			}
		}
		maxBM = max(maxBM, c.bm25)
		maxCos = max(maxCos, c.cos)
	}
	norm := func(v, m float64) float64 {
		if m <= 0 || v <= 0 {
			return 0
		}
		return v / m
	}
	w := x.opts.VectorWeight
	var maxRel float64
	switch {
	case mode == ModeBM25:
		for i := range cands {
			cands[i].rel = norm(cands[i].bm25, maxBM)
		}
		maxRel = 1
	case mode == ModeVector:
		for i := range cands {
			cands[i].rel = norm(cands[i].cos, maxCos)
		}
		maxRel = 1
	case x.opts.Fusion == FusionRRF:
		k := x.opts.RRFK
		for r, s := range bm {
			cands[pos[s.slot]].rel += (1 - w) / (k + float64(r+1))
		}
		for r, s := range vec {
			cands[pos[s.slot]].rel += w / (k + float64(r+1))
		}
		for r, s := range gr {
			cands[pos[s.slot]].rel += gw / (k + float64(r+1))
		}
		for _, c := range cands {
			maxRel = max(maxRel, c.rel)
		}
	default:
		for i := range cands {
			c := &cands[i]
			c.rel = (1-w)*norm(c.bm25, maxBM) + w*norm(c.cos, maxCos)
			if maxGraph > 0 {
				c.rel += gw * norm(c.graph, maxGraph)
			}
			maxRel = max(maxRel, c.rel)
		}
	}
	if maxRel > 0 && maxRel != 1 {
		for i := range cands {
			cands[i].rel /= maxRel
		}
	}
	return cands
}

// rerank sets the final scores from relevance and metadata.
func (x *Index) rerank(cands []candidate, now time.Time) {
	w := x.opts.Rerank
	for i := range cands {
		c := &cands[i]
		m := x.docs[c.slot].doc.Meta
		c.final = w.Relevance * c.rel
		if w.Recency != 0 {
			c.final += w.Recency * recency(m.Time, now, w.HalfLife)
		}
		if w.Importance != 0 {
			imp := max(m.Importance, 0)
			if math.IsInf(imp, 1) {
				c.final += w.Importance
			} else if !math.IsNaN(imp) {
				c.final += w.Importance * imp / (1 + imp)
			}
		}
		if w.Access != 0 && m.AccessCount > 0 {
			l := math.Log1p(float64(m.AccessCount))
			c.final += w.Access * l / (1 + l)
		}
	}
}

// recency is 2^(-age/halfLife): 1 for now or the future, 0.5 one half-life
// ago; 0 for an unknown (zero) time.
func recency(t, now time.Time, halfLife time.Duration) float64 {
	if t.IsZero() {
		return 0
	}
	age := now.Sub(t)
	if age <= 0 {
		return 1
	}
	return math.Exp2(-age.Seconds() / halfLife.Seconds())
}
