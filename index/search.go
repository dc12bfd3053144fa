package index

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

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
	var qv []float32
	var qspace string
	if mode != ModeBM25 {
		var err error
		if qv, qspace, err = x.emb.query(ctx, query); err != nil {
			return nil, err
		}
	}
	qterms := x.bm.queryTerms(query)
	now := x.opts.Now()

	x.mu.RLock()
	defer x.mu.RUnlock()
	if mode != ModeBM25 && x.emb.weighs() {
		qv = x.emb.weighted(query, x.bm.termIDF)
	}
	if err := x.vec.checkQuery(qv, qspace); err != nil {
		return nil, err
	}
	depth := max(k, x.opts.Candidates)
	var bm, vec []scored
	var sims simStats
	if mode != ModeVector {
		bm = x.bm.search(x.docs, qterms, depth, keep)
	}
	if mode != ModeBM25 && qv != nil {
		vec, sims = x.vec.search(x.docs, qv, depth, keep)
	}
	var gr []scored
	if mode == ModeHybrid && x.opts.GraphWeight > 0 {
		gr = x.entities.retrieve(query, depth, x.opts.Candidates, x.ids, x.docs, keep)
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
	if f := x.bm.queryTerms(focus); len(f) > 0 {
		cterms = f
	}
	for i, c := range cands {
		e := x.docs[c.slot]
		d := &e.doc
		hits[i] = Hit{ID: d.ID, Text: d.Text, Meta: d.Meta, Score: c.final, Relevance: c.rel, BM25: c.bm25, Cosine: c.cos,
			Coverage: x.bm.coverage(cterms, e), Graph: c.graph}
		if d.Vector != nil {
			hits[i].CosineZ = sims.z(c.cos)
		}
	}
	return hits, nil
}
