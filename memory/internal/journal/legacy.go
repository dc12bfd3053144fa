package journal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// Version 1 logs (magic "KVSMLOG1") framed each record as [u32 length][u32
// CRC-32C of the payload][payload], with no header checksum, so a reader
// could not resynchronise after damage. They are converted to the current
// framing when opened (convertLegacy).

const legacyHeaderSize = 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// LegacyRecords returns the payloads of a version 1 record region up to the
// first record that is short, oversized, zero-length or fails its CRC, and
// where that record starts.
func LegacyRecords(b []byte, maxPayload int) (payloads [][]byte, valid int) {
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

// convertLegacy rewrites a version 1 log in the current framing
// (atomically). A damaged version 1 tail cannot be resynchronised: it is
// cut, and the original kept in quarantine.
func (j *Journal) convertLegacy(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // Open reports it
	}
	head := make([]byte, len(LegacyMagic))
	_, rerr := f.ReadAt(head, 0)
	f.Close()
	if rerr != nil || !bytes.Equal(head, LegacyMagic) {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("memory: read version 1 log: %w", err)
	}
	payloads, valid := LegacyRecords(data[len(LegacyMagic):], j.o.MaxRecord)
	if len(LegacyMagic)+valid < len(data) && durable.MkdirAll(j.o.Quarantine, 0o755) == nil {
		name := filepath.Base(path) + "." + strconv.FormatInt(j.o.Now().UnixNano(), 10) + ".v1"
		_ = durable.WriteFile(filepath.Join(j.o.Quarantine, name), data)
	}
	if err := durable.WriteFile(path, Image(payloads...)); err != nil {
		return fmt.Errorf("memory: convert version 1 log: %w", err)
	}
	return nil
}
