package remote

import (
	"bytes"
	"errors"
	"testing"
)

func TestManifestRoundTrip(t *testing.T) {
	for _, m := range []*manifest{
		{gen: 1, size: 0, chunk: 1024},
		{gen: 2, size: 1, chunk: 1024, aux: []byte("x"), crcs: []uint32{7}},
		{gen: 3, size: 5000, chunk: 1024, aux: bytes.Repeat([]byte("a"), MaxAux), crcs: []uint32{1, 2, 3, 4, 5}},
	} {
		got, err := parseManifest(m.encode())
		if err != nil {
			t.Fatal(err)
		}
		if got.gen != m.gen || got.size != m.size || got.chunk != m.chunk || !bytes.Equal(got.aux, m.aux) || len(got.crcs) != len(m.crcs) {
			t.Fatalf("round trip: %+v != %+v", got, m)
		}
	}
	// A size that disagrees with the chunk count is refused even with a
	// valid checksum.
	if _, err := parseManifest((&manifest{gen: 1, size: 5000, chunk: 1024, crcs: []uint32{1}}).encode()); !errors.Is(err, errCorrupt) {
		t.Fatalf("inconsistent manifest: %v", err)
	}
}

// FuzzParseManifest: whatever the store hands back, parsing never panics,
// and what it accepts encodes back to the same bytes.
func FuzzParseManifest(f *testing.F) {
	f.Add((&manifest{gen: 9, size: 3000, chunk: 1024, aux: []byte("meta"), crcs: []uint32{1, 2, 3}}).encode())
	f.Add([]byte("KVRB\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManifest(b)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("error not marked corrupt: %v", err)
			}
			return
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatal("accepted bytes do not re-encode to themselves")
		}
	})
}
