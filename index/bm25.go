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

// termIDF is the BM25 IDF of term in the live documents; x.mu must be held.
func (x *Index) termIDF(term string) float64 {
	return idf(x.live, x.df[term])
}

// queryTerm is a distinct query term; idf is filled under the lock.
type queryTerm struct {
	term string
	idf  float64
}

// queryTerms returns the distinct terms of q, at most MaxQueryTerms.
func (x *Index) queryTerms(q string) []queryTerm {
	toks := tokenize(q)
	out := make([]queryTerm, 0, min(len(toks), x.opts.MaxQueryTerms))
	for _, t := range toks {
		if len(out) == x.opts.MaxQueryTerms {
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

// bm25Term is one term's contribution for a document of length dl.
func (x *Index) bm25Term(idf float64, tf, dl int, avgdl float64) float64 {
	k1, b := x.opts.K1, x.opts.B
	f := float64(tf)
	return idf * f * (k1 + 1) / (f + k1*(1-b+b*float64(dl)/avgdl))
}

// searchBM25 returns the n best BM25 candidates that keep accepts (nil: all);
// it fills qterms' idf. x.mu must be held for reading.
func (x *Index) searchBM25(qterms []queryTerm, n int, keep func(string) bool) []scored {
	if x.live == 0 || len(qterms) == 0 {
		return nil
	}
	avgdl := max(float64(x.totalLen)/float64(x.live), 1)
	s := bm25Pool.Get().(*bm25Scratch)
	if cap(s.acc) < len(x.docs) {
		s.acc = make([]float64, len(x.docs))
	}
	acc := s.acc[:len(x.docs)]
	touched := s.touched[:0]
	for i := range qterms {
		q := &qterms[i]
		df := x.df[q.term]
		if df == 0 {
			continue
		}
		q.idf = idf(x.live, df)
		for _, p := range x.postings[q.term] {
			e := x.docs[p.slot]
			if e == nil {
				continue
			}
			if acc[p.slot] == 0 {
				touched = append(touched, p.slot)
			}
			acc[p.slot] += x.bm25Term(q.idf, int(p.tf), e.length, avgdl)
		}
	}
	top := newTopN(n)
	for _, slot := range touched {
		if keep == nil || keep(x.docs[slot].doc.ID) {
			top.push(scored{slot: slot, score: acc[slot]})
		}
		acc[slot] = 0
	}
	s.touched = touched[:0]
	bm25Pool.Put(s)
	return top.sorted()
}

// docBM25 scores one document for qterms (whose idf searchBM25 filled).
func (x *Index) docBM25(e *entry, qterms []queryTerm) float64 {
	if x.live == 0 {
		return 0
	}
	avgdl := max(float64(x.totalLen)/float64(x.live), 1)
	var s float64
	for _, q := range qterms {
		if q.idf == 0 {
			continue
		}
		i, ok := slices.BinarySearchFunc(e.terms, q.term, func(t termFreq, s string) int { return cmp.Compare(t.term, s) })
		if ok {
			s += x.bm25Term(q.idf, int(e.terms[i].tf), e.length, avgdl)
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
	qterms := x.queryTerms(query)
	x.mu.RLock()
	defer x.mu.RUnlock()
	slot, ok := x.ids[id]
	if !ok {
		return 0, false
	}
	return x.coverage(qterms, x.docs[slot]), true
}

// coverage is Coverage for a document's entry. x.mu must be held for
// reading.
func (x *Index) coverage(qterms []queryTerm, e *entry) float64 {
	var known, held float64
	unknown := 0
	for _, q := range qterms {
		df := x.df[q.term]
		if df == 0 {
			unknown++
			continue
		}
		w := idf(x.live, df)
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
	return held / (known + float64(unknown)*idf(x.live, 1))
}
