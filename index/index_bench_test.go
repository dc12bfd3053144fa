package index

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
)

const benchDocs = 10_000

var (
	benchOnce    sync.Once
	benchTexts   []string
	benchQueries []string
	benchGraph   *Index // vector search always walks the HNSW graph
	benchExact   *Index // vector search always scans
)

func benchSetup(b *testing.B) {
	benchOnce.Do(func() {
		benchTexts = syntheticTexts(benchDocs, 42)
		benchQueries = syntheticTexts(200, 43)
		for i := range benchQueries {
			benchQueries[i] = benchQueries[i][:min(len(benchQueries[i]), 60)] // short queries
		}
		benchGraph = newTestIndex(b, Options{ExactBelow: -1}, benchTexts...)
		benchExact = newTestIndex(b, Options{ExactBelow: math.MaxInt}, benchTexts...)
	})
}

func benchSearch(b *testing.B, x *Index, mode Mode) {
	benchSetup(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := x.Search(context.Background(), benchQueries[i%len(benchQueries)], 10, mode); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBM25Search(b *testing.B)        { benchSearch(b, benchExactOrSetup(b), ModeBM25) }
func BenchmarkExactVectorSearch(b *testing.B) { benchSearch(b, benchExactOrSetup(b), ModeVector) }
func BenchmarkHybridSearch(b *testing.B)      { benchSearch(b, benchExactOrSetup(b), ModeHybrid) }
func BenchmarkHybridSearchGraph(b *testing.B) { benchSearch(b, benchGraphOrSetup(b), ModeHybrid) }

// BenchmarkHNSWSearch times the graph walk and reports its recall@10
// against the exact scan (see Options.ExactBelow).
func BenchmarkHNSWSearch(b *testing.B) {
	x := benchGraphOrSetup(b)
	var found, total int
	for _, q := range benchQueries[:50] {
		want, _ := benchExact.Search(context.Background(), q, 10, ModeVector)
		got, _ := x.Search(context.Background(), q, 10, ModeVector)
		for _, h := range want {
			total++
			if slices.ContainsFunc(got, func(g Hit) bool { return g.ID == h.ID }) {
				found++
			}
		}
	}
	benchSearch(b, x, ModeVector)
	b.ReportMetric(float64(found)/float64(total), "recall@10")
}

func benchExactOrSetup(b *testing.B) *Index { benchSetup(b); return benchExact }
func benchGraphOrSetup(b *testing.B) *Index { benchSetup(b); return benchGraph }

// BenchmarkHashEmbed embeds 10k documents per operation.
func BenchmarkHashEmbed(b *testing.B) {
	texts := syntheticTexts(benchDocs, 42)
	e := NewHashEmbedder(HashOptions{})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Embed(context.Background(), texts); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(texts))/b.Elapsed().Seconds(), "docs/s")
}

// BenchmarkAdd measures indexing (tokenize, embed, postings) without a
// graph, 1000 documents per operation.
func BenchmarkAdd(b *testing.B) {
	texts := syntheticTexts(1000, 42)
	docs := make([]Doc, len(texts))
	b.ReportAllocs()
	for b.Loop() {
		x, _ := New(Options{})
		for i, s := range texts {
			docs[i] = Doc{ID: fmt.Sprint(i), Text: s}
		}
		if err := x.Add(context.Background(), docs...); err != nil {
			b.Fatal(err)
		}
	}
}
