package workload

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"

	"gorgonia.org/tensor"

	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Preset is the KV shape of a model family for the reference computer.
type Preset struct {
	Name string `json:"name"`
	// Layers, KVHeads and HeadDim shape the KV cache; DModel is the
	// hidden size the projections read.
	Layers  int `json:"layers"`
	KVHeads int `json:"kv_heads"`
	HeadDim int `json:"head_dim"`
	DModel  int `json:"d_model"`
	// Vocab bounds token ids.
	Vocab int `json:"vocab"`
	// RopeBase is RoPE's θ base.
	RopeBase float64 `json:"rope_base"`
	// Scale divides Layers and DModel (KVHeads and HeadDim stay). 1 is
	// the full model.
	Scale int `json:"scale"`
}

// DefaultPreset is the preset NewRefKV uses when none is named.
const DefaultPreset = "llama3-8b"

// presets: full sizes, with the scale NewRefKV applies by default on CPU.
// llama3-8b at scale 8 is 4 layers over a 512-wide hidden state: a
// 2,048-token prefix takes about a second on two cores and its KV is
// 32 MiB of fp16 (16 KiB a token, an eighth of the real model's).
var presets = []Preset{
	{Name: "llama3-8b", Layers: 32, KVHeads: 8, HeadDim: 128, DModel: 4096, Vocab: 128256, RopeBase: 500000, Scale: 8},
	{Name: "llama3-70b", Layers: 80, KVHeads: 8, HeadDim: 128, DModel: 8192, Vocab: 128256, RopeBase: 500000, Scale: 40},
	{Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 16, DModel: 64, Vocab: 4096, RopeBase: 10000, Scale: 1},
}

// LookupPreset returns a preset by name ("" is DefaultPreset) at full
// size with its default Scale.
func LookupPreset(name string) (Preset, error) {
	if name == "" {
		name = DefaultPreset
	}
	for _, p := range presets {
		if p.Name == name {
			return p, nil
		}
	}
	names := make([]string, len(presets))
	for i, p := range presets {
		names[i] = p.Name
	}
	return Preset{}, fmt.Errorf("engine: unknown preset %q (want %s)", name, strings.Join(names, ", "))
}

// Scaled returns p with Layers and DModel divided by scale (at least 1
// layer and a DModel of 16) and Scale set to it.
func (p Preset) Scaled(scale int) Preset {
	p.Layers = max(1, p.Layers/scale)
	p.DModel = max(16, p.DModel/scale)
	p.Scale = scale
	return p
}

// KVBytesPerToken is the size of one token's K and V over all layers.
func (p Preset) KVBytesPerToken(d tiers.DType) int {
	return 2 * p.Layers * p.KVHeads * p.HeadDim * d.ElemSize()
}

// RefKVOptions configure NewRefKV. The zero value is the default preset
// at its default scale, fp16 output, seed 1.
type RefKVOptions struct {
	// Preset names the shape. Empty means DefaultPreset.
	Preset string
	// Scale divides the preset's layers and hidden size. Zero means the
	// preset's default; 1 is the full model.
	Scale int
	// DType of the output: tiers.DTypeF16 or tiers.DTypeF32. Zero (DTypeNone)
	// means f16.
	DType tiers.DType
	// Seed fixes weights and embeddings. Zero means 1.
	Seed uint64
	// ModelID is the blocks' model id. Empty means "ref-<preset>-s<scale>".
	ModelID string
}

func (o *RefKVOptions) validate() (Preset, error) {
	p, err := LookupPreset(o.Preset)
	if err != nil {
		return p, err
	}
	if o.Scale < 0 {
		return p, fmt.Errorf("engine: refkv: negative scale")
	}
	if o.Scale == 0 {
		o.Scale = p.Scale
	}
	p = p.Scaled(o.Scale)
	switch o.DType {
	case tiers.DTypeNone:
		o.DType = tiers.DTypeF16
	case tiers.DTypeF16, tiers.DTypeF32:
	default:
		return p, fmt.Errorf("engine: refkv: dtype %s (want f16 or f32)", o.DType)
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.ModelID == "" {
		o.ModelID = fmt.Sprintf("ref-%s-s%d", p.Name, p.Scale)
	}
	return p, nil
}

// RefKV is a reference KV computer: for each layer l it computes
// K = RoPE(X·Wk[l]) and V = X·Wv[l] over the prompt's token embeddings X,
// with random weights and embeddings fixed by a seed, using
// gorgonia.org/tensor matrix products on the CPU.
//
// It is a cost and shape generator, not a model: every layer reads the
// embeddings (there is no attention, MLP or norm between layers), so its
// tensors have a real model's shape, size and prefill-like cost (the
// same projections at the same widths) but no meaning. Benchmarks and CI
// use it where no engine is at hand.
//
// A RefKV holds its weights (Layers × 2 × DModel × KVHeads·HeadDim
// float32s) for its lifetime; it owns no goroutine and is safe for
// concurrent use.
type RefKV struct {
	opts   RefKVOptions
	p      Preset
	wk, wv []*tensor.Dense
}

// NewRefKV draws the weights.
func NewRefKV(opts RefKVOptions) (*RefKV, error) {
	p, err := opts.validate()
	if err != nil {
		return nil, err
	}
	r := &RefKV{opts: opts, p: p}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x5eed))
	kvDim := p.KVHeads * p.HeadDim
	scale := 1 / math.Sqrt(float64(p.DModel))
	for range p.Layers {
		for _, dst := range []*[]*tensor.Dense{&r.wk, &r.wv} {
			w := make([]float32, p.DModel*kvDim)
			for i := range w {
				w[i] = float32(rng.NormFloat64() * scale)
			}
			*dst = append(*dst, tensor.New(tensor.WithShape(p.DModel, kvDim), tensor.WithBacking(w)))
		}
	}
	return r, nil
}

// Preset returns the effective (scaled) shape.
func (r *RefKV) Preset() Preset { return r.p }

// ModelID returns the model id of the blocks.
func (r *RefKV) ModelID() string { return r.opts.ModelID }

// Compute returns the KV block of tokens: per layer, K and V as
// [KVHeads, len(tokens), HeadDim] tensors of the output dtype. Token ids
// are taken modulo the vocabulary. It checks ctx between layers.
func (r *RefKV) Compute(ctx context.Context, tokens []int32) (*kv.Block, error) {
	p := r.p
	n := len(tokens)
	if n == 0 || n > kv.MaxDim {
		return nil, fmt.Errorf("engine: refkv: %d tokens", n)
	}
	kvDim := p.KVHeads * p.HeadDim
	x := make([]float32, n*p.DModel)
	for t, tok := range tokens {
		id := uint64(uint32(tok)) % uint64(p.Vocab)
		rng := rand.New(rand.NewPCG(r.opts.Seed^0x9e3779b97f4a7c15, id))
		row := x[t*p.DModel : (t+1)*p.DModel]
		for i := range row {
			row[i] = float32(rng.NormFloat64())
		}
	}
	// RoPE tables: angle of pair i at position t is t·base^(−2i/HeadDim).
	half := p.HeadDim / 2
	cos := make([]float32, n*half)
	sin := make([]float32, n*half)
	for i := range half {
		freq := math.Pow(p.RopeBase, -2*float64(i)/float64(p.HeadDim))
		for t := range n {
			s, c := math.Sincos(float64(t) * freq)
			cos[t*half+i], sin[t*half+i] = float32(c), float32(s)
		}
	}
	xt := tensor.New(tensor.WithShape(n, p.DModel), tensor.WithBacking(x))
	out := tensor.New(tensor.WithShape(n, kvDim), tensor.WithBacking(make([]float32, n*kvDim)))
	b := &kv.Block{ModelID: r.opts.ModelID, DType: r.opts.DType, KVHeads: p.KVHeads, Tokens: n, HeadDim: p.HeadDim,
		K: make([][]byte, p.Layers), V: make([][]byte, p.Layers)}
	es := r.opts.DType.ElemSize()
	for l := range p.Layers {
		for _, isK := range []bool{true, false} {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			w := r.wv[l]
			if isK {
				w = r.wk[l]
			}
			if _, err := tensor.MatMul(xt, w, tensor.WithReuse(out)); err != nil {
				return nil, fmt.Errorf("engine: refkv: layer %d: %w", l, err)
			}
			o := out.Data().([]float32)
			if isK {
				rope(o, cos, sin, n, p.KVHeads, p.HeadDim)
			}
			// [tokens, heads, dim] → [heads, tokens, dim]
			dst := make([]byte, n*kvDim*es)
			for t := range n {
				for h := range p.KVHeads {
					src := o[t*kvDim+h*p.HeadDim : t*kvDim+(h+1)*p.HeadDim]
					off := ((h*n + t) * p.HeadDim) * es
					if es == 4 {
						for j, v := range src {
							binary.LittleEndian.PutUint32(dst[off+4*j:], math.Float32bits(v))
						}
					} else {
						for j, v := range src {
							binary.LittleEndian.PutUint16(dst[off+2*j:], tiers.F32ToF16(v))
						}
					}
				}
			}
			if isK {
				b.K[l] = dst
			} else {
				b.V[l] = dst
			}
		}
	}
	return b, nil
}

// rope rotates adjacent pairs (2i, 2i+1) of every head of every token in
// place, as llama.cpp's normal RoPE mode does.
func rope(o, cos, sin []float32, n, heads, dim int) {
	half := dim / 2
	for t := range n {
		cs, sn := cos[t*half:(t+1)*half], sin[t*half:(t+1)*half]
		for h := range heads {
			v := o[(t*heads+h)*dim : (t*heads+h+1)*dim]
			for i := range half {
				a, b := v[2*i], v[2*i+1]
				v[2*i] = a*cs[i] - b*sn[i]
				v[2*i+1] = a*sn[i] + b*cs[i]
			}
		}
	}
}

// ComputeFunc returns Compute bound to tokens, in the form
// kv.Cache.GetOrCompute takes.
func (r *RefKV) ComputeFunc(tokens []int32) func(context.Context) (*kv.Block, error) {
	return func(ctx context.Context) (*kv.Block, error) { return r.Compute(ctx, tokens) }
}

// HashTokens is the reference computer's tokenizer: one token per
// whitespace-separated word, its id the FNV-1a hash of the word modulo
// vocab. Deterministic and cheap; it only gives RefKV inputs of a
// plausible length and is no model's tokenizer.
func HashTokens(text string, vocab int) []int32 {
	if vocab <= 0 {
		vocab = 1 << 17
	}
	words := strings.Fields(text)
	out := make([]int32, len(words))
	for i, w := range words {
		h := fnv.New32a()
		h.Write([]byte(w))
		out[i] = int32(h.Sum32() % uint32(vocab))
	}
	return out
}
