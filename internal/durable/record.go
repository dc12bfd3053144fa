package durable

import (
	"encoding/binary"
	"hash/crc32"
)

// Record framing, little-endian:
//
//	u32 payload length (1 .. max)
//	u32 CRC-32C of the payload
//	u32 CRC-32C of the 8 bytes above
//	payload
//
// The header checksum is what makes resynchronisation cheap and safe: after
// damage the reader looks for the next offset whose 12 bytes form a header
// with a valid checksum (8 bytes hashed per candidate offset, so linear in
// the damaged length) and whose payload then passes its own checksum. A
// zero length is invalid, so zero-filled regions (what some file systems
// show after a crash) never decode. A payload that never contains a NUL
// byte (JSON does not) cannot carry a forged record: a length below 16 MiB
// has a zero high byte.
const RecordHeaderSize = 12

// DefaultMaxRecord bounds a payload when the caller gives no bound.
const DefaultMaxRecord = 16 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendRecord appends payload, framed, to dst. An empty payload is
// invalid on read; callers never frame one.
func AppendRecord(dst, payload []byte) []byte {
	var h [RecordHeaderSize]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:8], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(h[8:12], crc32.Checksum(h[0:8], castagnoli))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// recState is what decodeAt found.
type recState uint8

const (
	recOK      recState = iota
	recShort            // fewer bytes than the header, or than the header's length
	recBadHead          // the header fails its checksum or its length is out of range
	recBadBody          // the header is good, the payload fails its checksum
)

// decodeAt decodes the record at the start of b: its payload (aliasing b)
// and framed size (also for recBadBody, whose extent the header gives).
func decodeAt(b []byte, max int) ([]byte, int, recState) {
	if len(b) < RecordHeaderSize {
		return nil, 0, recShort
	}
	if crc32.Checksum(b[0:8], castagnoli) != binary.LittleEndian.Uint32(b[8:12]) {
		return nil, 0, recBadHead
	}
	l := binary.LittleEndian.Uint32(b[0:4])
	if l == 0 || uint64(l) > uint64(max) {
		return nil, 0, recBadHead
	}
	if uint64(len(b)-RecordHeaderSize) < uint64(l) {
		return nil, 0, recShort
	}
	n := RecordHeaderSize + int(l)
	p := b[RecordHeaderSize:n]
	if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[4:8]) {
		return nil, n, recBadBody
	}
	return p, n, recOK
}

// Span is a byte range [Off, End) of a record region.
type Span struct{ Off, End int }

// Scan is what ScanRecords found in a record region.
type Scan struct {
	// Records is the number of intact records passed to fn.
	Records int
	// Damaged are the regions skipped between intact records: each is a
	// record whose checksum failed, or garbage up to the next intact record.
	Damaged []Span
	// End is where the last intact record ends; bytes after it (a torn
	// append, or damage that no intact record follows) are the tail.
	End int
}

// DamagedBytes is the total length of Damaged.
func (s *Scan) DamagedBytes() int {
	n := 0
	for _, d := range s.Damaged {
		n += d.End - d.Off
	}
	return n
}

// ScanRecords decodes the framed records in b (no magic) and calls fn with
// the offset and payload (aliasing b) of every intact one, in order. A
// damaged record is skipped: when its header is good the reader steps over
// exactly its length, otherwise it resynchronises on the next offset where
// an intact record starts. Work is linear in len(b) plus the payloads
// checked. max bounds a payload (≤ 0: DefaultMaxRecord). It never fails and
// never panics on any input.
func ScanRecords(b []byte, max int, fn func(off int, payload []byte)) Scan {
	if max <= 0 {
		max = DefaultMaxRecord
	}
	var s Scan
	off := 0
	for off < len(b) {
		p, n, st := decodeAt(b[off:], max)
		if st == recOK {
			fn(off, p)
			s.Records++
			off += n
			s.End = off
			continue
		}
		if st == recShort {
			break // a torn append: the tail
		}
		// Damage: find the next intact record.
		from := off + 1
		if st == recBadBody {
			from = off + n
		}
		next := resync(b, from, max)
		if next < 0 {
			break // nothing intact follows: the tail
		}
		s.Damaged = append(s.Damaged, Span{off, next})
		off = next
	}
	return s
}

// resync returns the first offset ≥ from where an intact record starts,
// or -1.
func resync(b []byte, from, max int) int {
	for q := from; q+RecordHeaderSize <= len(b); q++ {
		// Cheap filter first: a plausible length (the high byte of a
		// length under 16 MiB is zero).
		l := binary.LittleEndian.Uint32(b[q : q+4])
		if l == 0 || uint64(l) > uint64(max) {
			continue
		}
		if _, _, st := decodeAt(b[q:], max); st == recOK {
			return q
		}
	}
	return -1
}
