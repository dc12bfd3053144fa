package tiers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Archive file layout, little endian:
//
//	off  size
//	0    4     magic "KVSA"
//	4    2     version (1)
//	6    1     dtype
//	7    1     codec
//	8    1     ndim (<= MaxShapeNd)
//	9    1     flags (0)
//	10   2     key length (<= MaxKeyLen)
//	12   4     aux length (<= MaxAuxLen)
//	16   8     tokens
//	24   8     raw length (decoded payload bytes)
//	32   8     stored length (payload bytes in the file)
//	40   8·nd  shape
//	..         key, aux
//	..   4     CRC32C of everything above (the header)
//	..         stored payload
//	..   4     CRC32C of everything above (header and payload)
//
// The header CRC lets the index be rebuilt from the first bytes of each file;
// the trailing CRC is checked on every read before a byte is served.
const (
	archiveMagic   = "KVSA"
	archiveVersion = 1
	fixedHeaderLen = 40
	maxHeaderLen   = fixedHeaderLen + 8*MaxShapeNd + MaxKeyLen + MaxAuxLen + 4
)

// Payload codecs.
const (
	codecRaw    = 0 // stored as is
	codecZstd   = 1 // zstd
	codecPlanes = 2 // byte planes of the dtype's width, each zstd or raw
	codecQ8     = 3 // lossy: 16-bit floats quantised to q8, then zstd
	numCodecs   = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errFormat marks a file that does not parse; it is wrapped with errCorrupt.
var errFormat = errors.New("bad archive file")

type fileHeader struct {
	meta      Meta
	key       string
	codec     uint8
	rawLen    uint64
	storedLen uint64
	headerLen int // bytes through the header CRC
}

// appendHeader appends the header, header CRC included.
func appendHeader(dst []byte, h *fileHeader) []byte {
	start := len(dst)
	dst = append(dst, archiveMagic...)
	dst = binary.LittleEndian.AppendUint16(dst, archiveVersion)
	dst = append(dst, byte(h.meta.DType), h.codec, byte(len(h.meta.Shape)), 0)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(h.key)))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(h.meta.Aux)))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.meta.Tokens))
	dst = binary.LittleEndian.AppendUint64(dst, h.rawLen)
	dst = binary.LittleEndian.AppendUint64(dst, h.storedLen)
	for _, d := range h.meta.Shape {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(d))
	}
	dst = append(dst, h.key...)
	dst = append(dst, h.meta.Aux...)
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// parseHeader parses the header at the start of b. It needs only the header
// bytes, not the payload. It never panics, whatever b holds.
func parseHeader(b []byte, maxRaw uint64) (*fileHeader, error) {
	if len(b) < fixedHeaderLen {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a header", errFormat, len(b))
	}
	if string(b[:4]) != archiveMagic {
		return nil, fmt.Errorf("%w: bad magic %q", errFormat, b[:4])
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != archiveVersion {
		return nil, fmt.Errorf("%w: unsupported version %d", errFormat, v)
	}
	h := &fileHeader{}
	h.meta.DType = DType(b[6])
	h.codec = b[7]
	nd := int(b[8])
	keyLen := int(binary.LittleEndian.Uint16(b[10:]))
	auxLen := int(binary.LittleEndian.Uint32(b[12:]))
	tokens := binary.LittleEndian.Uint64(b[16:])
	h.rawLen = binary.LittleEndian.Uint64(b[24:])
	h.storedLen = binary.LittleEndian.Uint64(b[32:])
	switch {
	case !h.meta.DType.Valid():
		return nil, fmt.Errorf("%w: dtype %d", errFormat, b[6])
	case h.codec >= numCodecs:
		return nil, fmt.Errorf("%w: codec %d", errFormat, h.codec)
	case b[9] != 0:
		return nil, fmt.Errorf("%w: flags %#x", errFormat, b[9])
	case nd > MaxShapeNd || keyLen > MaxKeyLen || auxLen > MaxAuxLen:
		return nil, fmt.Errorf("%w: header fields out of range", errFormat)
	case tokens > 1<<62 || h.rawLen > maxRaw || h.storedLen > maxRaw+maxRaw/8+1<<16:
		return nil, fmt.Errorf("%w: lengths out of range", errFormat)
	}
	h.meta.Tokens = int64(tokens)
	n := fixedHeaderLen + 8*nd + keyLen + auxLen
	if len(b) < n+4 {
		return nil, fmt.Errorf("%w: header of %d bytes truncated at %d", errFormat, n+4, len(b))
	}
	if got, want := crc32.Checksum(b[:n], castagnoli), binary.LittleEndian.Uint32(b[n:]); got != want {
		return nil, fmt.Errorf("%w: header crc %08x, want %08x", errFormat, got, want)
	}
	off := fixedHeaderLen
	if nd > 0 {
		h.meta.Shape = make([]int64, nd)
		for i := range nd {
			d := binary.LittleEndian.Uint64(b[off:])
			if d > 1<<62 {
				return nil, fmt.Errorf("%w: dimension out of range", errFormat)
			}
			h.meta.Shape[i] = int64(d)
			off += 8
		}
	}
	h.key = string(b[off : off+keyLen])
	off += keyLen
	if auxLen > 0 {
		h.meta.Aux = append([]byte(nil), b[off:off+auxLen]...)
	}
	h.headerLen = n + 4
	return h, nil
}

var (
	zstdOnce sync.Once
	zstdEnc  map[zstd.EncoderLevel]*zstd.Encoder
	zstdDec  *zstd.Decoder
	zstdMu   sync.Mutex
)

func encoder(level zstd.EncoderLevel) *zstd.Encoder {
	zstdMu.Lock()
	defer zstdMu.Unlock()
	if zstdEnc == nil {
		zstdEnc = make(map[zstd.EncoderLevel]*zstd.Encoder)
	}
	if e, ok := zstdEnc[level]; ok {
		return e
	}
	// EncodeAll is safe for concurrent use; one encoder per level serves all.
	e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1),
		zstd.WithZeroFrames(true), zstd.WithEncoderCRC(false),
		// KV planes have no matches but skewed bytes: entropy-code them anyway.
		zstd.WithAllLitEntropyCompression(true))
	if err != nil {
		panic(err) // only invalid options fail
	}
	zstdEnc[level] = e
	return e
}

func decoder() *zstd.Decoder {
	zstdOnce.Do(func() {
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(4<<30))
		if err != nil {
			panic(err) // only invalid options fail
		}
		zstdDec = d
	})
	return zstdDec
}

// encodePayload chooses a codec for data and appends the stored bytes.
// lossy allows q8 for 16-bit float data.
//
// Typed data is split into byte planes, and each plane is compressed only
// if that pays: in fp16 KV data the high bytes (sign, exponent) compress
// well and the low mantissa bytes are noise, which zstd would spend time on
// at both ends for nothing. The planes payload is
//
//	u8 width, then per plane: u8 kind (0 raw, 1 zstd), u32 length, bytes.
func encodePayload(dst, data []byte, d DType, lossy bool, level zstd.EncoderLevel) ([]byte, uint8) {
	width := d.ElemSize()
	start := len(dst)
	switch {
	case lossy && (d == DTypeF16 || d == DTypeBF16) && len(data)%2 == 0 && len(data) > 0:
		tmp := quantizeQ8(getBuf(len(data)), data, d)
		dst = encoder(level).EncodeAll(tmp, dst)
		putBuf(tmp)
		return dst, codecQ8
	case width > 1 && len(data)%width == 0 && len(data) >= 64*width:
		tmp := splitPlanes(getBuf(len(data)), data, width)
		n := len(data) / width
		dst = append(dst, byte(width))
		for p := range width {
			plane := tmp[p*n : (p+1)*n]
			at := len(dst)
			dst = append(dst, 0, 0, 0, 0, 0)
			if planePays(plane, level) {
				dst = encoder(level).EncodeAll(plane, dst)
				if len(dst)-at-5 < n-n/32 {
					dst[at] = 1
					binary.LittleEndian.PutUint32(dst[at+1:], uint32(len(dst)-at-5))
					continue
				}
				dst = dst[:at+5]
			}
			dst = append(dst, plane...)
			binary.LittleEndian.PutUint32(dst[at+1:], uint32(n))
		}
		putBuf(tmp)
		if len(dst)-start < len(data)-len(data)/64 {
			return dst, codecPlanes
		}
		dst = dst[:start]
	case len(data) > 0:
		dst = encoder(level).EncodeAll(data, dst)
		if len(dst)-start < len(data)-len(data)/64 {
			return dst, codecZstd
		}
		dst = dst[:start]
	}
	// Less than 1.5% saved: not worth a decompression on every read.
	return append(dst, data...), codecRaw
}

// planePays guesses from a sample whether zstd saves at least 3% on plane.
func planePays(plane []byte, level zstd.EncoderLevel) bool {
	const sample = 32 << 10
	if len(plane) <= 2*sample {
		return true
	}
	s := plane[len(plane)/2-sample/2 : len(plane)/2+sample/2]
	tmp := encoder(level).EncodeAll(s, getBuf(sample+64))
	pays := len(tmp) < sample-sample/32
	putBuf(tmp)
	return pays
}

// decodePayload appends the decoded payload of stored to dst.
func decodePayload(dst, stored []byte, h *fileHeader) ([]byte, error) {
	switch h.codec {
	case codecRaw:
		if uint64(len(stored)) != h.rawLen {
			return dst, fmt.Errorf("%w: raw payload of %d bytes, header says %d", errFormat, len(stored), h.rawLen)
		}
		return append(dst, stored...), nil
	case codecPlanes:
		return decodePlanes(dst, stored, h)
	case codecZstd, codecQ8:
	default:
		return dst, fmt.Errorf("%w: codec %d", errFormat, h.codec)
	}
	want := int(h.rawLen)
	if h.codec == codecQ8 {
		if h.rawLen%2 != 0 {
			return dst, fmt.Errorf("%w: q8 of odd length", errFormat)
		}
		n := want / 2
		want = 4*((n+q8Group-1)/q8Group) + n
	}
	tmp, err := unzstd(getBuf(want), stored, want)
	defer putBuf(tmp)
	if err != nil {
		return dst, err
	}
	if h.codec == codecQ8 {
		return dequantizeQ8(dst, tmp, int(h.rawLen/2), h.meta.DType)
	}
	return append(dst, tmp...), nil
}

// unzstd appends the decoding of one zstd frame of want bytes to dst.
func unzstd(dst, src []byte, want int) ([]byte, error) {
	var zh zstd.Header
	if err := zh.Decode(src); err != nil || (zh.HasFCS && zh.FrameContentSize != uint64(want)) {
		return dst, fmt.Errorf("%w: zstd frame header does not match %d bytes", errFormat, want)
	}
	start := len(dst)
	dst, err := decoder().DecodeAll(src, dst)
	if err != nil {
		return dst, fmt.Errorf("%w: zstd: %v", errFormat, err)
	}
	if len(dst)-start != want {
		return dst, fmt.Errorf("%w: payload decodes to %d bytes, want %d", errFormat, len(dst)-start, want)
	}
	return dst, nil
}

func decodePlanes(dst, stored []byte, h *fileHeader) ([]byte, error) {
	width := h.meta.DType.ElemSize()
	if width == 1 || h.rawLen%uint64(width) != 0 || len(stored) < 1 || int(stored[0]) != width {
		return dst, fmt.Errorf("%w: planes of width %d for %d bytes", errFormat, width, h.rawLen)
	}
	n := int(h.rawLen) / width
	tmp := getBuf(int(h.rawLen))
	defer putBuf(tmp)
	planes := make([][]byte, width)
	src := stored[1:]
	for p := range width {
		if len(src) < 5 {
			return dst, fmt.Errorf("%w: truncated plane %d", errFormat, p)
		}
		kind, size := src[0], binary.LittleEndian.Uint32(src[1:])
		src = src[5:]
		if uint64(size) > uint64(len(src)) {
			return dst, fmt.Errorf("%w: plane %d of %d bytes in %d", errFormat, p, size, len(src))
		}
		body := src[:size]
		src = src[size:]
		switch kind {
		case 0:
			if int(size) != n {
				return dst, fmt.Errorf("%w: raw plane %d of %d bytes, want %d", errFormat, p, size, n)
			}
			planes[p] = body
		case 1:
			at := len(tmp)
			var err error
			if tmp, err = unzstd(tmp, body, n); err != nil {
				return dst, err
			}
			planes[p] = tmp[at:]
		default:
			return dst, fmt.Errorf("%w: plane kind %d", errFormat, kind)
		}
	}
	if len(src) != 0 {
		return dst, fmt.Errorf("%w: %d bytes after the planes", errFormat, len(src))
	}
	return joinPlanes(dst, planes, n), nil
}

var bufPool sync.Pool // of *[]byte

// getBuf returns an empty slice with at least n capacity; putBuf returns it.
func getBuf(n int) []byte {
	if p, ok := bufPool.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]byte, 0, n)
}

func putBuf(b []byte) {
	if cap(b) == 0 || cap(b) > 64<<20 {
		return
	}
	b = b[:0]
	bufPool.Put(&b)
}

// StoredSize returns how many payload bytes the Archive would store for
// data of dtype d (lossy: with q8 allowed), for reports of compression.
func StoredSize(data []byte, d DType, lossy bool) int {
	out, _ := encodePayload(nil, data, d, lossy, encoderLevel(1))
	return len(out)
}

func encoderLevel(l int) zstd.EncoderLevel {
	return zstd.EncoderLevelFromZstd([]int{0, 1, 3, 7, 19}[l])
}
