package llamacpp

import (
	"encoding/binary"
	"math"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// Test files are written here in DESIGN.md's layout, independently of
// the parser.

type genStream struct {
	cells  int
	vtrans bool
	layers int
	width  int      // n_embd_k_gqa = n_embd_v_gqa, in elements
	ktype  ggmlType // also V's
	seq    int32
}

type genFile struct {
	magic, version uint32
	tokens         []int32
	header         bool // write n_stream
	streams        []genStream
	seed           int // varies the values
}

// genVal is the value of element j of cell c of layer l (K when k), the
// same whatever the V layout, so tests can compare blocks of v_trans 0
// and 1.
func genVal(seed, l, c, j int, k bool) float32 {
	v := float32(seed*1000+l*100+c) + float32(j)/64
	if !k {
		v = -v
	}
	return v
}

func elemBytes(t ggmlType) int {
	switch t {
	case GGMLTypeF32:
		return 4
	case GGMLTypeF16, GGMLTypeBF16:
		return 2
	}
	return 1 // opaque (quantised) types: bytes
}

func appendElem(dst []byte, t ggmlType, v float32) []byte {
	switch t {
	case GGMLTypeF32:
		return binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	case GGMLTypeF16:
		return binary.LittleEndian.AppendUint16(dst, tiers.F32ToF16(v))
	case GGMLTypeBF16:
		return binary.LittleEndian.AppendUint16(dst, tiers.F32ToBF16(v))
	}
	return append(dst, byte(int(v)))
}

func (g genFile) bytes() []byte {
	le := binary.LittleEndian
	b := le.AppendUint32(nil, g.magic)
	b = le.AppendUint32(b, g.version)
	b = le.AppendUint32(b, uint32(len(g.tokens)))
	for _, t := range g.tokens {
		b = le.AppendUint32(b, uint32(t))
	}
	if g.header {
		b = le.AppendUint32(b, uint32(len(g.streams)))
	}
	for si, s := range g.streams {
		b = le.AppendUint32(b, uint32(s.cells))
		if s.cells == 0 {
			continue
		}
		for c := range s.cells {
			b = le.AppendUint32(b, uint32(int32(c)))
			b = le.AppendUint32(b, 1)
			b = le.AppendUint32(b, uint32(s.seq))
		}
		vt := uint32(0)
		if s.vtrans {
			vt = 1
		}
		b = le.AppendUint32(b, vt)
		b = le.AppendUint32(b, uint32(s.layers))
		es := elemBytes(s.ktype)
		seed := g.seed*10 + si
		for l := range s.layers {
			b = le.AppendUint32(b, uint32(s.ktype))
			b = le.AppendUint64(b, uint64(s.width*es))
			for c := range s.cells {
				for j := range s.width {
					b = appendElem(b, s.ktype, genVal(seed, l, c, j, true))
				}
			}
		}
		for l := range s.layers {
			b = le.AppendUint32(b, uint32(s.ktype))
			if !s.vtrans {
				b = le.AppendUint64(b, uint64(s.width*es))
				for c := range s.cells {
					for j := range s.width {
						b = appendElem(b, s.ktype, genVal(seed, l, c, j, false))
					}
				}
				continue
			}
			b = le.AppendUint32(b, uint32(es))
			b = le.AppendUint32(b, uint32(s.width))
			for j := range s.width {
				for c := range s.cells {
					b = appendElem(b, s.ktype, genVal(seed, l, c, j, false))
				}
			}
		}
	}
	return b
}

// simpleFile is one stream of f16 KV, v_trans as given.
func simpleFile(tokens []int32, layers, width int, vtrans bool) genFile {
	return genFile{magic: SlotStateMagic, version: SlotStateVersion, tokens: tokens, header: true,
		streams: []genStream{{cells: len(tokens), vtrans: vtrans, layers: layers, width: width, ktype: GGMLTypeF16}}}
}

// Some ggml types of K and V tensors the generator writes (every type
// parses, quantised ones such as q8_0 too).
const (
	GGMLTypeF32  ggmlType = 0
	GGMLTypeF16  ggmlType = 1
	GGMLTypeBF16 ggmlType = 30
)
