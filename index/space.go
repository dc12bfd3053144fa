package index

import (
	"context"
	"fmt"
)

// vecSpace describes the vectors an update made: their embedding space
// (SpaceEmbedder; "" otherwise) and dimension (0 when all were zero).
// fresh is false when the update embedded nothing.
type vecSpace struct {
	space string
	dim   int
	fresh bool
}

// staleFor reports whether vectors of sp cannot sit beside the stored ones:
// another space or another dimension (the embedder's model changed).
// x.mu must be held.
func (x *Index) staleFor(sp vecSpace) bool {
	if !sp.fresh || x.vecLive == 0 {
		return false
	}
	return (sp.space != "" && x.space != "" && sp.space != x.space) || (sp.dim != 0 && x.dim != 0 && sp.dim != x.dim)
}

// adoptSpace records the space of vectors just inserted; x.mu must be held.
func (x *Index) adoptSpace(sp vecSpace) {
	if sp.fresh && sp.space != "" {
		x.space = sp.space
	}
}

// Stale reports whether the stored vectors are of another space than the
// one the embedder (a SpaceEmbedder) answers in now: searches fail with
// ErrEmbed until an Add, Upsert or Reembed embeds every document again.
// It sends nothing.
func (x *Index) Stale() bool {
	se, ok := x.emb.(SpaceEmbedder)
	if !ok {
		return false
	}
	now, dim := se.Space(), se.Dim()
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.vecLive > 0 && ((now != "" && x.space != "" && now != x.space) || (dim != 0 && x.dim != 0 && dim != x.dim))
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
			if vecs, space, err = x.embed(ctx, texts); err != nil {
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
		x.dim, x.space = dim, space
		x.load(next)
		x.reembeds++
		x.mu.Unlock()
		return nil
	}
	return fmt.Errorf("index: re-embed for a new embedding space: the index kept changing: %w", ErrEmbed)
}
