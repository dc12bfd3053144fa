package index

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

func TestEntityGraphSearch(t *testing.T) {
	g := NewEntityGraph([]Link{
		{"Caroline", "researched", "adoption agencies", []string{"d1"}},
		{"Caroline", "mentions", "Melanie", []string{"d2"}},
		{"Melanie", "paints", "sunsets", []string{"d3"}},
		{"Melanie", "has", "kids", []string{"d4", "d4"}},
		{"Bob", "likes", "chess", []string{"d5"}},
		{"", "", "", []string{"d6"}},        // no entity: dropped
		{"Nobody", "x", "y", []string(nil)}, // no document: dropped
	})
	if g.Len() != 5 {
		t.Fatalf("Len = %d, want 5", g.Len())
	}
	f := func(q string, want ...string) {
		t.Helper()
		var got []string
		for _, h := range g.search(Tokenize(q), 10) {
			got = append(got, h.id)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("search(%q) = %v, want %v", q, got, want)
		}
	}
	// The entity alone reaches nothing: its links must hold more of the
	// query than the entity.
	f("Caroline?")
	f("What did Caroline research?", "d1")
	// Two hops: Caroline → Melanie (named by the link, not the query) →
	// what Melanie paints.
	f("What does Caroline's friend paint?", "d3")
	f("Melanie kids", "d4")
	f("chess and kids", nil...)
	f("", nil...)
	var nilGraph *EntityGraph
	if nilGraph.search(Tokenize("Caroline research"), 3) != nil {
		t.Fatal("a nil graph found something")
	}
}

func TestEntityGraphBoundsHubs(t *testing.T) {
	var links []Link
	for i := range 3 * maxEntityLinks {
		links = append(links, Link{"Hub", "visited", fmt.Sprintf("place%d", i), []string{fmt.Sprintf("d%d", i)}})
	}
	g := NewEntityGraph(links)
	if n := len(g.byEntity["hub"]); n != maxEntityLinks {
		t.Fatalf("hub has %d links followed, want %d", n, maxEntityLinks)
	}
	if hits := g.search(Tokenize("where has hub visited"), 1000); len(hits) != maxEntityLinks {
		t.Fatalf("%d hits, want %d", len(hits), maxEntityLinks)
	}
}

// TestSearchFusesTheGraph checks the third retriever: a document that
// shares no word with the query comes back through the graph, only in
// hybrid mode, and not once the graph is detached or given no weight.
func TestSearchFusesTheGraph(t *testing.T) {
	ctx := context.Background()
	for _, gw := range []float64{0, -1} {
		x := newTestIndex(t, Options{GraphWeight: gw},
			"the weather was lovely on the coast",
			"she paints sunsets every weekend",
			"Caroline met her friend Melanie at the gallery")
		x.SetGraph(NewEntityGraph([]Link{
			{"Caroline", "friend of", "Melanie", []string{"d2"}},
			{"Melanie", "hobby", "painting", []string{"d1"}},
			{"Melanie", "hobby", "painting", []string{"gone"}}, // unknown document: ignored
		}))
		q := "Caroline friend hobby"
		hits, err := x.Search(ctx, q, 3, ModeHybrid)
		if err != nil {
			t.Fatal(err)
		}
		if graphFound(hits, "d1") != (gw == 0) {
			t.Fatalf("GraphWeight %v: hybrid hits %v", gw, ids(hits))
		}
		for _, h := range hits {
			if gw == 0 && h.ID == "d1" && (h.Graph <= 0 || h.BM25 != 0) {
				t.Fatalf("graph hit %+v", h)
			}
		}
		if bm, _ := x.Search(ctx, q, 3, ModeBM25); graphFound(bm, "d1") || slices.Contains(ids(bm), "d1") {
			t.Fatalf("bm25 mode used the graph: %v", ids(bm))
		}
		// Filtered out documents stay out.
		kept, _ := x.SearchFunc(ctx, q, 3, ModeHybrid, func(id string) bool { return id != "d1" })
		if slices.Contains(ids(kept), "d1") {
			t.Fatalf("keep ignored: %v", ids(kept))
		}
		// GraphReach names what the graph reaches, only while it is used.
		if r := x.GraphReach(q, 10); r["d1"] != (gw == 0) || r["gone"] {
			t.Fatalf("GraphWeight %v: GraphReach %v", gw, r)
		}
		x.SetGraph(nil)
		if r := x.GraphReach(q, 10); r != nil {
			t.Fatalf("detached graph reaches %v", r)
		}
		if hits, _ = x.Search(ctx, q, 3, ModeHybrid); graphFound(hits, "d1") {
			t.Fatalf("detached graph still used: %v", ids(hits))
		}
	}
}

// graphFound reports whether id is among hits by the graph's doing.
func graphFound(hits []Hit, id string) bool {
	for _, h := range hits {
		if h.ID == id && h.Graph > 0 {
			return true
		}
	}
	return false
}
