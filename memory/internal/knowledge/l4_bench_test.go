package knowledge

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/index"
)

// BenchmarkL4Cluster: one compression run's CPU work before any model
// call, for a session at the default threshold (150 facts) and at the most
// facts a session keeps (1000): embedding every fact offline, the O(n²)
// similarity pass and union-find.
func BenchmarkL4Cluster(b *testing.B) {
	emb := index.NewHashEmbedder(index.HashOptions{})
	for _, n := range []int{150, 1000} {
		r := rand.New(rand.NewPCG(1, uint64(n)))
		texts := make([]string, n)
		for i := range texts {
			texts[i] = "The user " + randText(r, 12)
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				vecs, err := emb.Embed(context.Background(), texts)
				if err != nil {
					b.Fatal(err)
				}
				facts := make([]Fact, n)
				for i := range facts {
					facts[i] = Fact{ID: fmt.Sprint(i), Content: texts[i], Vec: UnitVector(vecs[i])}
				}
				_ = Clusters(facts, 0.75, 3)
			}
		})
	}
}

// randText returns words random words of a fixed vocabulary.
func randText(r *rand.Rand, words int) string {
	vocab := strings.Fields(`user assistant memory cache prefix summary budget invoice customer order shipping refund
		database index query latency server client proxy upstream tenant session archive recall vector embedding model
		quantum physics history roman empire volcano ocean mountain river forest desert weather storm`)
	var b strings.Builder
	for i := 0; i < words; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[r.IntN(len(vocab))])
	}
	return b.String()
}
