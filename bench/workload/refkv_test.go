package workload

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/kvsidecar/kvsidecar/tiers"
)

func TestRefKV(t *testing.T) {
	r, err := NewRefKV(RefKVOptions{Preset: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	p := r.Preset()
	tokens := HashTokens("the quick brown fox jumps over the lazy dog", p.Vocab)
	b, err := r.Compute(context.Background(), tokens)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	if b.Layers() != p.Layers || b.KVHeads != p.KVHeads || b.HeadDim != p.HeadDim || b.Tokens != len(tokens) || b.DType != tiers.DTypeF16 {
		t.Fatalf("block %d layers [%d %d %d] %s", b.Layers(), b.KVHeads, b.Tokens, b.HeadDim, b.DType)
	}
	if b.SizeBytes() != len(tokens)*p.KVBytesPerToken(tiers.DTypeF16) {
		t.Fatalf("%d bytes, want %d", b.SizeBytes(), len(tokens)*p.KVBytesPerToken(tiers.DTypeF16))
	}
	// Deterministic for a seed, different for another.
	b2, _ := r.Compute(context.Background(), tokens)
	r3, _ := NewRefKV(RefKVOptions{Preset: "tiny", Seed: 2})
	b3, _ := r3.Compute(context.Background(), tokens)
	if !bytes.Equal(b.K[1], b2.K[1]) || bytes.Equal(b.K[1], b3.K[1]) {
		t.Fatal("not deterministic per seed")
	}
	// "the" appears at positions 0 and 6: same V (no RoPE), K rotated
	// differently; the rotation keeps each head's pair norms.
	f32, _ := NewRefKV(RefKVOptions{Preset: "tiny", DType: tiers.DTypeF32})
	bf, _ := f32.Compute(context.Background(), tokens)
	row := func(buf []byte, h, tok int) []float32 {
		out := make([]float32, p.HeadDim)
		for j := range out {
			out[j] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*((h*len(tokens)+tok)*p.HeadDim+j):]))
		}
		return out
	}
	v0, v6 := row(bf.V[0], 1, 0), row(bf.V[0], 1, 6)
	k0, k6 := row(bf.K[0], 1, 0), row(bf.K[0], 1, 6)
	for j := range v0 {
		if v0[j] != v6[j] {
			t.Fatalf("V differs for the same token at %d", j)
		}
	}
	same := true
	for i := 0; i < p.HeadDim; i += 2 {
		n0 := math.Hypot(float64(k0[i]), float64(k0[i+1]))
		n6 := math.Hypot(float64(k6[i]), float64(k6[i+1]))
		if math.Abs(n0-n6) > 1e-4*(1+n0) {
			t.Fatalf("pair %d: norm %v at position 0, %v at 6", i/2, n0, n6)
		}
		same = same && k0[i] == k6[i]
	}
	if same {
		t.Fatal("K not rotated by position")
	}
	// fp16 output is the fp32 output rounded.
	if got, want := tiers.F16ToF32(binary.LittleEndian.Uint16(b.K[0][2:])), tiers.F16ToF32(tiers.F32ToF16(math.Float32frombits(binary.LittleEndian.Uint32(bf.K[0][4:])))); got != want {
		t.Fatalf("f16 %v, want %v", got, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Compute(ctx, tokens); err == nil {
		t.Fatal("cancelled compute succeeded")
	}
	if _, err := r.Compute(context.Background(), nil); err == nil {
		t.Fatal("empty compute succeeded")
	}
}

func TestRefKVOptions(t *testing.T) {
	for _, o := range []RefKVOptions{{Preset: "nope"}, {Scale: -1}, {DType: tiers.DTypeQ8}} {
		if _, err := NewRefKV(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	p, err := LookupPreset("")
	if err != nil || p.Name != DefaultPreset {
		t.Fatal(p, err)
	}
	s := p.Scaled(8)
	if s.Layers != 4 || s.DModel != 512 || s.KVHeads != 8 || s.HeadDim != 128 {
		t.Fatalf("scaled %+v", s)
	}
	if full := p.KVBytesPerToken(tiers.DTypeF16); full != 128<<10 {
		t.Fatalf("llama3-8b KV per token %d, want 128 KiB", full)
	}
	if got := HashTokens("a b  a", 10); len(got) != 3 || got[0] != got[2] || got[0] < 0 || got[0] >= 10 {
		t.Fatalf("HashTokens %v", got)
	}
}
