package memory

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Record framing: [u32 little-endian payload length][u32 little-endian
// CRC32C of the payload][payload]. A zero length is invalid, so a region of
// zeros (what some filesystems show after a crash) never decodes as records.
const recordHeaderSize = 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendRecord appends the framed payload to dst.
func appendRecord(dst, payload []byte) []byte {
	var h [recordHeaderSize]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:8], crc32.Checksum(payload, castagnoli))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// decodeRecord decodes the record at the start of b. It returns the payload
// (aliasing b) and the record's framed size. A short b is a torn record
// (errTorn); a bad length or CRC is ErrCorrupt. maxPayload bounds the length.
func decodeRecord(b []byte, maxPayload int) (payload []byte, n int, err error) {
	if len(b) < recordHeaderSize {
		return nil, 0, errTorn
	}
	l := binary.LittleEndian.Uint32(b[0:4])
	if l == 0 || uint64(l) > uint64(maxPayload) {
		return nil, 0, fmt.Errorf("%w: length %d", ErrCorrupt, l)
	}
	if uint64(len(b)-recordHeaderSize) < uint64(l) {
		return nil, 0, errTorn
	}
	payload = b[recordHeaderSize : recordHeaderSize+int(l)]
	if got, want := crc32.Checksum(payload, castagnoli), binary.LittleEndian.Uint32(b[4:8]); got != want {
		return nil, 0, fmt.Errorf("%w: crc %08x, want %08x", ErrCorrupt, got, want)
	}
	return payload, recordHeaderSize + int(l), nil
}

var errTorn = fmt.Errorf("%w: torn record", ErrCorrupt)

// scanRecords decodes records from b until the end or the first bad record.
// It calls fn for each payload and returns the length of the valid prefix
// and the error that stopped it (nil when all of b was valid).
func scanRecords(b []byte, maxPayload int, fn func(payload []byte) error) (valid int, err error) {
	for valid < len(b) {
		p, n, err := decodeRecord(b[valid:], maxPayload)
		if err != nil {
			return valid, err
		}
		if err := fn(p); err != nil {
			return valid, err
		}
		valid += n
	}
	return valid, nil
}
