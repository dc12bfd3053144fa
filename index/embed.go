package index

import (
	"context"
	"fmt"
	"math"
	"sync"
)

// Embedder turns texts into vectors of one fixed dimension. Implementations
// are safe for concurrent use. Embed returns one vector per text, in order;
// the index L2-normalises whatever it gets. Name identifies the vector space
// (model and dimension): vectors from embedders with different names are
// never mixed, and a persisted index written under another name is rebuilt.
type Embedder interface {
	Embed(ctx context.Context, texts []string) ([][]float32, error)
	Dim() int
	Name() string
}

// SpaceEmbedder is an Embedder whose vector space can change while it runs:
// a remote model the server was restarted with, possibly of another
// dimension. EmbedSpace is Embed that also names the space all the
// returned vectors are in; Space names the current one ("" until known).
// An Index never compares vectors of two spaces: when its embedder answers
// in another space than its stored vectors', it re-embeds its documents
// (see Index.Upsert), and Load refuses a file of another space.
type SpaceEmbedder interface {
	Embedder
	EmbedSpace(ctx context.Context, texts []string) ([][]float32, string, error)
	Space() string
}

// HashOptions configure the offline embedder. The zero value is valid:
// every field documents the default its zero value selects
// (NewHashEmbedder applies EnsureDefaults; nothing is refused).
type HashOptions struct {
	// Dim is the vector dimension; 0 (or negative) selects 512.
	Dim int
	// BigramWeight is the weight of word-bigram features relative to
	// unigrams; 0 (the default) leaves them out: on LoCoMo they cost about
	// two points of recall at 512 dimensions (more collisions, little
	// phrase signal in chat).
	BigramWeight float64
	// TrigramWeight is the total weight of a term's character trigrams
	// relative to the term itself; 0 selects 0.6, negative disables them.
	TrigramWeight float64
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. NewHashEmbedder calls it; calling it twice changes nothing.
func (o *HashOptions) EnsureDefaults() *HashOptions {
	if o.Dim <= 0 {
		o.Dim = 512
	}
	if o.TrigramWeight == 0 {
		o.TrigramWeight = hashTrigramW
	}
	return o
}

// HashEmbedder is the built-in offline embedder: no model, no network,
// deterministic, a few microseconds per sentence. It is a feature-hashing
// ("hashing trick") bag of
//
//   - stemmed word unigrams (weight 1), the same terms BM25 indexes,
//   - optionally, adjacent word bigrams after stopword removal
//     (HashOptions.BigramWeight), which reward matching phrases,
//   - character trigrams of each term with boundary marks, "^cam", "cam",
//     "amp", "mp$" (total weight hashTrigramW per term, spread evenly), which
//     match spelling variants and compounds the stemmer misses,
//
// each with sublinear term frequency 1+ln(tf), hashed with a sign bit into Dim
// buckets and L2-normalised, so cosine similarity is a dot product. It is a
// lexical model: it does not know that "car" and "automobile" are related;
// it complements BM25 with softer matching and is the default so a fresh
// machine and CI work. Safe for concurrent use; the zero value is not usable,
// call NewHashEmbedder.
type HashEmbedder struct {
	dim      int
	name     string
	bigramW  float32
	trigramW float32
	pool     sync.Pool // of *hashScratch
}

// hashTrigramW is the default trigram weight (HashOptions.TrigramWeight);
// LoCoMo recall varied by under a point between 0.3 and 1.5.
const hashTrigramW = 0.6

type hashScratch struct {
	counts map[uint64]uint32
	toks   []string
}

// NewHashEmbedder returns the offline embedder.
func NewHashEmbedder(o HashOptions) *HashEmbedder {
	o.EnsureDefaults()
	weight := func(w float64) float32 { // negative or NaN: off
		if w < 0 || math.IsNaN(w) {
			return 0
		}
		return float32(w)
	}
	bw, tw := weight(o.BigramWeight), weight(o.TrigramWeight)
	name := fmt.Sprintf("hash-v1-d%d", o.Dim)
	if bw != 0 || tw != hashTrigramW {
		name = fmt.Sprintf("hash-v1-d%d-b%g-t%g", o.Dim, bw, tw)
	}
	return &HashEmbedder{
		dim:      o.Dim,
		name:     name,
		bigramW:  bw,
		trigramW: tw,
		pool: sync.Pool{New: func() any {
			return &hashScratch{counts: make(map[uint64]uint32, 64)}
		}},
	}
}

// Dim returns the vector dimension.
func (e *HashEmbedder) Dim() int { return e.dim }

// Name returns "hash-v1-d<Dim>".
func (e *HashEmbedder) Name() string { return e.name }

// Embed returns one L2-normalised vector per text (all zeros for a text
// without terms). It fails only when ctx is done.
func (e *HashEmbedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	backing := make([]float32, len(texts)*e.dim)
	for i, t := range texts {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("index: hash embed: %w", err)
			}
		}
		v := backing[i*e.dim : (i+1)*e.dim : (i+1)*e.dim]
		e.embedInto(v, t)
		out[i] = v
	}
	return out, nil
}

// EmbedWeighted embeds a query with each term's features scaled by
// weight(term) (and a bigram by the mean of its terms' weights), without
// sublinear tf. The Index passes its corpus IDF here, so rare query terms
// count more, as in BM25, while document vectors stay independent of the
// corpus. The result is L2-normalised.
func (e *HashEmbedder) EmbedWeighted(text string, weight func(term string) float64) []float32 {
	v := make([]float32, e.dim)
	s := e.pool.Get().(*hashScratch)
	defer func() {
		s.toks = s.toks[:0]
		e.pool.Put(s)
	}()
	s.toks = AppendTokens(s.toks[:0], text)
	add := func(key uint64, w float32) {
		h := mix(key)
		idx := int(h % uint64(len(v)))
		if h>>63 == 1 {
			v[idx] -= w
		} else {
			v[idx] += w
		}
	}
	var prev uint64
	var prevW float32
	for i, t := range s.toks {
		w := float32(weight(t))
		if !(w > 0) || math.IsInf(float64(w), 0) {
			w = 0
		}
		h := hashString(fnvOffset, t)
		add((h&^3)|featUnigram, w)
		if i > 0 && e.bigramW > 0 {
			add((mix(prev^(h*0x9E3779B97F4A7C15))&^3)|featBigram, e.bigramW*(w+prevW)/2)
		}
		prev, prevW = h, w
		if e.trigramW > 0 && len(t) > 0 {
			share := uint64(math.Round(255 / math.Sqrt(float64(len(t)))))
			tw := w * e.trigramW * float32(max(share, 1)) / 255
			var buf [maxTokenBytes + 2 + 8]byte
			b := append(buf[:0], '^')
			b = append(b, t...)
			b = append(b, '$')
			for j := 0; j+3 <= len(b); j++ {
				add(hashBytes(fnvOffset^0xC3A5C85C97CB3127, b[j:j+3])<<10>>10, tw)
			}
		}
	}
	normalize(v)
	return v
}

// Feature kinds live in the low two bits of a feature key.
const (
	featUnigram = 0
	featBigram  = 1
	featTrigram = 2
)

func (e *HashEmbedder) embedInto(v []float32, text string) {
	s := e.pool.Get().(*hashScratch)
	defer func() {
		clear(s.counts)
		s.toks = s.toks[:0]
		e.pool.Put(s)
	}()
	s.toks = AppendTokens(s.toks[:0], text)
	// Every feature is counted first so term frequency can be sublinear;
	// the feature kind (and a trigram's weight share) is packed in the key.
	var prev uint64
	for i, t := range s.toks {
		h := hashString(fnvOffset, t)
		s.counts[(h&^3)|featUnigram]++
		if i > 0 && e.bigramW > 0 {
			s.counts[(mix(prev^(h*0x9E3779B97F4A7C15))&^3)|featBigram]++
		}
		prev = h
		if e.trigramW > 0 {
			s.addTrigrams(t)
		}
	}
	for key, n := range s.counts {
		tf := 1 + float32(math.Log(float64(n)))
		var w float32
		switch key & 3 {
		case featUnigram:
			w = 1
		case featBigram:
			w = e.bigramW
		case featTrigram:
			w = e.trigramW * float32(key>>2&0xFF) / 255 // see addTrigrams
			key >>= 10
		}
		h := mix(key)
		idx := int(h % uint64(len(v)))
		if h>>63 == 1 {
			v[idx] -= w * tf
		} else {
			v[idx] += w * tf
		}
	}
	normalize(v)
}

// addTrigrams counts the boundary-marked character trigrams of term t.
// The key packs the trigram hash (bits 10..63), the term's weight share
// (bits 2..9, in 1/255ths) and the kind (bits 0..1).
func (s *hashScratch) addTrigrams(t string) {
	n := len(t) // "^" + t + "$" has len(t) trigrams
	if n == 0 {
		return
	}
	share := uint64(math.Round(255 / math.Sqrt(float64(n))))
	if share == 0 {
		share = 1
	}
	var buf [maxTokenBytes + 2 + 8]byte
	b := append(buf[:0], '^')
	b = append(b, t...)
	b = append(b, '$')
	for i := 0; i+3 <= len(b); i++ {
		h := hashBytes(fnvOffset^0xC3A5C85C97CB3127, b[i:i+3])
		s.counts[(h<<10)|(share<<2)|featTrigram]++
	}
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func hashString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

func hashBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}

// mix is the murmur3 finaliser: it spreads FNV's weak low bits.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// normalize scales v to unit L2 norm in place; a zero vector stays zero.
func normalize(v []float32) {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if ss == 0 || math.IsNaN(ss) || math.IsInf(ss, 0) {
		clear(v)
		return
	}
	inv := float32(1 / math.Sqrt(ss))
	for i := range v {
		v[i] *= inv
	}
}
