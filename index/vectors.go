package index

import (
	"math"
	"math/rand"

	"github.com/coder/hnsw"
	"github.com/viterin/vek/vek32"
)

func (x *Index) wantGraph() bool {
	return x.opts.ExactBelow < 0 || x.vecLive > x.opts.ExactBelow
}

// maybeCompact rebuilds postings and graph without tombstones once they
// outnumber CompactRatio of the live documents; x.mu must be held.
func (x *Index) maybeCompact() {
	dead := len(x.docs) - x.live
	if dead <= 64 || float64(dead) <= x.opts.CompactRatio*float64(x.live) {
		return
	}
	x.compact()
}

// Compact drops tombstones now (Delete and Upsert do it when they pile up).
func (x *Index) Compact() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.compact()
}

func (x *Index) compact() {
	entries := make([]*entry, 0, x.live)
	for _, e := range x.docs {
		if e != nil {
			entries = append(entries, e)
		}
	}
	dim := x.dim
	x.reset()
	x.dim = dim
	x.load(entries)
}

func (x *Index) newGraph() *hnsw.Graph[uint32] {
	return &hnsw.Graph[uint32]{
		Distance: dotDistance,
		M:        x.opts.M,
		Ml:       0.25,
		EfSearch: x.opts.EfSearch,
		Rng:      rand.New(rand.NewSource(x.opts.Seed)),
	}
}

// buildGraph inserts every live vector into a new graph; x.mu must be held.
func (x *Index) buildGraph() {
	x.graph = x.newGraph()
	x.inGraph, x.graphDead = 0, 0
	for slot, e := range x.docs {
		if e != nil && e.doc.Vector != nil {
			x.graphAdd(uint32(slot), e)
		}
	}
}

func (x *Index) graphAdd(slot uint32, e *entry) {
	x.graph.Add(hnsw.MakeNode(slot, e.doc.Vector))
	x.inGraph++
}

// dotDistance is cosine distance for unit vectors: the index normalises
// every vector, so one dot product suffices (hnsw.CosineDistance would
// recompute both norms on every comparison).
func dotDistance(a, b []float32) float32 { return 1 - vek32.Dot(a, b) }

// simStats are the mean and standard deviation of a query's cosine
// similarity with the documents searched (n of them).
type simStats struct {
	n         int
	sum, sum2 float64
}

func (s *simStats) add(v float64) { s.n, s.sum, s.sum2 = s.n+1, s.sum+v, s.sum2+v*v }

// z is the standard score of v; 0 below 8 documents or without spread,
// where it means nothing.
func (s *simStats) z(v float64) float64 {
	if s.n < 8 {
		return 0
	}
	mean := s.sum / float64(s.n)
	sd := math.Sqrt(max(s.sum2/float64(s.n)-mean*mean, 0))
	if sd < 1e-6 {
		return 0
	}
	return (v - mean) / sd
}

// statsSample is how many vectors at most the similarity statistics read
// when the graph is walked instead of every vector scanned.
const statsSample = 1024

// searchVector returns the n nearest live vectors by cosine similarity among
// the documents keep accepts (nil: all), and the query's similarity
// statistics over them (all of them on an exact scan; an even sample of
// statsSample on a graph walk). x.mu must be held for reading.
func (x *Index) searchVector(q []float32, n int, keep func(string) bool) ([]scored, simStats) {
	var st simStats
	if x.vecLive == 0 {
		return nil, st
	}
	if x.graph == nil || (x.opts.ExactBelow >= 0 && x.vecLive <= x.opts.ExactBelow) {
		top := newTopN(n)
		for slot, e := range x.docs {
			if e != nil && e.doc.Vector != nil && (keep == nil || keep(e.doc.ID)) {
				s := float64(vek32.Dot(q, e.doc.Vector))
				st.add(s)
				top.push(scored{slot: uint32(slot), score: s})
			}
		}
		return top.sorted(), st
	}
	step := max(len(x.docs)/statsSample, 1)
	for slot := 0; slot < len(x.docs); slot += step {
		if e := x.docs[slot]; e != nil && e.doc.Vector != nil && (keep == nil || keep(e.doc.ID)) {
			st.add(float64(vek32.Dot(q, e.doc.Vector)))
		}
	}
	// Over-fetch in proportion to the tombstones, and at least EfSearch,
	// which is what makes coder/hnsw explore beyond a greedy descent.
	liveInGraph := max(x.inGraph-x.graphDead, 1)
	fetch := max(n*x.inGraph/liveInGraph+8, x.opts.EfSearch)
	for {
		nodes := x.graph.Search(q, fetch)
		top := newTopN(n)
		for _, nd := range nodes {
			if e := x.docs[nd.Key]; e != nil && (keep == nil || keep(e.doc.ID)) {
				top.push(scored{slot: nd.Key, score: float64(vek32.Dot(q, nd.Value))})
			}
		}
		if top.len() >= n || fetch >= x.inGraph {
			return top.sorted(), st
		}
		fetch *= 2
	}
}
