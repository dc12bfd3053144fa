package index

import (
	"context"
	"errors"
	"math"
	"testing"
)

func dot(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

func TestHashEmbedder(t *testing.T) {
	e := NewHashEmbedder(HashOptions{})
	if e.Dim() != 512 || e.Name() != "hash-v1-d512" {
		t.Fatalf("dim %d name %s", e.Dim(), e.Name())
	}
	texts := []string{
		"We went camping in the mountains",
		"They camped on a mountain last summer",
		"The quarterly tax report is due",
		"",
		"We went camping in the mountains",
	}
	v, err := e.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != len(texts) {
		t.Fatalf("%d vectors", len(v))
	}
	for i, x := range v {
		n := math.Sqrt(dot(x, x))
		if len(x) != 512 || (texts[i] != "" && math.Abs(n-1) > 1e-5) || (texts[i] == "" && n != 0) {
			t.Errorf("vector %d: len %d norm %v", i, len(x), n)
		}
	}
	if d := dot(v[0], v[4]); math.Abs(d-1) > 1e-6 {
		t.Errorf("not deterministic: %v", d)
	}
	if related, unrelated := dot(v[0], v[1]), dot(v[0], v[2]); related <= unrelated+0.2 {
		t.Errorf("related %v, unrelated %v", related, unrelated)
	}
	// Trigrams match spelling variants the stemmer does not join.
	w, _ := e.Embed(context.Background(), []string{"colour", "color", "flavour"})
	if dot(w[0], w[1]) <= dot(w[0], w[2]) {
		t.Errorf("colour~color %v, colour~flavour %v", dot(w[0], w[1]), dot(w[0], w[2]))
	}
	no := NewHashEmbedder(HashOptions{TrigramWeight: -1})
	w, _ = no.Embed(context.Background(), []string{"colour", "color"})
	if dot(w[0], w[1]) > 0.2 {
		t.Errorf("without trigrams colour~color %v", dot(w[0], w[1]))
	}
	if no.Name() == e.Name() {
		t.Error("different features share a name")
	}
}

func TestHashEmbedderWeighted(t *testing.T) {
	e := NewHashEmbedder(HashOptions{})
	docs, _ := e.Embed(context.Background(), []string{"Caroline adopted a puppy", "Caroline went hiking"})
	flat := e.EmbedWeighted("Caroline puppy", func(string) float64 { return 1 })
	if math.Abs(math.Sqrt(dot(flat, flat))-1) > 1e-5 {
		t.Fatal("not normalised")
	}
	// Weighting the rare term up separates the documents more.
	idf := e.EmbedWeighted("Caroline puppy", func(t string) float64 {
		if t == "carolin" {
			return 0.1
		}
		return 3
	})
	if dot(idf, docs[0])-dot(idf, docs[1]) <= dot(flat, docs[0])-dot(flat, docs[1]) {
		t.Error("weights had no effect")
	}
	zero := e.EmbedWeighted("Caroline", func(string) float64 { return math.NaN() })
	if dot(zero, zero) != 0 {
		t.Error("NaN weight produced a vector")
	}
}

func TestHashEmbedderContext(t *testing.T) {
	c, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewHashEmbedder(HashOptions{}).Embed(c, []string{"x"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}
