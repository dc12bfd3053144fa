package tiers

import (
	"encoding/binary"
	"fmt"
	"math"
)

// splitPlanes appends src rearranged into width byte planes: first every
// element's byte 0, then every byte 1, and so on. For fp16 KV data the plane
// of high bytes (sign and exponent) is highly repetitive while the low bytes
// are close to noise; zstd finds far more in the planes than in the
// interleaved bytes. len(src) must be a multiple of width.
func splitPlanes(dst, src []byte, width int) []byte {
	n := len(src) / width
	start := len(dst)
	dst = append(dst, make([]byte, len(src))...)
	out := dst[start:]
	i := 0
	if width == 2 {
		lo, hi := out[:n], out[n:]
		// Four elements a step: gather even and odd bytes of a word.
		for ; i+4 <= n; i += 4 {
			x := binary.LittleEndian.Uint64(src[2*i:])
			binary.LittleEndian.PutUint32(lo[i:], compact(x))
			binary.LittleEndian.PutUint32(hi[i:], compact(x>>8))
		}
	}
	for ; i < n; i++ {
		for p := range width {
			out[p*n+i] = src[i*width+p]
		}
	}
	return dst
}

// compact gathers bytes 0, 2, 4 and 6 of x.
func compact(x uint64) uint32 {
	x &= 0x00FF00FF00FF00FF
	x = (x | x>>8) & 0x0000FFFF0000FFFF
	return uint32(x | x>>16)
}

// spread places the bytes of v at bytes 0, 2, 4 and 6.
func spread(v uint32) uint64 {
	x := uint64(v)
	x = (x | x<<16) & 0x0000FFFF0000FFFF
	return (x | x<<8) & 0x00FF00FF00FF00FF
}

// joinPlanes appends the n elements whose byte planes are planes: the
// inverse of splitPlanes.
func joinPlanes(dst []byte, planes [][]byte, n int) []byte {
	width := len(planes)
	start := len(dst)
	dst = append(dst, make([]byte, n*width)...)
	out := dst[start:]
	i := 0
	if width == 2 {
		lo, hi := planes[0][:n], planes[1][:n]
		for ; i+4 <= n; i += 4 {
			x := spread(binary.LittleEndian.Uint32(lo[i:])) | spread(binary.LittleEndian.Uint32(hi[i:]))<<8
			binary.LittleEndian.PutUint64(out[2*i:], x)
		}
	}
	for ; i < n; i++ {
		for p := range width {
			out[i*width+p] = planes[p][i]
		}
	}
	return dst
}

// q8Group is how many values share one scale in the lossy q8 codec.
const q8Group = 64

// quantizeQ8 appends src (16-bit floats of dtype d) quantised to int8 with
// one float32 scale per q8Group values: all scales first, then all int8s.
// The error per value is at most half a step, maxabs/254 of its group.
func quantizeQ8(dst, src []byte, d DType) []byte {
	n := len(src) / 2
	groups := (n + q8Group - 1) / q8Group
	start := len(dst)
	dst = append(dst, make([]byte, 4*groups+n)...)
	scales, qs := dst[start:start+4*groups], dst[start+4*groups:]
	for g := range groups {
		lo, hi := g*q8Group, min((g+1)*q8Group, n)
		var maxAbs float32
		for i := lo; i < hi; i++ {
			v := float32(math.Abs(float64(load16(src, i, d))))
			if v > maxAbs && !math.IsInf(float64(v), 0) {
				maxAbs = v
			}
		}
		scale := maxAbs / 127
		binary.LittleEndian.PutUint32(scales[4*g:], math.Float32bits(scale))
		for i := lo; i < hi; i++ {
			var q float32
			if scale > 0 {
				q = float32(math.Round(float64(load16(src, i, d) / scale)))
			}
			q = max(-127, min(127, q))
			if q != q { // NaN is not preserved
				q = 0
			}
			qs[i] = byte(int8(q))
		}
	}
	return dst
}

// dequantizeQ8 appends n 16-bit floats of dtype d decoded from src.
func dequantizeQ8(dst, src []byte, n int, d DType) ([]byte, error) {
	groups := (n + q8Group - 1) / q8Group
	if len(src) != 4*groups+n {
		return dst, fmt.Errorf("q8 payload of %d bytes for %d values", len(src), n)
	}
	scales, qs := src[:4*groups], src[4*groups:]
	start := len(dst)
	dst = append(dst, make([]byte, 2*n)...)
	out := dst[start:]
	for i := range n {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*(i/q8Group):]))
		store16(out, i, d, float32(int8(qs[i]))*scale)
	}
	return dst, nil
}

func load16(b []byte, i int, d DType) float32 {
	u := binary.LittleEndian.Uint16(b[2*i:])
	if d == DTypeBF16 {
		return math.Float32frombits(uint32(u) << 16)
	}
	return F16ToF32(u)
}

func store16(b []byte, i int, d DType, f float32) {
	var u uint16
	if d == DTypeBF16 {
		u = F32ToBF16(f)
	} else {
		u = F32ToF16(f)
	}
	binary.LittleEndian.PutUint16(b[2*i:], u)
}

// F16ToF32 converts an IEEE 754 half to a float32.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		for mant&0x400 == 0 {
			mant <<= 1
			exp--
		}
		exp++
		mant &= 0x3ff
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	default:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	}
}

// F32ToF16 converts a float32 to an IEEE 754 half, rounding to nearest even.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - e)
		half := mant >> shift
		rem := mant & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	half := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++
	}
	return sign | uint16(half)
}

// F32ToBF16 converts a float32 to bfloat16, rounding to nearest even.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
