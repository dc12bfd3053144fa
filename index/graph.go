package index

import (
	"cmp"
	"slices"
	"strings"
)

// Link is one triple of a knowledge graph: Subject and Object are entities
// (named by their index terms, so "Caroline's" and "caroline" are one
// entity), Predicate relates them, Docs are the ids of the documents that
// support it.
type Link struct {
	Subject, Predicate, Object string
	Docs                       []string
}

// EntityGraph is the third retriever: the entities a query names (runs of
// its terms equal to a link's subject or object) lead to their links, and
// one hop further to the links of the entities those name, and the links
// to the documents that support them. Build it with NewEntityGraph and
// attach it with Index.SetGraph; it is immutable, so one graph may be read
// by many searches at once.
type EntityGraph struct {
	links    []graphLink
	byEntity map[string][]int32 // entity key → links naming it (at most maxEntityLinks)
	df       map[string]int     // term → links holding it
	maxGram  int                // the longest entity, in terms (≤ maxEntityTerms)
}

type graphLink struct {
	subj, obj string   // entity keys
	terms     []string // distinct terms of subject, predicate and object
	docs      []string
}

// Bounds of the graph and of one graph search, so a hostile or huge
// knowledge base costs bounded work per query.
const (
	maxGraphLinks  = 1 << 16 // links kept by NewEntityGraph
	maxEntityTerms = 4       // an entity longer than this is never matched
	maxEntityLinks = 64      // links followed from one entity (a hub is capped)
	maxHopSeeds    = 8       // best first-hop links whose entities are expanded
	hopDecay       = 0.5     // a second-hop link's share of its seed's score
)

// entityKey is the entity's identity: its index terms joined by spaces.
func entityKey(s string) string { return strings.Join(tokenize(s), " ") }

// NewEntityGraph builds the graph of links (the first maxGraphLinks with
// a subject or object and a document).
func NewEntityGraph(links []Link) *EntityGraph {
	g := &EntityGraph{byEntity: map[string][]int32{}, df: map[string]int{}}
	for _, l := range links {
		if len(g.links) == maxGraphLinks {
			break
		}
		gl := graphLink{subj: entityKey(l.Subject), obj: entityKey(l.Object), docs: slices.Compact(slices.Sorted(slices.Values(l.Docs)))}
		if gl.subj == "" && gl.obj == "" || len(gl.docs) == 0 {
			continue
		}
		gl.terms = slices.Compact(slices.Sorted(slices.Values(tokenize(l.Subject + " " + l.Predicate + " " + l.Object))))
		i := int32(len(g.links))
		g.links = append(g.links, gl)
		for _, t := range gl.terms {
			g.df[t]++
		}
		for _, e := range []string{gl.subj, gl.obj} {
			if e == "" || len(g.byEntity[e]) >= maxEntityLinks || slices.Contains(g.byEntity[e], i) {
				continue
			}
			g.byEntity[e] = append(g.byEntity[e], i)
			g.maxGram = max(g.maxGram, min(strings.Count(e, " ")+1, maxEntityTerms))
		}
	}
	return g
}

// Len returns the number of links.
func (g *EntityGraph) Len() int { return len(g.links) }

// graphHit is a document the graph reached, with its score.
type graphHit struct {
	id    string
	score float64
}

// search returns up to n documents reached from the entities of the query
// terms toks (in query order), best first. A link's score is the IDF (over
// links) of the query terms it holds, so a link that names the entity and
// also what the query asks about outranks one that only names the entity;
// a second-hop link adds hopDecay of its seed's score. A document scores its
// best link's score.
func (g *EntityGraph) search(toks []string, n int) []graphHit {
	if g == nil || len(g.links) == 0 || len(toks) == 0 || n < 1 {
		return nil
	}
	qset := map[string]bool{}
	for _, t := range toks {
		qset[t] = true
	}
	// linkScore is the IDF (over links) of the query terms the link holds
	// beyond the terms of the entity it was reached by (via): a link that
	// only names the entity says nothing about what the query asks.
	linkScore := func(l *graphLink, via []string) float64 {
		var s float64
		for _, t := range l.terms {
			if qset[t] && !slices.Contains(via, t) {
				s += idf(len(g.links), g.df[t])
			}
		}
		return s
	}
	score := map[int32]float64{}
	seen := map[string]bool{}
	for i := range toks {
		for L := 1; L <= g.maxGram && i+L <= len(toks); L++ {
			key := strings.Join(toks[i:i+L], " ")
			if seen[key] {
				continue
			}
			seen[key] = true
			for _, li := range g.byEntity[key] {
				score[li] = max(score[li], linkScore(&g.links[li], toks[i:i+L]))
			}
		}
	}
	if len(score) == 0 {
		return nil
	}
	// Second hop: from the best first-hop links, the links of the entity at
	// their other end (the entity the query did not name).
	seeds := make([]int32, 0, len(score))
	for li := range score {
		seeds = append(seeds, li)
	}
	slices.SortFunc(seeds, func(a, b int32) int {
		if c := cmp.Compare(score[b], score[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	hop := map[int32]float64{}
	for _, li := range seeds[:min(len(seeds), maxHopSeeds)] {
		l := &g.links[li]
		for _, e := range []string{l.subj, l.obj} {
			if e == "" || seen[e] {
				continue
			}
			via := strings.Fields(e)
			for _, lj := range g.byEntity[e] {
				if _, ok := score[lj]; ok {
					continue
				}
				// Only a link that holds more of the query than its
				// entity is worth the hop.
				if own := linkScore(&g.links[lj], via); own > 0 {
					hop[lj] = max(hop[lj], hopDecay*score[li]+own)
				}
			}
		}
	}
	for lj, s := range hop {
		score[lj] = s
	}
	docs := map[string]float64{}
	for li, s := range score {
		if s <= 0 {
			continue
		}
		for _, d := range g.links[li].docs {
			docs[d] = max(docs[d], s)
		}
	}
	out := make([]graphHit, 0, len(docs))
	for d, s := range docs {
		out = append(out, graphHit{d, s})
	}
	slices.SortFunc(out, func(a, b graphHit) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return out[:min(len(out), n)]
}

// SetGraph attaches g as the index's third retriever (nil detaches it):
// hybrid searches then fuse the documents it reaches with the BM25 and
// vector lists, weighted by Options.GraphWeight, before the rerank. Graph
// documents the index does not hold are ignored.
func (x *Index) SetGraph(g *EntityGraph) {
	x.mu.Lock()
	x.entities = g
	x.mu.Unlock()
}

// GraphReach returns the ids of at most n documents the attached graph
// reaches from the entities query names (nil without a graph or with
// fusion off): what a caller re-showing earlier hits may keep as relevant
// though they share no word with the query beyond the entity.
func (x *Index) GraphReach(query string, n int) map[string]bool {
	if x.opts.GraphWeight <= 0 {
		return nil
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	hits := x.entities.retrieve(query, n, x.opts.Candidates, x.ids, x.docs, nil)
	if len(hits) == 0 {
		return nil
	}
	out := make(map[string]bool, len(hits))
	for _, h := range hits {
		out[x.docs[h.slot].doc.ID] = true
	}
	return out
}

// retrieve returns the n best documents g reaches from query, by slot,
// among those the index holds (ids, docs: the index's, under its lock) and
// keep accepts (nil: all); nil when g is nil. It reads extra documents
// beyond n from g to make up for those it skips.
func (g *EntityGraph) retrieve(query string, n, extra int, ids map[string]uint32, docs []*entry, keep func(string) bool) []scored {
	if g == nil {
		return nil
	}
	hits := g.search(tokenize(query), n+extra)
	out := make([]scored, 0, min(len(hits), n))
	for _, h := range hits {
		if len(out) == n {
			break
		}
		slot, ok := ids[h.id]
		if ok && docs[slot] != nil && (keep == nil || keep(h.id)) {
			out = append(out, scored{slot: slot, score: h.score})
		}
	}
	return out
}
