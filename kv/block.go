package kv

import (
	"errors"
	"fmt"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// Limits of a Block, checked by Validate and Decode.
const (
	MaxLayers     = 4096
	MaxModelIDLen = 1024
	MaxDim        = 1 << 24
	// MaxBlockBytes caps the tensor bytes of one block (4 GiB).
	MaxBlockBytes = 4 << 30
)

// ErrInvalid marks malformed input: a block, codec bytes, a blob name or
// blob metadata. The HTTP layer answers it with 400.
var ErrInvalid = errors.New("kv: invalid")

// Block is the K and V tensors of a span of tokens for every layer of one
// model. K[l] and V[l] hold layer l as a row-major [KVHeads, Tokens, HeadDim]
// tensor of DType, little endian. A Block returned by the Cache shares
// memory with it: treat it as read-only.
type Block struct {
	ModelID string
	DType   tiers.DType
	KVHeads int
	Tokens  int
	HeadDim int
	K, V    [][]byte
}

// Layers returns the number of layers.
func (b *Block) Layers() int { return len(b.K) }

// LayerBytes returns the size of one layer's K (or V) tensor.
func (b *Block) LayerBytes() int {
	return b.KVHeads * b.Tokens * b.HeadDim * b.DType.ElemSize()
}

// SizeBytes returns the size of all tensors.
func (b *Block) SizeBytes() int { return 2 * len(b.K) * b.LayerBytes() }

// Validate checks dtype, dimensions and every tensor's length.
func (b *Block) Validate() error {
	switch {
	case b.DType == tiers.DTypeNone || !b.DType.Valid():
		return fmt.Errorf("%w: block dtype %d", ErrInvalid, b.DType)
	case len(b.ModelID) > MaxModelIDLen:
		return fmt.Errorf("%w: model id of %d bytes", ErrInvalid, len(b.ModelID))
	case len(b.K) == 0 || len(b.K) > MaxLayers || len(b.V) != len(b.K):
		return fmt.Errorf("%w: %d K and %d V layers", ErrInvalid, len(b.K), len(b.V))
	case b.KVHeads <= 0 || b.Tokens < 0 || b.HeadDim <= 0 || b.KVHeads > MaxDim || b.Tokens > MaxDim || b.HeadDim > MaxDim:
		return fmt.Errorf("%w: shape [%d %d %d]", ErrInvalid, b.KVHeads, b.Tokens, b.HeadDim)
	}
	n := uint64(b.KVHeads) * uint64(b.Tokens) * uint64(b.HeadDim) * uint64(b.DType.ElemSize())
	if n*2*uint64(len(b.K)) > MaxBlockBytes {
		return fmt.Errorf("%w: block of %d bytes", ErrInvalid, n*2*uint64(len(b.K)))
	}
	for l := range b.K {
		if uint64(len(b.K[l])) != n || uint64(len(b.V[l])) != n {
			return fmt.Errorf("%w: layer %d has %d K and %d V bytes, want %d", ErrInvalid, l, len(b.K[l]), len(b.V[l]), n)
		}
	}
	return nil
}

// splitLayers slices buf, laid out as K0 V0 K1 V1 …, into per-layer views.
func splitLayers(buf []byte, layers, layerBytes int) (k, v [][]byte) {
	k, v = make([][]byte, layers), make([][]byte, layers)
	for l := range layers {
		off := 2 * l * layerBytes
		k[l] = buf[off : off+layerBytes : off+layerBytes]
		v[l] = buf[off+layerBytes : off+2*layerBytes : off+2*layerBytes]
	}
	return k, v
}
