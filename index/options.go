package index

import (
	"fmt"
	"math"
	"time"
)

// Mode selects the retrievers a search uses.
type Mode int

const (
	// ModeHybrid (the zero value) fuses BM25 and vector results.
	ModeHybrid Mode = iota
	// ModeBM25 ranks by BM25 only; it never calls the embedder.
	ModeBM25
	// ModeVector ranks by cosine similarity of embeddings only.
	ModeVector
)

// String returns "hybrid", "bm25" or "vector".
func (m Mode) String() string {
	switch m {
	case ModeHybrid:
		return "hybrid"
	case ModeBM25:
		return "bm25"
	case ModeVector:
		return "vector"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode parses "hybrid", "bm25" or "vector".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "hybrid", "":
		return ModeHybrid, nil
	case "bm25":
		return ModeBM25, nil
	case "vector":
		return ModeVector, nil
	}
	return 0, fmt.Errorf("index: mode %q: %w", s, ErrInvalid)
}

// Fusion selects how hybrid search combines the BM25 and vector rankings.
type Fusion int

const (
	// FusionWeighted (the zero value) adds the two scores after normalising
	// each by its best candidate (BM25 s/max, cosine max(s,0)/max; a document
	// missing from one list scores 0 there), weighted by VectorWeight and
	// 1-VectorWeight. It keeps how much better the best match is, which
	// rank-only fusion throws away; on LoCoMo it beat RRF (see bench/workload/).
	FusionWeighted Fusion = iota
	// FusionRRF is reciprocal rank fusion: Σ w/(RRFK + rank), ranks from 1,
	// with the same weights. It ignores score scales entirely.
	FusionRRF
)

// String returns "weighted" or "rrf".
func (f Fusion) String() string {
	switch f {
	case FusionWeighted:
		return "weighted"
	case FusionRRF:
		return "rrf"
	}
	return fmt.Sprintf("Fusion(%d)", int(f))
}

// RerankWeights weigh the signals of the final ranking:
//
//	score = Relevance·rel + Recency·2^(-age/HalfLife)
//	      + Importance·imp/(1+imp) + Access·ln(1+a)/(1+ln(1+a))
//
// rel is the retrieval score divided by the best candidate's (so in [0,1]),
// imp the document's Importance (negative counts as 0), a its AccessCount,
// age the time since its Time (a zero Time has recency 0, a future one 1).
// Every term lies in [0,1].
//
// The zero value ranks by relevance alone (Relevance 1, others 0), which is
// what a plain search engine does; DefaultRerank suits conversational memory.
type RerankWeights struct {
	Relevance  float64
	Recency    float64
	Importance float64
	Access     float64
	// HalfLife of the recency signal; 0 selects 7 days.
	HalfLife time.Duration
}

// DefaultRerank is a starting point for agent memory: mostly relevance, with
// a preference for recent, important and often-used memories.
var DefaultRerank = RerankWeights{Relevance: 0.7, Recency: 0.15, Importance: 0.1, Access: 0.05, HalfLife: 7 * 24 * time.Hour}

func (w RerankWeights) isZero() bool {
	return w.Relevance == 0 && w.Recency == 0 && w.Importance == 0 && w.Access == 0
}

// Options configure an Index. The zero value is valid: every field documents
// the default its zero value selects (New applies EnsureDefaults and
// Validate).
type Options struct {
	// Embedder turns texts into vectors. nil selects the offline
	// NewHashEmbedder(HashOptions{}).
	Embedder Embedder

	// K1 is BM25's term-frequency saturation; 0 selects 0.9.
	K1 float64
	// B is BM25's length normalisation in (0,1]; 0 selects 0.4. (K1 0.9
	// and B 0.4 are Anserini's defaults; on LoCoMo's short turns they beat
	// 1.2/0.75 by about a point at R@5.)
	B float64

	// Fusion selects the hybrid fusion; the zero value is FusionWeighted.
	Fusion Fusion
	// VectorWeight is the vector side's share in hybrid fusion, in (0,1);
	// BM25 gets 1-VectorWeight. 0 selects 0.15 (tuned on LoCoMo with the
	// offline embedder, whose signal overlaps BM25's; a model embedder
	// deserves more, around 0.5).
	VectorWeight float64
	// GraphWeight is the entity graph's share in hybrid fusion when a
	// graph is attached (Index.SetGraph), added to BM25's and the vectors'
	// (the fused relevance is then divided by the best candidate's, as
	// always). 0 selects 0.2; negative never fuses the graph.
	GraphWeight float64
	// RRFK is the rank offset of reciprocal rank fusion; 0 selects 60.
	RRFK float64
	// Candidates is how deep each retriever is read before fusion and
	// reranking (at least k); 0 selects 100.
	Candidates int

	// Rerank weighs the final ranking; the zero value ranks by relevance.
	Rerank RerankWeights
	// Now is the clock for recency; nil selects time.Now.
	Now func() time.Time

	// M is the HNSW graph degree; 0 selects 16.
	M int
	// EfSearch is the HNSW search (and construction) beam width; 0 selects
	// 100.
	EfSearch int
	// Seed seeds HNSW level generation, so a build is reproducible; 0
	// selects 1.
	Seed int64
	// ExactBelow: while the index holds at most this many vectors, vector
	// search scans all of them instead of walking the HNSW graph, and no
	// graph is built. 0 selects 20000 (a 512-dimension scan of that many
	// takes a few milliseconds); negative always uses the graph.
	//
	// The scan is exact; the graph is not, and coder/hnsw v0.6.1's walk is
	// weak: its search stops at the first expansion that does not improve
	// the best distance, so recall@10 against the exact scan is low on
	// near-orthogonal vectors such as the offline embedder's (LoCoMo vector
	// R@5 drops from 58 to 32 with the graph forced; EfSearch 400 gets 50).
	// Hybrid search is barely affected because every fused candidate is
	// rescored exactly (see Index.Search).
	ExactBelow int
	// CompactRatio: deleted and replaced documents stay as tombstones until
	// they exceed this fraction of the live ones (and 64 documents), then the
	// index is rebuilt without them. 0 selects 0.5.
	CompactRatio float64
	// MaxQueryTerms bounds the distinct terms of a BM25 query, so a hostile
	// query costs bounded time; 0 selects 64.
	MaxQueryTerms int
	// QueryTimeout bounds the embedding of a search's query (hybrid and
	// vector modes; a remote embedder): past it the search fails with
	// ErrEmbed, and memory recalls by words for that turn. 0 selects
	// 500 ms (the design's alert on recall time), negative leaves only the
	// caller's context. The offline embedder never waits.
	QueryTimeout time.Duration
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. New calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.Embedder == nil {
		o.Embedder = NewHashEmbedder(HashOptions{})
	}
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.K1, 0.9)
	def(&o.B, 0.4)
	def(&o.VectorWeight, 0.15)
	def(&o.RRFK, 60)
	def(&o.GraphWeight, 0.2)
	defInt(&o.Candidates, 100)
	if o.Rerank.isZero() {
		o.Rerank.Relevance = 1
	}
	if o.Rerank.HalfLife == 0 {
		o.Rerank.HalfLife = 7 * 24 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	defInt(&o.M, 16)
	defInt(&o.EfSearch, 100)
	if o.Seed == 0 {
		o.Seed = 1
	}
	defInt(&o.ExactBelow, 20000)
	def(&o.CompactRatio, 0.5)
	defInt(&o.MaxQueryTerms, 64)
	if o.QueryTimeout == 0 {
		o.QueryTimeout = 500 * time.Millisecond
	}
	return o
}

// Validate checks options after EnsureDefaults; its errors match ErrInvalid.
func (o *Options) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("index: options: "+format+": %w", append(args, ErrInvalid)...)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(o.K1) || o.K1 < 0:
		return bad("K1 %v", o.K1)
	case !finite(o.B) || o.B < 0 || o.B > 1:
		return bad("B %v not in [0,1]", o.B)
	case o.Fusion != FusionWeighted && o.Fusion != FusionRRF:
		return bad("unknown fusion %d", int(o.Fusion))
	case !finite(o.VectorWeight) || o.VectorWeight <= 0 || o.VectorWeight >= 1:
		return bad("VectorWeight %v not in (0,1)", o.VectorWeight)
	case !finite(o.GraphWeight) || o.GraphWeight > 10:
		return bad("GraphWeight %v", o.GraphWeight)
	case !finite(o.RRFK) || o.RRFK <= 0:
		return bad("RRFK %v", o.RRFK)
	case o.Candidates < 1:
		return bad("Candidates %d", o.Candidates)
	case o.M < 2:
		return bad("M %d", o.M)
	case o.EfSearch < 1:
		return bad("EfSearch %d", o.EfSearch)
	case !finite(o.CompactRatio) || o.CompactRatio <= 0:
		return bad("CompactRatio %v", o.CompactRatio)
	case o.MaxQueryTerms < 1:
		return bad("MaxQueryTerms %d", o.MaxQueryTerms)
	case o.Rerank.HalfLife < 0:
		return bad("Rerank.HalfLife %v", o.Rerank.HalfLife)
	}
	for _, w := range []float64{o.Rerank.Relevance, o.Rerank.Recency, o.Rerank.Importance, o.Rerank.Access} {
		if !finite(w) || w < 0 {
			return bad("rerank weight %v", w)
		}
	}
	return nil
}
