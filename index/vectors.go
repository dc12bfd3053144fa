package index

import (
	"fmt"
	"math"
	"math/rand"

	"github.com/coder/hnsw"
	"github.com/viterin/vek/vek32"
)

// vectors holds the live documents' embeddings (in the entries, by slot:
// see Index) and, above ExactBelow of them, the HNSW graph over them; it
// knows the dimension and the embedding space they are in.
//
// It has no lock of its own: Index.mu guards it, because a document enters
// BM25 and the vectors under one lock. Its invariants, with the lock held:
// every stored vector has unit length and dimension dim and comes from
// space ("" when not known); live counts the live documents with a vector;
// when graph is not nil it holds every live vector, graphDead of its
// inGraph nodes are tombstones, and its keys are slots, never reused
// before compaction (the graph is never edited in place: see Index).
type vectors struct {
	exactBelow int
	m, ef      int
	seed       int64

	dim int // vector dimension, 0 until known
	// space names the embedding space of the stored vectors (see
	// SpaceEmbedder); "" when the embedder has none or it is not known.
	space    string
	reembeds int64 // times every vector was re-embedded (a new space)
	live     int   // live documents with a vector
	// graph, when not nil, holds every live vector (and the tombstones'
	// until the next compaction).
	graph     *hnsw.Graph[uint32]
	inGraph   int // graph nodes, live or not
	graphDead int // graph nodes whose slot is a tombstone
}

func newVectors(o Options) vectors {
	return vectors{exactBelow: o.ExactBelow, m: o.M, ef: o.EfSearch, seed: o.Seed}
}

// clear drops every vector and the graph; the dimension, space and
// re-embedding count stay.
func (v *vectors) clear() {
	v.live = 0
	v.graph = nil
	v.inGraph = 0
	v.graphDead = 0
}

// add counts e's vector (a live document now in slot of docs) and puts it
// in the graph, building the graph when the vectors have just outgrown
// ExactBelow; bulk defers the graph to a build at the end (see build).
func (v *vectors) add(docs []*entry, slot uint32, e *entry, bulk bool) {
	if e.doc.Vector == nil {
		return
	}
	v.live++
	switch {
	case v.graph != nil:
		v.graphAdd(slot, e)
	case !bulk && v.wantGraph():
		v.build(docs)
	}
}

// remove uncounts e's vector, which stays in the graph as a tombstone.
func (v *vectors) remove(e *entry) {
	if e.doc.Vector != nil {
		v.live--
		if v.graph != nil { // every live vector is in the graph
			v.graphDead++
		}
	}
}

func (v *vectors) wantGraph() bool {
	return v.exactBelow < 0 || v.live > v.exactBelow
}

// walks reports whether a search walks the graph rather than scanning.
func (v *vectors) walks() bool {
	return v.graph != nil && !(v.exactBelow >= 0 && v.live <= v.exactBelow)
}

// maybeBuild builds the graph after a bulk load when there are enough
// vectors.
func (v *vectors) maybeBuild(docs []*entry) {
	if v.wantGraph() {
		v.build(docs)
	}
}

func (v *vectors) newGraph() *hnsw.Graph[uint32] {
	return &hnsw.Graph[uint32]{
		Distance: dotDistance,
		M:        v.m,
		Ml:       0.25,
		EfSearch: v.ef,
		Rng:      rand.New(rand.NewSource(v.seed)),
	}
}

// build inserts every live vector of docs into a new graph.
func (v *vectors) build(docs []*entry) {
	v.graph = v.newGraph()
	v.inGraph, v.graphDead = 0, 0
	for slot, e := range docs {
		if e != nil && e.doc.Vector != nil {
			v.graphAdd(uint32(slot), e)
		}
	}
}

func (v *vectors) graphAdd(slot uint32, e *entry) {
	v.graph.Add(hnsw.MakeNode(slot, e.doc.Vector))
	v.inGraph++
}

// checkDim rejects entries of another dimension than the vectors' (when
// none is stored, or none will be: empty, embDim, the embedder's, else the
// first entry's) and fixes the dimension.
func (v *vectors) checkDim(entries []*entry, empty bool, embDim int) error {
	dim := v.dim
	if empty || v.live == 0 {
		dim = embDim // 0 when not known
	}
	for _, e := range entries {
		vec := e.doc.Vector
		if vec == nil {
			continue
		}
		if dim == 0 {
			dim = len(vec)
		}
		if len(vec) != dim {
			return fmt.Errorf("index: document %q has dimension %d, index %d: %w", e.doc.ID, len(vec), dim, ErrInvalid)
		}
	}
	if dim != 0 {
		v.dim = dim
	}
	return nil
}

// checkQuery rejects a query vector qv, made in space qspace, that cannot
// be compared with the stored vectors.
func (v *vectors) checkQuery(qv []float32, qspace string) error {
	if qv != nil && v.dim != 0 && len(qv) != v.dim && v.live > 0 {
		return fmt.Errorf("index: query dimension %d, index %d (re-embedded on the next update): %w", len(qv), v.dim, ErrEmbed)
	}
	if qspace != "" && v.space != "" && qspace != v.space && v.live > 0 {
		return fmt.Errorf("index: query in embedding space %s, documents in %s (re-embedded on the next update): %w", qspace, v.space, ErrEmbed)
	}
	return nil
}

// approxBytes estimates the heap the graph holds (the vectors themselves
// are the entries').
func (v *vectors) approxBytes() int64 {
	// coder/hnsw: a node per layer (~0.33 layers above the base with
	// Ml 0.25) with a map of up to M neighbours (~M·24 bytes).
	return int64(float64(v.inGraph) * 1.33 * float64(100+v.m*24))
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
// statsSample on a graph walk). docs are the index's slots.
func (v *vectors) search(docs []*entry, q []float32, n int, keep func(string) bool) ([]scored, simStats) {
	var st simStats
	if v.live == 0 {
		return nil, st
	}
	if v.graph == nil || (v.exactBelow >= 0 && v.live <= v.exactBelow) {
		top := newTopN(n)
		for slot, e := range docs {
			if e != nil && e.doc.Vector != nil && (keep == nil || keep(e.doc.ID)) {
				s := float64(vek32.Dot(q, e.doc.Vector))
				st.add(s)
				top.push(scored{slot: uint32(slot), score: s})
			}
		}
		return top.sorted(), st
	}
	step := max(len(docs)/statsSample, 1)
	for slot := 0; slot < len(docs); slot += step {
		if e := docs[slot]; e != nil && e.doc.Vector != nil && (keep == nil || keep(e.doc.ID)) {
			st.add(float64(vek32.Dot(q, e.doc.Vector)))
		}
	}
	// Over-fetch in proportion to the tombstones, and at least EfSearch,
	// which is what makes coder/hnsw explore beyond a greedy descent.
	liveInGraph := max(v.inGraph-v.graphDead, 1)
	fetch := max(n*v.inGraph/liveInGraph+8, v.ef)
	for {
		nodes := v.graph.Search(q, fetch)
		top := newTopN(n)
		for _, nd := range nodes {
			if e := docs[nd.Key]; e != nil && (keep == nil || keep(e.doc.ID)) {
				top.push(scored{slot: nd.Key, score: float64(vek32.Dot(q, nd.Value))})
			}
		}
		if top.len() >= n || fetch >= v.inGraph {
			return top.sorted(), st
		}
		fetch *= 2
	}
}
