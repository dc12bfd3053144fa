package memory

import (
	"context"
	"testing"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
)

// BenchmarkL4Fidelity: checking one merge of three facts (keywords and
// similarity; the merged text's embedding excluded).
func BenchmarkL4Fidelity(b *testing.B) {
	c := l4Cases[0]
	emb := index.NewHashEmbedder(index.HashOptions{})
	vecs, _ := emb.Embed(context.Background(), append(append([]string{}, c.lossy...), c.lossyMerge))
	part := make([]*knowledge.Fact, len(c.lossy))
	for i := range part {
		part[i] = &knowledge.Fact{Content: c.lossy[i], Vec: knowledge.UnitVector(vecs[i])}
	}
	merged := knowledge.UnitVector(vecs[len(vecs)-1])
	b.ReportAllocs()
	for b.Loop() {
		_ = knowledge.Fidelity(merged, c.lossyMerge, part)
	}
}
