package index

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Meta is the metadata the reranker reads. The index stores it and never
// changes it on its own; the owner updates it with UpdateMeta.
type Meta struct {
	// Time is when the memory was made or last confirmed (recency).
	Time time.Time
	// Importance is ≥ 0, open-ended (memory/ uses roughly 0..5).
	Importance float64
	// AccessCount is how often the memory was recalled.
	AccessCount int64
}

// Doc is one indexed unit of text.
type Doc struct {
	// ID is the caller's key, unique within an index; it is never used as a
	// file name.
	ID   string
	Text string
	Meta Meta
	// Vector is an optional precomputed embedding from the index's embedder
	// (for example kept from an earlier Get); nil makes Add embed Text.
	// The index keeps its own normalised copy.
	Vector []float32
}

// Hit is one search result. Score orders hits (higher first); the other
// scores explain it.
type Hit struct {
	ID   string
	Text string
	Meta Meta
	// Score is the final reranked score.
	Score float64
	// Relevance is the retrieval score (fused in hybrid mode) divided by the
	// best candidate's, in [0,1].
	Relevance float64
	// BM25 is the document's BM25 score for the query (0: no term matched).
	// Not computed in ModeVector.
	BM25 float64
	// Cosine is the cosine similarity of the document and query embeddings.
	// Not computed in ModeBM25.
	Cosine float64
	// CosineZ is how far Cosine stands above the query's similarity with
	// the documents searched, in standard deviations (0 below 8 vectors or
	// in ModeBM25). A model's embeddings put any two texts at a high
	// cosine (0.4 to 0.9 for unrelated ones is common), so a fixed cosine
	// threshold passes everything; the standard score tells the few that
	// stand out.
	CosineZ float64
	// Coverage is the share of the query's information the document holds
	// (see Index.Coverage), measured against the focus given to
	// SearchFocus, else the whole query.
	Coverage float64
	// Graph is the document's score in the entity graph (see EntityGraph;
	// 0: the graph did not reach it or none is attached). Hybrid mode only.
	Graph float64
}

// Stats describe an index's contents.
type Stats struct {
	Docs       int    // live documents
	Tombstones int    // deleted or replaced documents not yet compacted away
	Vectors    int    // live documents with a non-zero embedding
	Terms      int    // distinct BM25 terms
	Graph      bool   // whether vector search walks the HNSW graph
	Dim        int    // embedding dimension (0 before the first vector)
	Embedder   string // the embedder's Name
	Space      string // the vectors' embedding space (SpaceEmbedder; "" otherwise)
	Reembeds   int64  // times every vector was re-embedded for a new space
	// ApproxBytes estimates the heap held by the index (texts, postings,
	// vectors, graph links); it is an estimate, not a measurement.
	ApproxBytes int64
}

// Index is a hybrid BM25 + vector (HNSW) index over documents with metadata.
// It owns the documents (copied in) and its parts: the postings (bm25), the
// vectors and their graph (vectors), the embedder calls (embedding) and the
// attached entity graph; see the package documentation for each part's
// invariants.
// Methods are safe for concurrent use: searches share a read lock, updates
// take the write lock only to apply prepared entries (embedding runs
// outside any lock).
//
// Deletion: coder/hnsw v0.6.1's Graph.Delete can leave a layer empty or a
// deleted node reachable as an entry ("elevator") point, and re-adding a key
// panics (upstream issues #10, #13, #15). The index therefore never deletes
// from the graph: a deleted or replaced document becomes a tombstone (its
// slot is nil), searches skip tombstones and over-fetch to make up for them,
// and when tombstones exceed Options.CompactRatio of the live documents the
// postings and graph are rebuilt from the live documents. Graph keys are
// slots, which are never reused before such a rebuild.
type Index struct {
	opts Options
	emb  embedding // immutable

	mu sync.RWMutex
	// mu protects the fields below, the parts' included: a document
	// enters BM25 and the vectors under it at once.
	ids  map[string]uint32 // ID → slot
	docs []*entry          // by slot; nil is a tombstone (the live count is bm.n)
	// ver counts changes of the contents, so a re-embedding done without
	// the lock knows whether it is still current.
	ver uint64
	bm  bm25    // postings of the live documents' terms
	vec vectors // their embeddings: dimension, space, HNSW graph
	// entities is the knowledge graph fused in hybrid mode (SetGraph);
	// nil when none. It survives compaction (it names documents by ID).
	entities *EntityGraph
}

// entry is an indexed document; immutable once published (UpdateMeta
// replaces the pointer), so snapshots can be read without the lock.
type entry struct {
	doc    Doc        // doc.Vector is normalised, nil when zero
	terms  []termFreq // sorted by term
	length int        // number of terms (BM25 document length)
	// fresh marks a vector the embedder just made (not one given with
	// the Doc); only while an update is prepared.
	fresh bool
}

// New returns an empty index.
func New(opts Options) (*Index, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	x := &Index{opts: opts, emb: newEmbedding(opts), bm: newBM25(opts), vec: newVectors(opts)}
	x.reset()
	if d := x.emb.Dim(); d > 0 {
		x.vec.dim = d
	}
	x.vec.space = x.emb.space()
	return x, nil
}

// reset empties the index; x.mu must be held (or x unpublished).
func (x *Index) reset() {
	x.ver++
	x.ids = make(map[string]uint32)
	x.docs = nil
	x.bm.clear()
	x.vec.clear()
}

// Len returns the number of live documents.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.bm.n
}

// Get returns a copy of the document with the given ID; its Vector is the
// index's normalised embedding (shared: do not modify it).
func (x *Index) Get(id string) (Doc, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	slot, ok := x.ids[id]
	if !ok {
		return Doc{}, false
	}
	return x.docs[slot].doc, true
}

// Range calls fn with the ID and metadata of every live document, in no
// particular order, until fn returns false. It holds the read lock: fn must
// not call back into the index.
func (x *Index) Range(fn func(id string, m Meta) bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, e := range x.docs {
		if e != nil && !fn(e.doc.ID, e.doc.Meta) {
			return
		}
	}
}

// Add indexes docs; it fails with ErrDuplicate, adding nothing, if any ID is
// already indexed or repeated in docs.
func (x *Index) Add(ctx context.Context, docs ...Doc) error {
	return x.put(ctx, docs, false)
}

// Upsert indexes docs, replacing documents with the same IDs (the last of
// repeated IDs in docs wins).
//
// When the embedder (a SpaceEmbedder) answers in another vector space
// than the index's stored vectors (another model or dimension), Add and
// Upsert first re-embed every document of the index and the given
// vectors of docs (made in the old space), and replace the whole vector
// index at once; when that fails nothing changes.
func (x *Index) Upsert(ctx context.Context, docs ...Doc) error {
	return x.put(ctx, docs, true)
}

func (x *Index) put(ctx context.Context, docs []Doc, replace bool) error {
	entries, sp, err := x.emb.prepare(ctx, docs, replace)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !replace {
		for _, e := range entries {
			if _, ok := x.ids[e.doc.ID]; ok {
				return fmt.Errorf("index: add %q: %w", e.doc.ID, ErrDuplicate)
			}
		}
	}
	if x.vec.staleFor(sp) {
		x.mu.Unlock()
		err := x.reembed(ctx, entries, false)
		x.mu.Lock()
		return err
	}
	if err := x.vec.checkDim(entries, false, x.emb.Dim()); err != nil {
		return err
	}
	x.vec.adoptSpace(sp)
	for _, e := range entries {
		if slot, ok := x.ids[e.doc.ID]; ok {
			x.remove(slot)
		}
		x.insert(e, false)
	}
	x.maybeCompact()
	return nil
}

// newEntry tokenizes d and copies its vector, normalised (nil when zero).
func newEntry(d Doc) *entry {
	e := &entry{doc: d}
	if d.Vector != nil {
		e.doc.Vector = normalizedCopy(d.Vector)
	}
	e.terms, e.length = termFreqs(d.Text)
	return e
}

// normalizedCopy returns v scaled to unit length, or nil when v is zero or
// not finite.
func normalizedCopy(v []float32) []float32 {
	c := slices.Clone(v)
	normalize(c)
	for _, f := range c {
		if f != 0 {
			return c
		}
	}
	return nil
}

// insert publishes e in a new slot, deferring the graph to the end of a
// bulk load; x.mu must be held.
func (x *Index) insert(e *entry, bulk bool) {
	x.ver++
	slot := uint32(len(x.docs))
	x.docs = append(x.docs, e)
	x.ids[e.doc.ID] = slot
	x.bm.add(slot, e)
	x.vec.add(x.docs, slot, e, bulk)
}

// remove turns slot into a tombstone; x.mu must be held.
func (x *Index) remove(slot uint32) {
	x.ver++
	e := x.docs[slot]
	x.docs[slot] = nil
	delete(x.ids, e.doc.ID)
	x.bm.remove(e)
	x.vec.remove(e)
}

// Delete removes the document from BM25, the vector index and the graph (as
// a tombstone, see Index); it reports whether the ID was indexed.
func (x *Index) Delete(id string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, ok := x.ids[id]
	if !ok {
		return false
	}
	x.remove(slot)
	x.maybeCompact()
	return true
}

// UpdateMeta replaces a document's metadata without re-embedding it.
func (x *Index) UpdateMeta(id string, m Meta) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, ok := x.ids[id]
	if !ok {
		return fmt.Errorf("index: update meta %q: %w", id, ErrNotFound)
	}
	e := *x.docs[slot]
	e.doc.Meta = m
	x.docs[slot] = &e
	x.ver++
	return nil
}

// Rebuild replaces the whole contents with docs (embedding those without a
// vector), for example after Load reported durable.ErrCorrupt. On error the index is
// unchanged.
//
// Vectors given with docs are taken to be in the index's space; when the
// vectors made for the others are in another (see Upsert), every document
// is embedded again.
func (x *Index) Rebuild(ctx context.Context, docs []Doc) error {
	entries, sp, err := x.emb.prepare(ctx, docs, true)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if sp.fresh && x.vec.space != "" && sp.space != "" && sp.space != x.vec.space && slices.ContainsFunc(entries, func(e *entry) bool { return !e.fresh && e.doc.Vector != nil }) {
		x.mu.Unlock()
		err := x.reembed(ctx, entries, true)
		x.mu.Lock()
		return err
	}
	old := x.vec.dim
	x.vec.dim = x.emb.Dim()
	if err := x.vec.checkDim(entries, true, x.emb.Dim()); err != nil {
		x.vec.dim = old
		return err
	}
	x.reset()
	x.load(entries)
	x.vec.adoptSpace(sp)
	return nil
}

// load inserts entries into an empty index, building the graph once at the
// end rather than node by node; x.mu must be held.
func (x *Index) load(entries []*entry) {
	for _, e := range entries {
		x.insert(e, true)
	}
	x.vec.maybeBuild(x.docs)
}

// maybeCompact rebuilds postings and graph without tombstones once they
// outnumber CompactRatio of the live documents; x.mu must be held.
func (x *Index) maybeCompact() {
	dead := len(x.docs) - x.bm.n
	if dead <= 64 || float64(dead) <= x.opts.CompactRatio*float64(x.bm.n) {
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
	entries := make([]*entry, 0, x.bm.n)
	for _, e := range x.docs {
		if e != nil {
			entries = append(entries, e)
		}
	}
	dim := x.vec.dim
	x.reset()
	x.vec.dim = dim
	x.load(entries)
}

// Stats describes the index's contents now.
func (x *Index) Stats() Stats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	s := Stats{
		Docs:       x.bm.n,
		Tombstones: len(x.docs) - x.bm.n,
		Vectors:    x.vec.live,
		Terms:      len(x.bm.postings),
		Graph:      x.vec.walks(),
		Dim:        x.vec.dim,
		Embedder:   x.emb.Name(),
		Space:      x.vec.space,
		Reembeds:   x.vec.reembeds,
	}
	var b int64
	for _, e := range x.docs {
		if e == nil {
			continue
		}
		b += 160 + int64(len(e.doc.ID)+len(e.doc.Text)) + int64(len(e.terms))*24 + int64(len(e.doc.Vector))*4
	}
	b += x.bm.approxBytes()
	b += int64(len(x.ids)) * 48
	b += x.vec.approxBytes()
	s.ApproxBytes = b
	return s
}
