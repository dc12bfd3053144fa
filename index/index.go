package index

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/coder/hnsw"
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
// It owns its postings, vectors and graph; documents are copied in.
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
	emb  Embedder

	mu sync.RWMutex
	// mu protects the fields below.
	ids      map[string]uint32 // ID → slot
	docs     []*entry          // by slot; nil is a tombstone
	live     int               // non-nil docs
	postings map[string][]posting
	df       map[string]int // live documents containing the term
	totalLen int64          // sum of live documents' term counts
	dim      int            // vector dimension, 0 until known
	// space names the embedding space of the stored vectors (see
	// SpaceEmbedder); "" when the embedder has none or it is not known.
	space string
	// ver counts changes of the contents, so a re-embedding done without
	// the lock knows whether it is still current.
	ver      uint64
	reembeds int64 // times every vector was re-embedded (a new space)
	vecLive  int   // live documents with a vector
	// graph, when not nil, holds every live vector (and the tombstones'
	// until the next compaction).
	graph     *hnsw.Graph[uint32]
	inGraph   int // graph nodes, live or not
	graphDead int // graph nodes whose slot is a tombstone
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
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	x := &Index{opts: opts, emb: opts.Embedder}
	x.reset()
	if d := x.emb.Dim(); d > 0 {
		x.dim = d
	}
	if se, ok := x.emb.(SpaceEmbedder); ok {
		x.space = se.Space()
	}
	return x, nil
}

// reset empties the index; x.mu must be held (or x unpublished).
func (x *Index) reset() {
	x.ver++
	x.ids = make(map[string]uint32)
	x.docs = nil
	x.live = 0
	x.postings = make(map[string][]posting)
	x.df = make(map[string]int)
	x.totalLen = 0
	x.vecLive = 0
	x.graph = nil
	x.inGraph = 0
	x.graphDead = 0
}

// Len returns the number of live documents.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.live
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
	entries, sp, err := x.prepare(ctx, docs, replace)
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
	if x.staleFor(sp) {
		x.mu.Unlock()
		err := x.reembed(ctx, entries, false)
		x.mu.Lock()
		return err
	}
	if err := x.checkDim(entries, false); err != nil {
		return err
	}
	x.adoptSpace(sp)
	for _, e := range entries {
		if slot, ok := x.ids[e.doc.ID]; ok {
			x.remove(slot)
		}
		x.insert(e)
	}
	x.maybeCompact()
	return nil
}

// prepare validates docs, embeds those without vectors and tokenizes them;
// it takes no lock. It returns the space the vectors it made are in.
func (x *Index) prepare(ctx context.Context, docs []Doc, dedupe bool) ([]*entry, vecSpace, error) {
	seen := make(map[string]int, len(docs))
	out := make([]*entry, 0, len(docs))
	var texts []string
	var need []int
	for _, d := range docs {
		if d.ID == "" {
			return nil, vecSpace{}, fmt.Errorf("index: empty document id: %w", ErrInvalid)
		}
		if i, ok := seen[d.ID]; ok {
			if !dedupe {
				return nil, vecSpace{}, fmt.Errorf("index: id %q repeated: %w", d.ID, ErrDuplicate)
			}
			out[i] = nil // last one wins
		}
		seen[d.ID] = len(out)
		if d.Vector == nil {
			texts = append(texts, d.Text)
			need = append(need, len(out))
		}
		out = append(out, newEntry(d))
	}
	var sp vecSpace
	if len(texts) > 0 {
		vecs, space, err := x.embed(ctx, texts)
		if err != nil {
			return nil, vecSpace{}, err
		}
		sp = vecSpace{space: space, fresh: true}
		for _, v := range vecs {
			if v != nil {
				sp.dim = len(v)
				break
			}
		}
		for j, i := range need {
			if out[i] != nil {
				out[i].doc.Vector = vecs[j]
				out[i].fresh = true
			}
		}
	}
	return slices.DeleteFunc(out, func(e *entry) bool { return e == nil }), sp, nil
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

// embed calls the embedder and returns normalised copies (nil for zero
// vectors), checking count and dimension, and the space they are in ("" for
// an embedder that is not a SpaceEmbedder).
func (x *Index) embed(ctx context.Context, texts []string) ([][]float32, string, error) {
	var vecs [][]float32
	var space string
	var err error
	if se, ok := x.emb.(SpaceEmbedder); ok {
		vecs, space, err = se.EmbedSpace(ctx, texts)
	} else {
		vecs, err = x.emb.Embed(ctx, texts)
	}
	if err != nil {
		if errors.Is(err, ErrEmbed) {
			return nil, "", fmt.Errorf("index: embed %d texts with %s: %w", len(texts), x.emb.Name(), err)
		}
		return nil, "", fmt.Errorf("index: embed %d texts with %s: %w: %w", len(texts), x.emb.Name(), ErrEmbed, err)
	}
	if len(vecs) != len(texts) {
		return nil, "", fmt.Errorf("index: embedder %s returned %d vectors for %d texts: %w", x.emb.Name(), len(vecs), len(texts), ErrEmbed)
	}
	out := make([][]float32, len(vecs))
	for i, v := range vecs {
		if len(v) == 0 {
			return nil, "", fmt.Errorf("index: embedder %s returned an empty vector: %w", x.emb.Name(), ErrEmbed)
		}
		if i > 0 && len(v) != len(vecs[0]) {
			return nil, "", fmt.Errorf("index: embedder %s returned dimensions %d and %d: %w", x.emb.Name(), len(vecs[0]), len(v), ErrEmbed)
		}
		out[i] = normalizedCopy(v)
	}
	return out, space, nil
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

// checkDim rejects entries of another dimension than the index's (when it
// holds no vector, or will not: empty, the embedder's, else the first
// entry's) and fixes the index's; x.mu must be held.
func (x *Index) checkDim(entries []*entry, empty bool) error {
	dim := x.dim
	if empty || x.vecLive == 0 {
		dim = x.emb.Dim() // 0 when not known
	}
	for _, e := range entries {
		v := e.doc.Vector
		if v == nil {
			continue
		}
		if dim == 0 {
			dim = len(v)
		}
		if len(v) != dim {
			return fmt.Errorf("index: document %q has dimension %d, index %d: %w", e.doc.ID, len(v), dim, ErrInvalid)
		}
	}
	if dim != 0 {
		x.dim = dim
	}
	return nil
}

// insert publishes e in a new slot; x.mu must be held.
func (x *Index) insert(e *entry) {
	x.ver++
	slot := uint32(len(x.docs))
	x.docs = append(x.docs, e)
	x.ids[e.doc.ID] = slot
	x.live++
	for _, t := range e.terms {
		x.postings[t.term] = append(x.postings[t.term], posting{slot: slot, tf: t.tf})
		x.df[t.term]++
	}
	x.totalLen += int64(e.length)
	if e.doc.Vector == nil {
		return
	}
	x.vecLive++
	switch {
	case x.graph != nil:
		x.graphAdd(slot, e)
	case x.wantGraph():
		x.buildGraph()
	}
}

// remove turns slot into a tombstone; x.mu must be held.
func (x *Index) remove(slot uint32) {
	x.ver++
	e := x.docs[slot]
	x.docs[slot] = nil
	delete(x.ids, e.doc.ID)
	x.live--
	for _, t := range e.terms {
		if x.df[t.term]--; x.df[t.term] <= 0 {
			// Every remaining posting of the term is a tombstone.
			delete(x.df, t.term)
			delete(x.postings, t.term)
		}
	}
	x.totalLen -= int64(e.length)
	if e.doc.Vector != nil {
		x.vecLive--
		if x.graph != nil { // every live vector is in the graph
			x.graphDead++
		}
	}
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
	entries, sp, err := x.prepare(ctx, docs, true)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if sp.fresh && x.space != "" && sp.space != "" && sp.space != x.space && slices.ContainsFunc(entries, func(e *entry) bool { return !e.fresh && e.doc.Vector != nil }) {
		x.mu.Unlock()
		err := x.reembed(ctx, entries, true)
		x.mu.Lock()
		return err
	}
	old := x.dim
	x.dim = x.emb.Dim()
	if err := x.checkDim(entries, true); err != nil {
		x.dim = old
		return err
	}
	x.reset()
	x.load(entries)
	x.adoptSpace(sp)
	return nil
}

// load inserts entries into an empty index, building the graph once at the
// end rather than node by node; x.mu must be held.
func (x *Index) load(entries []*entry) {
	keep := x.opts.ExactBelow
	x.opts.ExactBelow = math.MaxInt // no graph while inserting
	for _, e := range entries {
		x.insert(e)
	}
	x.opts.ExactBelow = keep
	if x.wantGraph() {
		x.buildGraph()
	}
}

func (x *Index) Stats() Stats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	s := Stats{
		Docs:       x.live,
		Tombstones: len(x.docs) - x.live,
		Vectors:    x.vecLive,
		Terms:      len(x.postings),
		Graph:      x.graph != nil && !(x.opts.ExactBelow >= 0 && x.vecLive <= x.opts.ExactBelow),
		Dim:        x.dim,
		Embedder:   x.emb.Name(),
		Space:      x.space,
		Reembeds:   x.reembeds,
	}
	var b int64
	for _, e := range x.docs {
		if e == nil {
			continue
		}
		b += 160 + int64(len(e.doc.ID)+len(e.doc.Text)) + int64(len(e.terms))*24 + int64(len(e.doc.Vector))*4
	}
	for t, ps := range x.postings {
		b += int64(len(t)) + 64 + int64(cap(ps))*8
	}
	b += int64(len(x.ids)) * 48
	// coder/hnsw: a node per layer (~0.33 layers above the base with
	// Ml 0.25) with a map of up to M neighbours (~M·24 bytes).
	b += int64(float64(x.inGraph) * 1.33 * float64(100+x.opts.M*24))
	s.ApproxBytes = b
	return s
}

// scored is a candidate of one retriever.
// Search returns up to k documents for query, best first (ties broken by
// ID). Each retriever contributes its Options.Candidates best; in hybrid mode
// every candidate of either list is then scored exactly by both (BM25 and
// cosine) before fusion, so a document the approximate graph walk missed
// still ranks by its true similarity if BM25 found it. ModeBM25 never calls
// the embedder; the other modes embed the query first, outside the lock
// (the offline embedder embeds under the read lock, weighting query terms
// by the index's IDF, see HashEmbedder.EmbedWeighted).
func (x *Index) Search(ctx context.Context, query string, k int, mode Mode) ([]Hit, error) {
	return x.SearchFunc(ctx, query, k, mode, nil)
}

// SearchFunc is Search over the documents whose ID keep accepts (nil keeps
// all). The filter applies before each retriever takes its best candidates,
// so excluded documents never crowd out the ones asked for; keep is called
// under the index's read lock and must not call back into the index.
func (x *Index) SearchFunc(ctx context.Context, query string, k int, mode Mode, keep func(id string) bool) ([]Hit, error) {
	return x.SearchFocus(ctx, query, "", k, mode, keep)
}

// SearchFocus is SearchFunc whose hits' Coverage is measured against focus,
// the part of the query that must be answered (a question, when query adds
// the message before it as context), rather than the whole query. An empty
// focus, or one of stopwords only, means the whole query.
func (x *Index) SearchFocus(ctx context.Context, query, focus string, k int, mode Mode, keep func(id string) bool) ([]Hit, error) {
	if k < 1 {
		return nil, fmt.Errorf("index: search k=%d: %w", k, ErrInvalid)
	}
	if mode != ModeHybrid && mode != ModeBM25 && mode != ModeVector {
		return nil, fmt.Errorf("index: search mode %d: %w", int(mode), ErrInvalid)
	}
	weighter, weighted := x.emb.(queryWeighter)
	var qv []float32
	var qspace string
	if mode != ModeBM25 && !weighted {
		qctx := ctx
		if x.opts.QueryTimeout > 0 {
			var cancel context.CancelFunc
			qctx, cancel = context.WithTimeout(ctx, x.opts.QueryTimeout)
			defer cancel()
		}
		vecs, space, err := x.embed(qctx, []string{query})
		if err != nil {
			return nil, err
		}
		qv, qspace = vecs[0], space
	}
	qterms := x.queryTerms(query)
	now := x.opts.Now()

	x.mu.RLock()
	defer x.mu.RUnlock()
	if mode != ModeBM25 && weighted {
		qv = normalizedCopy(weighter.EmbedWeighted(query, x.termIDF))
	}
	if qv != nil && x.dim != 0 && len(qv) != x.dim && x.vecLive > 0 {
		return nil, fmt.Errorf("index: query dimension %d, index %d (re-embedded on the next update): %w", len(qv), x.dim, ErrEmbed)
	}
	if qspace != "" && x.space != "" && qspace != x.space && x.vecLive > 0 {
		return nil, fmt.Errorf("index: query in embedding space %s, documents in %s (re-embedded on the next update): %w", qspace, x.space, ErrEmbed)
	}
	depth := max(k, x.opts.Candidates)
	var bm, vec []scored
	var sims simStats
	if mode != ModeVector {
		bm = x.searchBM25(qterms, depth, keep)
	}
	if mode != ModeBM25 && qv != nil {
		vec, sims = x.searchVector(qv, depth, keep)
	}
	var gr []scored
	if mode == ModeHybrid {
		gr = x.searchGraph(query, depth, keep)
	}
	cands := x.fuse(mode, qterms, qv, bm, vec, gr)
	x.rerank(cands, now)
	slices.SortFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(b.final, a.final); c != 0 {
			return c
		}
		return cmp.Compare(x.docs[a.slot].doc.ID, x.docs[b.slot].doc.ID)
	})
	if len(cands) > k {
		cands = cands[:k]
	}
	hits := make([]Hit, len(cands))
	cterms := qterms
	if f := x.queryTerms(focus); len(f) > 0 {
		cterms = f
	}
	for i, c := range cands {
		e := x.docs[c.slot]
		d := &e.doc
		hits[i] = Hit{ID: d.ID, Text: d.Text, Meta: d.Meta, Score: c.final, Relevance: c.rel, BM25: c.bm25, Cosine: c.cos,
			Coverage: x.coverage(cterms, e), Graph: c.graph}
		if d.Vector != nil {
			hits[i].CosineZ = sims.z(c.cos)
		}
	}
	return hits, nil
}
