package index

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"
)

var ctx = context.Background()

var pets = []string{
	"Melanie took the kids camping at the beach last weekend",
	"Caroline went to an LGBTQ support group yesterday",
	"We painted a sunrise over the lake together",
	"My dog loves long walks in the forest",
	"Caroline is researching adoption agencies",
}

func TestSearchModesFindTheMatchingDocument(t *testing.T) {
	x := newTestIndex(t, Options{}, pets...)
	for _, mode := range []Mode{ModeBM25, ModeVector, ModeHybrid} {
		hits, err := x.Search(ctx, "When did Melanie go camping?", 3, mode)
		if err != nil {
			t.Fatal(err)
		}
		if len(hits) == 0 || hits[0].ID != "d0" {
			t.Errorf("%v: hits %v, want d0 first", mode, ids(hits))
		}
		for i := 1; i < len(hits); i++ {
			if hits[i].Score > hits[i-1].Score {
				t.Errorf("%v: scores not descending: %v", mode, hits)
			}
		}
		if hits[0].Relevance != 1 {
			t.Errorf("%v: best relevance %v, want 1", mode, hits[0].Relevance)
		}
		if hits[0].Text != pets[0] {
			t.Errorf("%v: text %q", mode, hits[0].Text)
		}
	}
	// Stemming joins "research" and "researching".
	hits, _ := x.Search(ctx, "research adoption", 1, ModeBM25)
	if len(hits) != 1 || hits[0].ID != "d4" {
		t.Errorf("research adoption: %v", ids(hits))
	}
	// BM25 never matches documents without a query term.
	hits, _ = x.Search(ctx, "camping", 10, ModeBM25)
	if !slices.Equal(ids(hits), []string{"d0"}) {
		t.Errorf("camping: %v", ids(hits))
	}
	if hits, _ := x.Search(ctx, "the and of", 10, ModeBM25); len(hits) != 0 {
		t.Errorf("stopword query: %v", ids(hits))
	}
}

func TestSearchRejectsBadArguments(t *testing.T) {
	x := newTestIndex(t, Options{}, pets...)
	if _, err := x.Search(ctx, "x", 0, ModeHybrid); !errors.Is(err, ErrInvalid) {
		t.Errorf("k=0: %v", err)
	}
	if _, err := x.Search(ctx, "x", 1, Mode(9)); !errors.Is(err, ErrInvalid) {
		t.Errorf("mode 9: %v", err)
	}
	if err := x.Add(ctx, Doc{ID: "", Text: "x"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty id: %v", err)
	}
	if err := x.Add(ctx, Doc{ID: "v", Text: "x", Vector: []float32{1, 2}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("wrong dimension: %v", err)
	}
}

func TestCJKSearch(t *testing.T) {
	x := newTestIndex(t, Options{}, "我们去北京大学参观", "东京的天气很好", "mixed 北京 and english")
	hits, err := x.Search(ctx, "北京大学", 3, ModeBM25)
	if err != nil {
		t.Fatal(err)
	}
	if len(hits) < 2 || hits[0].ID != "d0" || hits[1].ID != "d2" {
		t.Errorf("hits %v, want d0, d2", ids(hits))
	}
}

func TestAddDuplicateAddsNothing(t *testing.T) {
	x := newTestIndex(t, Options{}, pets...)
	err := x.Add(ctx, Doc{ID: "new", Text: "fresh"}, Doc{ID: "d1", Text: "again"})
	if !errors.Is(err, ErrDuplicate) {
		t.Fatalf("err %v", err)
	}
	if _, ok := x.Get("new"); ok || x.Len() != len(pets) {
		t.Fatalf("partial add: len %d", x.Len())
	}
	if err := x.Add(ctx, Doc{ID: "a", Text: "1"}, Doc{ID: "a", Text: "2"}); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("repeated id in batch: %v", err)
	}
}

func TestUpsertReplacesInEveryIndex(t *testing.T) {
	x := newTestIndex(t, Options{}, pets...)
	if err := x.Upsert(ctx, Doc{ID: "d0", Text: "a quiet evening of chess"}); err != nil {
		t.Fatal(err)
	}
	if x.Len() != len(pets) {
		t.Fatalf("len %d", x.Len())
	}
	if hits, _ := x.Search(ctx, "camping beach", 5, ModeBM25); len(hits) != 0 {
		t.Errorf("old text of d0 still found: %v", ids(hits))
	}
	for _, mode := range []Mode{ModeBM25, ModeVector, ModeHybrid} {
		hits, _ := x.Search(ctx, "chess evening", 1, mode)
		if len(hits) != 1 || hits[0].ID != "d0" {
			t.Errorf("%v: new text not found: %v", mode, ids(hits))
		}
	}
	// The last of repeated IDs wins.
	if err := x.Upsert(ctx, Doc{ID: "z", Text: "first"}, Doc{ID: "z", Text: "second"}); err != nil {
		t.Fatal(err)
	}
	if d, _ := x.Get("z"); d.Text != "second" {
		t.Errorf("z = %q", d.Text)
	}
}

func TestDeleteRemovesFromEveryIndex(t *testing.T) {
	for _, exact := range []int{0, -1} { // scan, and always the graph
		x := newTestIndex(t, Options{ExactBelow: exact}, pets...)
		if !x.Delete("d0") {
			t.Fatal("delete d0: not found")
		}
		if x.Delete("d0") {
			t.Fatal("second delete reported success")
		}
		if _, ok := x.Get("d0"); ok || x.Len() != len(pets)-1 {
			t.Fatalf("d0 still there, len %d", x.Len())
		}
		for _, mode := range []Mode{ModeBM25, ModeVector, ModeHybrid} {
			hits, err := x.Search(ctx, "Melanie camping beach kids weekend", 10, mode)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(ids(hits), "d0") {
				t.Errorf("exact=%d %v: deleted d0 returned", exact, mode)
			}
		}
	}
}

// TestGraphSurvivesDeleteAndReAdd covers the coder/hnsw v0.6.1 failure
// modes (upstream #10 delete-all-then-add, #13 deleted elevator node, #15
// re-adding a key) that the index avoids with tombstones.
func TestGraphSurvivesDeleteAndReAdd(t *testing.T) {
	texts := syntheticTexts(400, 7)
	x := newTestIndex(t, Options{ExactBelow: -1}, texts...)
	for round := 0; round < 3; round++ {
		for i := range texts {
			if i%3 != round%3 {
				x.Delete(fmt.Sprintf("d%d", i))
			}
		}
		for i, s := range texts {
			if err := x.Upsert(ctx, Doc{ID: fmt.Sprintf("d%d", i), Text: s}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range texts {
		x.Delete(fmt.Sprintf("d%d", i))
	}
	if x.Len() != 0 {
		t.Fatalf("len %d after deleting all", x.Len())
	}
	if hits, err := x.Search(ctx, texts[0], 5, ModeVector); err != nil || len(hits) != 0 {
		t.Fatalf("empty index: %v %v", ids(hits), err)
	}
	if err := x.Add(ctx, Doc{ID: "d0", Text: texts[0]}); err != nil {
		t.Fatal(err)
	}
	hits, err := x.Search(ctx, texts[0], 5, ModeVector)
	if err != nil || len(hits) != 1 || hits[0].ID != "d0" {
		t.Fatalf("after re-add: %v %v", ids(hits), err)
	}
	if s := x.Stats(); s.Tombstones > 64 && float64(s.Tombstones) > 0.5*float64(s.Docs) {
		t.Errorf("tombstones not compacted: %+v", s)
	}
}

func TestTombstonesAreCompacted(t *testing.T) {
	texts := syntheticTexts(300, 3)
	x := newTestIndex(t, Options{ExactBelow: -1}, texts...)
	for i := 0; i < 200; i++ {
		x.Delete(fmt.Sprintf("d%d", i))
	}
	s := x.Stats()
	if s.Docs != 100 || float64(s.Tombstones) > 0.5*100 || !s.Graph {
		t.Fatalf("stats %+v", s)
	}
	for _, q := range texts[200:220] {
		hits, err := x.Search(ctx, q, 10, ModeVector)
		if err != nil {
			t.Fatal(err)
		}
		if len(hits) != 10 {
			t.Fatalf("%d hits", len(hits))
		}
		for _, h := range hits {
			var n int
			fmt.Sscanf(h.ID, "d%d", &n)
			if n < 200 {
				t.Fatalf("deleted %s returned", h.ID)
			}
		}
	}
	x.Compact()
	if s := x.Stats(); s.Tombstones != 0 || s.Docs != 100 {
		t.Fatalf("after Compact: %+v", s)
	}
}

// TestGraphSearch checks the HNSW path: k live hits with exact cosines, in
// order, and hybrid results close to the exact index's because fused
// candidates are rescored exactly. (The graph walk's own recall is measured
// by BenchmarkHNSWSearch, not asserted: see Options.ExactBelow.)
func TestGraphSearch(t *testing.T) {
	texts := syntheticTexts(2000, 11)
	graph := newTestIndex(t, Options{ExactBelow: -1}, texts...)
	exact := newTestIndex(t, Options{ExactBelow: math.MaxInt}, texts...)
	if !graph.Stats().Graph || exact.Stats().Graph {
		t.Fatal("wrong search path")
	}
	var found, total int
	for _, q := range texts[:40] {
		got, err := graph.Search(ctx, q, 10, ModeVector)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 10 {
			t.Fatalf("%d hits", len(got))
		}
		for i, h := range got {
			d, _ := exact.Get(h.ID)
			qv := graph.emb.Embedder.(*HashEmbedder).EmbedWeighted(q, graph.bm.termIDF)
			var dot float64
			for j := range qv {
				dot += float64(qv[j]) * float64(d.Vector[j])
			}
			if math.Abs(dot-h.Cosine) > 1e-4 || (i > 0 && h.Cosine > got[i-1].Cosine) {
				t.Fatalf("hit %d: cosine %v, exact %v", i, h.Cosine, dot)
			}
		}
		want, _ := exact.Search(ctx, q, 10, ModeHybrid)
		gotH, _ := graph.Search(ctx, q, 10, ModeHybrid)
		for _, h := range want {
			total++
			if slices.Contains(ids(gotH), h.ID) {
				found++
			}
		}
	}
	if r := float64(found) / float64(total); r < 0.9 {
		t.Fatalf("hybrid recall@10 with graph vs exact = %.3f, want ≥ 0.9", r)
	}
}

func TestRerank(t *testing.T) {
	now := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	docs := []Doc{
		{ID: "old", Text: "pottery class on sunday", Meta: Meta{Time: now.Add(-60 * 24 * time.Hour)}},
		{ID: "new", Text: "pottery class on sunday", Meta: Meta{Time: now.Add(-time.Hour)}},
		{ID: "vip", Text: "pottery class on sunday", Meta: Meta{Importance: 5, AccessCount: 40}},
	}
	search := func(w RerankWeights) []string {
		x, err := New(Options{Rerank: w, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Add(ctx, docs...); err != nil {
			t.Fatal(err)
		}
		hits, err := x.Search(ctx, "pottery class", 3, ModeHybrid)
		if err != nil {
			t.Fatal(err)
		}
		return ids(hits)
	}
	// Equal relevance: ties by ID.
	if got := search(RerankWeights{}); !slices.Equal(got, []string{"new", "old", "vip"}) {
		t.Errorf("relevance only: %v", got)
	}
	if got := search(RerankWeights{Relevance: 1, Recency: 1}); !slices.Equal(got[:2], []string{"new", "old"}) {
		t.Errorf("recency: %v", got)
	}
	if got := search(RerankWeights{Relevance: 1, Importance: 1}); got[0] != "vip" {
		t.Errorf("importance: %v", got)
	}
	if got := search(RerankWeights{Relevance: 1, Access: 1}); got[0] != "vip" {
		t.Errorf("access: %v", got)
	}
}

func TestRecency(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	f := func(age time.Duration, want float64) {
		t.Helper()
		if got := recency(now.Add(-age), now, time.Hour); math.Abs(got-want) > 1e-9 {
			t.Errorf("recency(%v) = %v, want %v", age, got, want)
		}
	}
	f(0, 1)
	f(time.Hour, 0.5)
	f(2*time.Hour, 0.25)
	f(-time.Hour, 1)
	if got := recency(time.Time{}, now, time.Hour); got != 0 {
		t.Errorf("zero time: %v", got)
	}
}

func TestFusion(t *testing.T) {
	x, err := New(Options{Fusion: FusionRRF, RRFK: 10, VectorWeight: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Add(ctx, Doc{ID: "a", Text: "alpha"}, Doc{ID: "b", Text: "beta"}, Doc{ID: "c", Text: "gamma"}); err != nil {
		t.Fatal(err)
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	bm := []scored{{slot: 0, score: 3}, {slot: 1, score: 1}}
	vec := []scored{{slot: 1, score: 0.9}, {slot: 2, score: 0.1}}
	cands := x.fuse(ModeHybrid, nil, make([]float32, x.vec.dim), bm, vec, nil)
	// RRF: a = .5/11, b = .5/12 + .5/11, c = .5/12; normalised by b's.
	want := map[uint32]float64{0: (0.5 / 11), 1: 0.5/12 + 0.5/11, 2: 0.5 / 12}
	for _, c := range cands {
		if w := want[c.slot] / want[1]; math.Abs(c.rel-w) > 1e-12 {
			t.Errorf("rrf slot %d: rel %v, want %v", c.slot, c.rel, w)
		}
	}
	// Weighted: BM25 s/max and cosine s/max, mixed 0.5/0.5.
	x.opts.Fusion = FusionWeighted
	cands = x.fuse(ModeHybrid, nil, make([]float32, x.vec.dim), bm, vec, nil)
	wantW := map[uint32]float64{0: 0.5 * 1, 1: 0.5*(1.0/3) + 0.5*1, 2: 0.5 * (0.1 / 0.9)}
	for _, c := range cands {
		if w := wantW[c.slot] / wantW[1]; math.Abs(c.rel-w) > 1e-9 {
			t.Errorf("weighted slot %d: rel %v, want %v", c.slot, c.rel, w)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	bad := []Options{
		{K1: -1}, {B: 2}, {Fusion: 7}, {VectorWeight: 1}, {VectorWeight: -0.5},
		{RRFK: -1}, {Candidates: -1}, {M: 1}, {EfSearch: -3}, {CompactRatio: -1},
		{MaxQueryTerms: -1}, {Rerank: RerankWeights{Relevance: -1}},
		{Rerank: RerankWeights{Recency: math.NaN()}}, {Rerank: RerankWeights{HalfLife: -time.Second}},
	}
	for _, o := range bad {
		if _, err := New(o); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", o, err)
		}
	}
	if _, err := New(Options{}); err != nil {
		t.Errorf("zero options: %v", err)
	}
}

func TestUpdateMeta(t *testing.T) {
	x := newTestIndex(t, Options{}, pets...)
	m := Meta{Importance: 2.5, AccessCount: 3, Time: time.Unix(100, 0)}
	if err := x.UpdateMeta("d2", m); err != nil {
		t.Fatal(err)
	}
	if d, _ := x.Get("d2"); d.Meta != m || d.Text != pets[2] {
		t.Errorf("got %+v", d)
	}
	if err := x.UpdateMeta("nope", m); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing id: %v", err)
	}
}

func TestPrecomputedVectorsAreKept(t *testing.T) {
	x := newTestIndex(t, Options{}, pets...)
	d, _ := x.Get("d1")
	y, _ := New(Options{})
	if err := y.Add(ctx, Doc{ID: "d1", Text: d.Text, Vector: d.Vector}); err != nil {
		t.Fatal(err)
	}
	e, _ := y.Get("d1")
	if !slices.Equal(e.Vector, d.Vector) {
		t.Error("vector changed")
	}
}

type failingEmbedder struct{}

func (failingEmbedder) Embed(context.Context, []string) ([][]float32, error) {
	return nil, errors.New("boom")
}
func (failingEmbedder) Dim() int     { return 4 }
func (failingEmbedder) Name() string { return "failing" }

func TestEmbedFailureChangesNothing(t *testing.T) {
	x, err := New(Options{Embedder: failingEmbedder{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Add(ctx, Doc{ID: "a", Text: "x"}); !errors.Is(err, ErrEmbed) {
		t.Fatalf("err %v", err)
	}
	if x.Len() != 0 {
		t.Fatal("document added despite failed embedding")
	}
	if _, err := x.Search(ctx, "x", 1, ModeBM25); err != nil {
		t.Fatalf("BM25 search must not embed: %v", err)
	}
}

func TestConcurrentSearchAndUpdate(t *testing.T) {
	texts := syntheticTexts(600, 5)
	x := newTestIndex(t, Options{ExactBelow: 100}, texts[:300]...)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				hits, err := x.Search(ctx, texts[(w*50+i)%len(texts)], 5, Mode(i%3))
				if err != nil {
					t.Error(err)
					return
				}
				for _, h := range hits {
					if h.ID == "" {
						t.Error("empty hit")
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 300; i < 600; i++ {
			if err := x.Upsert(ctx, Doc{ID: fmt.Sprintf("d%d", i), Text: texts[i]}); err != nil {
				t.Error(err)
				return
			}
			x.Delete(fmt.Sprintf("d%d", i-300))
			if i%50 == 0 {
				x.UpdateMeta(fmt.Sprintf("d%d", i), Meta{AccessCount: 1})
			}
		}
	}()
	wg.Wait()
	if x.Len() != 300 {
		t.Fatalf("len %d", x.Len())
	}
}

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{ModeHybrid, ModeBM25, ModeVector} {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseMode("dense"); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown mode: %v", err)
	}
}

// Coverage is the share of the query's IDF mass a document holds: the
// document with every term covers it all, one sharing a word that many
// documents have covers little, and an unknown query term counts as the
// rarest one. SearchFocus measures it against the focus only.
func TestCoverage(t *testing.T) {
	x := newTestIndex(t, Options{}, pets...)
	cov := func(q, id string) float64 {
		t.Helper()
		c, ok := x.Coverage(q, id)
		if !ok {
			t.Fatalf("no document %s", id)
		}
		return c
	}
	q := "Caroline support group"
	if c := cov(q, "d1"); math.Abs(c-1) > 1e-9 {
		t.Fatalf("full coverage %v", c)
	}
	if c := cov(q, "d4"); c <= 0 || c >= 0.5 {
		t.Fatalf("a frequent word's coverage %v", c)
	}
	// "Caroline" is in several documents; "zeppelin" in none, so it
	// weighs at least as much as the rarest word: below half.
	if c := cov("Caroline zeppelin", "d4"); c <= 0 || c >= 0.5 {
		t.Fatalf("%v of a query half of whose terms no document has", c)
	}
	if c := cov("zeppelin airship", "d4"); c != 0 {
		t.Fatalf("%v of a query no document knows", c)
	}
	if c := cov(q, "d0"); c != 0 {
		t.Fatalf("unrelated document %v", c)
	}
	if _, ok := x.Coverage(q, "nope"); ok {
		t.Fatal("coverage of a missing document")
	}
	hits, err := x.SearchFocus(ctx, q+"\nMelanie took the kids camping at the beach", q, 5, ModeBM25, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hits {
		if h.ID == "d1" && math.Abs(h.Coverage-1) > 1e-9 || h.ID == "d0" && h.Coverage != 0 {
			t.Fatalf("focus coverage of %s: %v", h.ID, h.Coverage)
		}
	}
}
