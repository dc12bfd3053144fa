package memory

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// Records are framed by package durable (length, payload CRC-32C, header
// CRC-32C); see durable.AppendRecord.

// appendRecord appends the framed payload to dst.
func appendRecord(dst, payload []byte) []byte { return durable.AppendRecord(dst, payload) }

// Version 1 logs (magic "KVSMLOG1") framed each record as [u32 length][u32
// CRC-32C of the payload][payload], with no header checksum, so a reader
// could not resynchronise after damage. They are converted to the current
// framing when opened (legacyRecords).

const legacyHeaderSize = 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// legacyRecords returns the payloads of a version 1 record region up to the
// first record that is short, oversized, zero-length or fails its CRC, and
// where that record starts.
func legacyRecords(b []byte, maxPayload int) (payloads [][]byte, valid int) {
	for valid+legacyHeaderSize <= len(b) {
		l := binary.LittleEndian.Uint32(b[valid : valid+4])
		if l == 0 || uint64(l) > uint64(maxPayload) || uint64(len(b)-valid-legacyHeaderSize) < uint64(l) {
			break
		}
		p := b[valid+legacyHeaderSize : valid+legacyHeaderSize+int(l)]
		if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[valid+4:valid+8]) {
			break
		}
		payloads = append(payloads, p)
		valid += legacyHeaderSize + int(l)
	}
	return payloads, valid
}
