package hctx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

func sample() []byte {
	return Append(nil,
		Section{KindManifest, []byte(`{"session":"s1"}`)},
		Section{KindMemory, bytes.Repeat([]byte("memory "), 40)},
		Section{KindEngine, []byte{0, 1, 2, 3, 255}},
	)
}

func TestRoundTrip(t *testing.T) {
	b := sample()
	if len(b) != Size(Section{KindManifest, []byte(`{"session":"s1"}`)}, Section{KindMemory, bytes.Repeat([]byte("memory "), 40)}, Section{KindEngine, []byte{0, 1, 2, 3, 255}}) {
		t.Fatalf("Size disagrees with Append: %d", len(b))
	}
	secs, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(secs) != 3 || secs[0].Kind != KindManifest || string(secs[0].Data) != `{"session":"s1"}` ||
		!bytes.Equal(secs[1].Data, bytes.Repeat([]byte("memory "), 40)) || !bytes.Equal(secs[2].Data, []byte{0, 1, 2, 3, 255}) {
		t.Fatalf("sections %+v", secs)
	}
	if d, ok := Find(secs, KindEngine); !ok || len(d) != 5 {
		t.Fatal("Find")
	}
	if _, ok := Find(secs[:1], KindEngine); ok {
		t.Fatal("Find found a missing section")
	}
	// Empty sections and no sections are fine; Append appends.
	e := Append([]byte("x"), Section{KindMemory, nil})
	if secs, err := Parse(e[1:]); err != nil || len(secs) != 1 || len(secs[0].Data) != 0 {
		t.Fatalf("empty section: %v %+v", err, secs)
	}
	if secs, err := Parse(Append(nil)); err != nil || len(secs) != 0 {
		t.Fatalf("no section: %v %+v", err, secs)
	}
}

// Any damage is refused whole: every single-bit flip, every cut, bytes
// appended, and sections repeated.
func TestDamageRefusedWhole(t *testing.T) {
	b := sample()
	mustCorrupt := func(what string, x []byte) {
		t.Helper()
		secs, err := Parse(x)
		if err == nil || !errors.Is(err, durable.ErrCorrupt) || secs != nil {
			t.Fatalf("%s: accepted (%v, %d sections)", what, err, len(secs))
		}
	}
	for i := range b {
		for bit := range 8 {
			x := bytes.Clone(b)
			x[i] ^= 1 << bit // a version byte too: the header checksum catches it
			mustCorrupt("flip", x)
		}
	}
	for n := range len(b) {
		mustCorrupt("cut", b[:n])
	}
	mustCorrupt("extended", append(bytes.Clone(b), 0))
	mustCorrupt("repeated", Append(nil, Section{KindMemory, []byte("a")}, Section{KindMemory, []byte("b")}))
	mustCorrupt("other file", []byte("KVSMLOG2 and more bytes than a header"))
}

// reseal rewrites the header and file checksums of b after an edit, as a
// forger would: only the structural checks are left to catch it.
func reseal(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[12:16], crc32.Checksum(b[:12], castagnoli))
	body := len(b) - trailerSize
	binary.LittleEndian.PutUint32(b[body:], crc32.Checksum(b[:body], castagnoli))
	return b
}

func TestStructureChecked(t *testing.T) {
	b := sample()
	v := bytes.Clone(b)
	binary.LittleEndian.PutUint16(v[4:6], Version+1)
	if _, err := Parse(reseal(v)); !errors.Is(err, ErrVersion) {
		t.Fatalf("newer version: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func([]byte)
	}{
		{"version 0", func(x []byte) { binary.LittleEndian.PutUint16(x[4:6], 0) }},
		{"flags", func(x []byte) { binary.LittleEndian.PutUint16(x[6:8], 1) }},
		{"too many sections", func(x []byte) { binary.LittleEndian.PutUint32(x[8:12], MaxSections+1) }},
		{"fewer sections than bytes", func(x []byte) { binary.LittleEndian.PutUint32(x[8:12], 2) }},
		{"more sections than bytes", func(x []byte) { binary.LittleEndian.PutUint32(x[8:12], 4) }},
		{"huge section", func(x []byte) { binary.LittleEndian.PutUint64(x[headerSize+8:], 1<<62) }},
	} {
		x := reseal(func() []byte { x := bytes.Clone(b); tc.edit(x); return x }())
		if _, err := Parse(x); !errors.Is(err, durable.ErrCorrupt) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	// An unknown kind is skipped once its checksum passed.
	u := Append(nil, Section{KindMemory, []byte("m")}, Section{Kind(99), []byte("future")})
	if secs, err := Parse(u); err != nil || len(secs) != 1 || secs[0].Kind != KindMemory {
		t.Fatalf("unknown kind: %v %+v", err, secs)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sample())
	f.Add(Append(nil))
	f.Add(Append(nil, Section{KindMemory, []byte("m")}, Section{Kind(7), nil}))
	f.Add([]byte("HCTX"))
	f.Fuzz(func(t *testing.T, b []byte) {
		secs, err := Parse(b)
		if err != nil {
			if secs != nil {
				t.Fatal("sections with an error")
			}
			return
		}
		// What parses re-encodes to the same bytes (for files without
		// unknown kinds).
		n := Size(secs...)
		if n > len(b) {
			t.Fatalf("sections of %d bytes from a %d-byte file", n, len(b))
		}
		if n == len(b) && !bytes.Equal(Append(nil, secs...), b) {
			t.Fatal("re-encoding differs")
		}
	})
}
