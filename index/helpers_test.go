package index

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

// syntheticTexts returns n deterministic sentences over a Zipf-distributed
// vocabulary of made-up words, so BM25 and the embedder see realistic term
// statistics.
func syntheticTexts(n int, seed int64) []string {
	r := rand.New(rand.NewSource(seed))
	syl := []string{"ka", "lo", "mi", "ren", "tas", "vo", "qui", "zel", "dor", "pha", "nu", "sri", "bel", "gat", "hon", "jus"}
	vocab := make([]string, 3000)
	for i := range vocab {
		var b strings.Builder
		for j := 0; j < 2+i%3; j++ {
			b.WriteString(syl[(i*7+j*13+j*i)%len(syl)])
		}
		fmt.Fprintf(&b, "%c", 'a'+rune(i%26))
		vocab[i] = b.String()
	}
	z := rand.NewZipf(r, 1.1, 1, uint64(len(vocab)-1))
	out := make([]string, n)
	for i := range out {
		words := make([]string, 8+r.Intn(16))
		for j := range words {
			words[j] = vocab[z.Uint64()]
		}
		out[i] = strings.Join(words, " ")
	}
	return out
}

func newTestIndex(t testing.TB, o Options, texts ...string) *Index {
	t.Helper()
	x, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	docs := make([]Doc, len(texts))
	for i, s := range texts {
		docs[i] = Doc{ID: fmt.Sprintf("d%d", i), Text: s}
	}
	if err := x.Add(context.Background(), docs...); err != nil {
		t.Fatal(err)
	}
	return x
}

func ids(hits []Hit) []string {
	out := make([]string, len(hits))
	for i, h := range hits {
		out[i] = h.ID
	}
	return out
}
