package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
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
				facts := make([]l4Fact, n)
				for i := range facts {
					facts[i] = l4Fact{id: fmt.Sprint(i), content: texts[i], vec: unitVector(vecs[i])}
				}
				_ = l4Clusters(facts, 0.75, 3)
			}
		})
	}
}

// BenchmarkL4Fidelity: checking one merge of three facts (keywords and
// similarity; the merged text's embedding excluded).
func BenchmarkL4Fidelity(b *testing.B) {
	c := l4Cases[0]
	emb := index.NewHashEmbedder(index.HashOptions{})
	vecs, _ := emb.Embed(context.Background(), append(append([]string{}, c.lossy...), c.lossyMerge))
	part := make([]*l4Fact, len(c.lossy))
	for i := range part {
		part[i] = &l4Fact{content: c.lossy[i], vec: unitVector(vecs[i])}
	}
	merged := unitVector(vecs[len(vecs)-1])
	b.ReportAllocs()
	for b.Loop() {
		_ = fidelity(merged, c.lossyMerge, part)
	}
}
