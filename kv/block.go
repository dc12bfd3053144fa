package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

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

// Codec layout, little endian:
//
//	magic "KVBK", u16 version (1), u8 dtype, u8 flags (0),
//	u32 layers, u32 kv_heads, u32 tokens, u32 head_dim,
//	u16 model id length, model id,
//	per layer: K bytes, V bytes,
//	u32 CRC32C of everything before it.
const (
	blockMagic     = "KVBK"
	blockVersion   = 1
	blockFixedLen  = 4 + 2 + 2 + 16 + 2
	blockCRCLen    = 4
	blockMinLength = blockFixedLen + blockCRCLen
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendEncode appends b's encoding to dst. It validates b first.
func (b *Block) AppendEncode(dst []byte) ([]byte, error) {
	if err := b.Validate(); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = append(dst, blockMagic...)
	dst = binary.LittleEndian.AppendUint16(dst, blockVersion)
	dst = append(dst, byte(b.DType), 0)
	for _, v := range []int{len(b.K), b.KVHeads, b.Tokens, b.HeadDim} {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(b.ModelID)))
	dst = append(dst, b.ModelID...)
	for l := range b.K {
		dst = append(dst, b.K[l]...)
		dst = append(dst, b.V[l]...)
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli)), nil
}

// Decode parses an encoded block. It checks magic, version, bounds and the
// CRC before allocating, never panics on any input, and copies the tensor
// bytes, so data may be reused afterwards.
func Decode(data []byte) (*Block, error) {
	if len(data) < blockMinLength {
		return nil, fmt.Errorf("%w: block of %d bytes is shorter than a header", ErrInvalid, len(data))
	}
	if string(data[:4]) != blockMagic {
		return nil, fmt.Errorf("%w: bad block magic %q", ErrInvalid, data[:4])
	}
	if v := binary.LittleEndian.Uint16(data[4:]); v != blockVersion {
		return nil, fmt.Errorf("%w: unsupported block version %d", ErrInvalid, v)
	}
	end := len(data) - blockCRCLen
	if got, want := crc32.Checksum(data[:end], castagnoli), binary.LittleEndian.Uint32(data[end:]); got != want {
		return nil, fmt.Errorf("%w: block crc %08x, want %08x", ErrInvalid, got, want)
	}
	b := &Block{DType: tiers.DType(data[6])}
	if data[7] != 0 {
		return nil, fmt.Errorf("%w: block flags %#x", ErrInvalid, data[7])
	}
	layers := binary.LittleEndian.Uint32(data[8:])
	heads := binary.LittleEndian.Uint32(data[12:])
	tokens := binary.LittleEndian.Uint32(data[16:])
	dim := binary.LittleEndian.Uint32(data[20:])
	modelLen := int(binary.LittleEndian.Uint16(data[24:]))
	if layers == 0 || layers > MaxLayers || heads > MaxDim || tokens > MaxDim || dim > MaxDim {
		return nil, fmt.Errorf("%w: block dimensions out of range", ErrInvalid)
	}
	if modelLen > MaxModelIDLen || blockFixedLen+modelLen > end {
		return nil, fmt.Errorf("%w: model id of %d bytes", ErrInvalid, modelLen)
	}
	if b.DType == tiers.DTypeNone || !b.DType.Valid() {
		return nil, fmt.Errorf("%w: block dtype %d", ErrInvalid, b.DType)
	}
	b.ModelID = string(data[blockFixedLen : blockFixedLen+modelLen])
	b.KVHeads, b.Tokens, b.HeadDim = int(heads), int(tokens), int(dim)
	layerBytes := uint64(heads) * uint64(tokens) * uint64(dim) * uint64(b.DType.ElemSize())
	payload := data[blockFixedLen+modelLen : end]
	if layerBytes*2*uint64(layers) != uint64(len(payload)) {
		return nil, fmt.Errorf("%w: %d payload bytes for %d layers of %d", ErrInvalid, len(payload), layers, layerBytes)
	}
	buf := append([]byte(nil), payload...)
	b.K, b.V = splitLayers(buf, int(layers), int(layerBytes))
	return b, b.Validate()
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
