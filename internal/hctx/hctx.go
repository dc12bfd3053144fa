package hctx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// Version is the format version this package writes and the newest it
// reads.
const Version = 1

// Magic starts every snapshot file; trailerMagic ends it.
const (
	Magic        = "HCTX"
	trailerMagic = "XTCH"
)

const (
	headerSize  = 16
	sectionHead = 16
	trailerSize = 8
)

// MaxSections bounds the sections of one file.
const MaxSections = 64

// Kind names what a section holds.
type Kind uint32

// The sections of version 1.
const (
	// KindManifest is a JSON object saying what the file holds (written by
	// the proxy), for people and tools; importers check the sections
	// themselves.
	KindManifest Kind = 1
	// KindMemory is the session's memory, written and read by package
	// memory (Store.ExportSession, Store.ImportSession).
	KindMemory Kind = 2
	// KindEngine is the session's engine KV states, written and read by
	// the engine connector (package engine).
	KindEngine Kind = 3
)

func (k Kind) String() string {
	switch k {
	case KindManifest:
		return "manifest"
	case KindMemory:
		return "memory"
	case KindEngine:
		return "engine"
	}
	return fmt.Sprintf("kind %d", uint32(k))
}

// Section is one typed payload of a file.
type Section struct {
	Kind Kind
	Data []byte
}

var (
	// ErrVersion: the file was written by a newer format version.
	ErrVersion = errors.New("hctx: snapshot of a newer format version")
	// errCorrupt marks a damaged or truncated file; callers match
	// durable.ErrCorrupt.
	errCorrupt = durable.NewCorrupt("hctx: damaged or truncated snapshot")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Size returns the bytes Append writes for sections.
func Size(sections ...Section) int {
	n := headerSize + trailerSize
	for _, s := range sections {
		n += sectionHead + len(s.Data)
	}
	return n
}

// Append appends a file holding sections, in order, to dst. At most
// MaxSections sections, each kind at most once (Parse refuses others).
func Append(dst []byte, sections ...Section) []byte {
	start := len(dst)
	if cap(dst)-len(dst) < Size(sections...) {
		dst = append(make([]byte, 0, len(dst)+Size(sections...)), dst...)
	}
	dst = append(dst, Magic...)
	dst = binary.LittleEndian.AppendUint16(dst, Version)
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(sections)))
	dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:start+12], castagnoli))
	for _, s := range sections {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(s.Kind))
		dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(s.Data, castagnoli))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(len(s.Data)))
		dst = append(dst, s.Data...)
	}
	dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
	return append(dst, trailerMagic...)
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errCorrupt}, args...)...)
}

// Parse checks a whole file and returns its sections of known kinds, in
// file order; their Data alias b. See the package documentation for what
// it refuses.
func Parse(b []byte) ([]Section, error) {
	if len(b) < headerSize+trailerSize || string(b[:4]) != Magic {
		if len(b) >= 4 && string(b[:4]) != Magic {
			return nil, corrupt("not a snapshot file (no %q magic)", Magic)
		}
		return nil, corrupt("%d bytes, shorter than an empty snapshot", len(b))
	}
	if crc32.Checksum(b[:12], castagnoli) != binary.LittleEndian.Uint32(b[12:16]) {
		return nil, corrupt("header checksum mismatch")
	}
	if v := binary.LittleEndian.Uint16(b[4:6]); v != Version {
		if v > Version {
			return nil, fmt.Errorf("%w: version %d, this sidecar reads version %d", ErrVersion, v, Version)
		}
		return nil, corrupt("version %d", v)
	}
	if f := binary.LittleEndian.Uint16(b[6:8]); f != 0 {
		return nil, corrupt("unknown flags %#x", f)
	}
	count := binary.LittleEndian.Uint32(b[8:12])
	if count > MaxSections {
		return nil, corrupt("%d sections, at most %d", count, MaxSections)
	}
	body := len(b) - trailerSize
	if string(b[body+4:]) != trailerMagic {
		return nil, corrupt("no trailer: the file was cut or extended")
	}
	if crc32.Checksum(b[:body], castagnoli) != binary.LittleEndian.Uint32(b[body:body+4]) {
		return nil, corrupt("file checksum mismatch")
	}
	var (
		out  []Section
		seen = map[Kind]bool{}
		off  = headerSize
	)
	for i := range count {
		if body-off < sectionHead {
			return nil, corrupt("section %d of %d cut", i+1, count)
		}
		kind := Kind(binary.LittleEndian.Uint32(b[off:]))
		sum := binary.LittleEndian.Uint32(b[off+4:])
		n := binary.LittleEndian.Uint64(b[off+8:])
		off += sectionHead
		if n > uint64(body-off) {
			return nil, corrupt("section %d (%s) claims %d bytes, %d left", i+1, kind, n, body-off)
		}
		data := b[off : off+int(n)]
		off += int(n)
		if crc32.Checksum(data, castagnoli) != sum {
			return nil, corrupt("section %d (%s) checksum mismatch", i+1, kind)
		}
		if seen[kind] {
			return nil, corrupt("section %s repeated", kind)
		}
		seen[kind] = true
		if kind >= KindManifest && kind <= KindEngine {
			out = append(out, Section{Kind: kind, Data: data})
		}
	}
	if off != body {
		return nil, corrupt("%d bytes between the last section and the trailer", body-off)
	}
	return out, nil
}

// Find returns the data of the section of kind k, and whether there is
// one.
func Find(sections []Section, k Kind) ([]byte, bool) {
	for _, s := range sections {
		if s.Kind == k {
			return s.Data, true
		}
	}
	return nil, false
}
