package index

import (
	"cmp"
	"math"
	"slices"
	"sync"
)

// termFreq is a term of a document with its count.
type termFreq struct {
	term string
	tf   uint32
}

// posting is a document (by slot) holding a term tf times.
type posting struct {
	slot uint32
	tf   uint32
}

// termFreqs tokenizes text into sorted distinct terms with counts.
func termFreqs(text string) ([]termFreq, int) {
	toks := tokenize(text)
	if len(toks) == 0 {
		return nil, 0
	}
	slices.Sort(toks)
	var out []termFreq
	for i, t := range toks {
		if i > 0 && t == toks[i-1] {
			out[len(out)-1].tf++
			continue
		}
		out = append(out, termFreq{term: t, tf: 1})
	}
	return slices.Clip(out), len(toks)
}

// queryWeighter is implemented by embedders built on the index's own terms
// (HashEmbedder): the index weighs the query's terms by their IDF in this
// corpus, as BM25 does, which a corpus-independent embedding cannot.
type queryWeighter interface {
	EmbedWeighted(text string, weight func(term string) float64) []float32
}

// bm25 is the inverted index of the live documents' terms and the corpus
// statistics BM25 scores with. Documents are named by slot (see Index);
// their terms and lengths stay in the entries, which bm25 reads but never
// changes.
//
// It has no lock of its own: Index.mu guards it, because a document enters
// BM25 and the vectors under one lock. Its invariants, with the lock held:
// n is the index's count of live documents (Index.Len); df[t] is the number of live documents holding t, and a
// term is in postings exactly when it is in df (a posting list may still
// name tombstones until compaction); totalLen is the sum of the live
// documents' lengths.
type bm25 struct {
	k1, b         float64
	maxQueryTerms int

	postings map[string][]posting
	df       map[string]int // live documents containing the term
	totalLen int64          // sum of live documents' term counts
	n        int            // live documents: the index's one count of them
}

// newBM25 returns postings to clear before use (Index.reset does).
func newBM25(o Options) bm25 {
	return bm25{k1: o.K1, b: o.B, maxQueryTerms: o.MaxQueryTerms}
}

// clear empties the postings.
func (p *bm25) clear() {
	p.postings = make(map[string][]posting)
	p.df = make(map[string]int)
	p.totalLen = 0
	p.n = 0
}

// add indexes the terms of e, a live document now in slot.
func (p *bm25) add(slot uint32, e *entry) {
	p.n++
	for _, t := range e.terms {
		p.postings[t.term] = append(p.postings[t.term], posting{slot: slot, tf: t.tf})
		p.df[t.term]++
	}
	p.totalLen += int64(e.length)
}

// remove takes e's terms out of the statistics; its postings stay as
// tombstones' until the term has no live document or compaction.
func (p *bm25) remove(e *entry) {
	p.n--
	for _, t := range e.terms {
		if p.df[t.term]--; p.df[t.term] <= 0 {
			// Every remaining posting of the term is a tombstone.
			delete(p.df, t.term)
			delete(p.postings, t.term)
		}
	}
	p.totalLen -= int64(e.length)
}

// termIDF is the BM25 IDF of term in the live documents.
func (p *bm25) termIDF(term string) float64 {
	return idf(p.n, p.df[term])
}

// queryTerm is a distinct query term; idf is filled under the lock.
type queryTerm struct {
	term string
	idf  float64
}

// queryTerms returns the distinct terms of q, at most MaxQueryTerms. It
// reads no state that changes: callers need not hold the lock.
func (p *bm25) queryTerms(q string) []queryTerm {
	toks := tokenize(q)
	out := make([]queryTerm, 0, min(len(toks), p.maxQueryTerms))
	for _, t := range toks {
		if len(out) == p.maxQueryTerms {
			break
		}
		if !slices.ContainsFunc(out, func(q queryTerm) bool { return q.term == t }) {
			out = append(out, queryTerm{term: t})
		}
	}
	return out
}

// bm25Scratch is per-search accumulator space.
type bm25Scratch struct {
	acc     []float64
	touched []uint32
}

var bm25Pool = sync.Pool{New: func() any { return new(bm25Scratch) }}

// idf is BM25's inverse document frequency, in Lucene's non-negative form.
func idf(n, df int) float64 {
	return math.Log(1 + (float64(n)-float64(df)+0.5)/(float64(df)+0.5))
}

// term is one term's contribution for a document of length dl.
func (p *bm25) term(idf float64, tf, dl int, avgdl float64) float64 {
	k1, b := p.k1, p.b
	f := float64(tf)
	return idf * f * (k1 + 1) / (f + k1*(1-b+b*float64(dl)/avgdl))
}

// search returns the n best BM25 candidates among docs (the index's
// slots) that keep accepts (nil: all); it fills qterms' idf.
func (p *bm25) search(docs []*entry, qterms []queryTerm, n int, keep func(string) bool) []scored {
	if p.n == 0 || len(qterms) == 0 {
		return nil
	}
	avgdl := max(float64(p.totalLen)/float64(p.n), 1)
	s := bm25Pool.Get().(*bm25Scratch)
	if cap(s.acc) < len(docs) {
		s.acc = make([]float64, len(docs))
	}
	acc := s.acc[:len(docs)]
	touched := s.touched[:0]
	for i := range qterms {
		q := &qterms[i]
		df := p.df[q.term]
		if df == 0 {
			continue
		}
		q.idf = idf(p.n, df)
		for _, ps := range p.postings[q.term] {
			e := docs[ps.slot]
			if e == nil {
				continue
			}
			if acc[ps.slot] == 0 {
				touched = append(touched, ps.slot)
			}
			acc[ps.slot] += p.term(q.idf, int(ps.tf), e.length, avgdl)
		}
	}
	top := newTopN(n)
	for _, slot := range touched {
		if keep == nil || keep(docs[slot].doc.ID) {
			top.push(scored{slot: slot, score: acc[slot]})
		}
		acc[slot] = 0
	}
	s.touched = touched[:0]
	bm25Pool.Put(s)
	return top.sorted()
}

// score scores one document for qterms (whose idf search filled).
func (p *bm25) score(e *entry, qterms []queryTerm) float64 {
	if p.n == 0 {
		return 0
	}
	avgdl := max(float64(p.totalLen)/float64(p.n), 1)
	var s float64
	for _, q := range qterms {
		if q.idf == 0 {
			continue
		}
		i, ok := slices.BinarySearchFunc(e.terms, q.term, func(t termFreq, s string) int { return cmp.Compare(t.term, s) })
		if ok {
			s += p.term(q.idf, int(e.terms[i].tf), e.length, avgdl)
		}
	}
	return s
}

// Coverage is the share of query's information that the document id
// holds, and false when there is no such document: the IDF, in this index,
// of the query terms the document contains over the IDF of all of them, in
// [0,1]. A query term no document has counts with the mean IDF of the
// others (the document cannot be blamed for not holding it, but it is part
// of the question); a query with no term any document has covers nothing.
// Unlike a BM25 score it is comparable across queries and indexes: a
// document sharing only a frequent word with the query covers little of it.
func (x *Index) Coverage(query, id string) (float64, bool) {
	qterms := x.bm.queryTerms(query)
	x.mu.RLock()
	defer x.mu.RUnlock()
	slot, ok := x.ids[id]
	if !ok {
		return 0, false
	}
	return x.bm.coverage(qterms, x.docs[slot]), true
}

// coverage is Coverage for a document's entry.
func (p *bm25) coverage(qterms []queryTerm, e *entry) float64 {
	var known, held float64
	unknown := 0
	for _, q := range qterms {
		df := p.df[q.term]
		if df == 0 {
			unknown++
			continue
		}
		w := idf(p.n, df)
		known += w
		if _, ok := slices.BinarySearchFunc(e.terms, q.term, func(t termFreq, s string) int { return cmp.Compare(t.term, s) }); ok {
			held += w
		}
	}
	n := len(qterms) - unknown
	if n == 0 || known <= 0 {
		return 0
	}
	// A query word the index has never seen is at least as telling as
	// its rarest word: a memory that shares only the question's common
	// words ("item" of "Item 25, goblet?") covers little of it.
	return held / (known + float64(unknown)*idf(p.n, 1))
}

// approxBytes estimates the heap the postings hold.
func (p *bm25) approxBytes() int64 {
	var b int64
	for t, ps := range p.postings {
		b += int64(len(t)) + 64 + int64(cap(ps))*8
	}
	return b
}
