package kv

import (
	"context"
	"testing"
)

// A 1 MiB block: 4 layers × 2 heads × 256 tokens × 128 dims of fp16, K and V.
func benchBlock() *Block { return testBlock(4, 2, 256, 128, 1) }

func BenchmarkGetOrComputeHit(b *testing.B) {
	c, err := Open(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	blk := benchBlock()
	compute := func(context.Context) (*Block, error) { return blk, nil }
	c.GetOrCompute(context.Background(), "s", "q", compute)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := c.GetOrCompute(context.Background(), "s", "q", compute); err != nil {
			b.Fatal(err)
		}
	}
}
