package index

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// embedding is the index's side of its Embedder: it embeds documents
// before an update takes the lock (prepare), and queries before a search
// takes it, bounded by Options.QueryTimeout (query), or under it for an
// embedder that weighs the query by the index's IDF (weighted). It checks
// what the embedder returns and normalises it.
//
// It is set by New and never changed, so it is used without Index.mu;
// spaces and weighter are the embedder itself when it implements those
// interfaces, else nil.
type embedding struct {
	Embedder
	spaces       SpaceEmbedder
	weighter     queryWeighter
	queryTimeout time.Duration
}

func newEmbedding(o Options) embedding {
	m := embedding{Embedder: o.Embedder, queryTimeout: o.QueryTimeout}
	m.spaces, _ = o.Embedder.(SpaceEmbedder)
	m.weighter, _ = o.Embedder.(queryWeighter)
	return m
}

// space is the embedder's current vector space ("" when it has none or
// it is not known).
func (m *embedding) space() string {
	if m.spaces == nil {
		return ""
	}
	return m.spaces.Space()
}

// embed calls the embedder and returns normalised copies (nil for zero
// vectors), checking count and dimension, and the space they are in ("" for
// an embedder that is not a SpaceEmbedder).
func (m *embedding) embed(ctx context.Context, texts []string) ([][]float32, string, error) {
	var vecs [][]float32
	var space string
	var err error
	if m.spaces != nil {
		vecs, space, err = m.spaces.EmbedSpace(ctx, texts)
	} else {
		vecs, err = m.Embed(ctx, texts)
	}
	if err != nil {
		if errors.Is(err, ErrEmbed) {
			return nil, "", fmt.Errorf("index: embed %d texts with %s: %w", len(texts), m.Name(), err)
		}
		return nil, "", fmt.Errorf("index: embed %d texts with %s: %w: %w", len(texts), m.Name(), ErrEmbed, err)
	}
	if len(vecs) != len(texts) {
		return nil, "", fmt.Errorf("index: embedder %s returned %d vectors for %d texts: %w", m.Name(), len(vecs), len(texts), ErrEmbed)
	}
	out := make([][]float32, len(vecs))
	for i, v := range vecs {
		if len(v) == 0 {
			return nil, "", fmt.Errorf("index: embedder %s returned an empty vector: %w", m.Name(), ErrEmbed)
		}
		if i > 0 && len(v) != len(vecs[0]) {
			return nil, "", fmt.Errorf("index: embedder %s returned dimensions %d and %d: %w", m.Name(), len(vecs[0]), len(v), ErrEmbed)
		}
		out[i] = normalizedCopy(v)
	}
	return out, space, nil
}

// prepare validates docs, embeds those without vectors and tokenizes them;
// it takes no lock. It returns the space the vectors it made are in.
func (m *embedding) prepare(ctx context.Context, docs []Doc, dedupe bool) ([]*entry, vecSpace, error) {
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
		vecs, space, err := m.embed(ctx, texts)
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

// query embeds a search's query, bounded by QueryTimeout, and returns the
// space it is in; it returns nil for an embedder that weighs the query by
// the index's IDF, which weighted embeds under the lock.
func (m *embedding) query(ctx context.Context, q string) ([]float32, string, error) {
	if m.weighter != nil {
		return nil, "", nil
	}
	if m.queryTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.queryTimeout)
		defer cancel()
	}
	vecs, space, err := m.embed(ctx, []string{q})
	if err != nil {
		return nil, "", err
	}
	return vecs[0], space, nil
}

// weighs reports whether the embedder weighs queries by the index's IDF
// (see weighted).
func (m *embedding) weighs() bool { return m.weighter != nil }

// weighted embeds q with its terms weighted by idf, normalised (nil when
// zero); only for an embedder that weighs.
func (m *embedding) weighted(q string, idf func(term string) float64) []float32 {
	return normalizedCopy(m.weighter.EmbedWeighted(q, idf))
}

// vecSpace describes the vectors an update made: their embedding space
// (SpaceEmbedder; "" otherwise) and dimension (0 when all were zero).
// fresh is false when the update embedded nothing.
type vecSpace struct {
	space string
	dim   int
	fresh bool
}

// differs reports whether vectors of space and dim cannot sit beside the
// stored ones: another space or another dimension (the embedder's model
// changed). It is false while no vector is stored.
func (v *vectors) differs(space string, dim int) bool {
	return v.live > 0 && ((space != "" && v.space != "" && space != v.space) || (dim != 0 && v.dim != 0 && dim != v.dim))
}

// staleFor reports whether the vectors an update made (sp) cannot sit
// beside the stored ones.
func (v *vectors) staleFor(sp vecSpace) bool {
	return sp.fresh && v.differs(sp.space, sp.dim)
}

// adoptSpace records the space of vectors just inserted.
func (v *vectors) adoptSpace(sp vecSpace) {
	if sp.fresh && sp.space != "" {
		v.space = sp.space
	}
}

// Stale reports whether the stored vectors are of another space than the
// one the embedder (a SpaceEmbedder) answers in now: searches fail with
// ErrEmbed until an Add, Upsert or Reembed embeds every document again.
// It sends nothing.
func (x *Index) Stale() bool {
	if x.emb.spaces == nil {
		return false
	}
	now, dim := x.emb.spaces.Space(), x.emb.Dim()
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.vec.differs(now, dim)
}

// Reembed embeds every document again and replaces the vectors at once
// (see Stale); on error nothing changes.
func (x *Index) Reembed(ctx context.Context) error {
	return x.reembed(ctx, nil, false)
}

// reembed replaces the contents with the live documents (none when all),
// entries applied over them, every vector embedded again: the embedder
// moved to another space. Embedding runs without the lock; when the index
// changed meanwhile it starts again (three times at most). On error nothing
// changes.
func (x *Index) reembed(ctx context.Context, entries []*entry, all bool) error {
	for range 3 {
		x.mu.RLock()
		ver := x.ver
		var docs []*entry
		if !all {
			replaced := make(map[string]bool, len(entries))
			for _, e := range entries {
				replaced[e.doc.ID] = true
			}
			for _, e := range x.docs {
				if e != nil && !replaced[e.doc.ID] {
					docs = append(docs, e)
				}
			}
		}
		x.mu.RUnlock()
		docs = append(docs, entries...)
		texts := make([]string, len(docs))
		for i, e := range docs {
			texts[i] = e.doc.Text
		}
		var vecs [][]float32
		var space string
		if len(texts) > 0 {
			var err error
			if vecs, space, err = x.emb.embed(ctx, texts); err != nil {
				return fmt.Errorf("index: re-embed for a new embedding space: %w", err)
			}
		}
		next := make([]*entry, len(docs))
		dim := 0
		for i, e := range docs {
			c := *e
			c.doc.Vector, c.fresh = vecs[i], false
			if dim == 0 {
				dim = len(vecs[i])
			}
			next[i] = &c
		}
		x.mu.Lock()
		if x.ver != ver {
			x.mu.Unlock()
			continue
		}
		x.reset()
		x.vec.dim, x.vec.space = dim, space
		x.load(next)
		x.vec.reembeds++
		x.mu.Unlock()
		return nil
	}
	return fmt.Errorf("index: re-embed for a new embedding space: the index kept changing: %w", ErrEmbed)
}
