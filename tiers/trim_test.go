package tiers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestStoreTrimDisk: a shared disk budget trims the archive, least
// recently used blocks first, by plain deletion.
func TestStoreTrimDisk(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 10 {
		if err := s.Put(fmt.Sprintf("k%d", i), Value{Data: value(fmt.Sprint(i), 8000)}, PutOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
	}
	full := s.DiskBytes()
	if full < 10*8000 {
		t.Fatalf("DiskBytes %d after 10 blocks of 8000 bytes", full)
	}
	// k0 is read again: the most recently used.
	if _, _, err := s.archive.Get("k0"); err != nil {
		t.Fatal(err)
	}
	s.TrimDisk(full / 2)
	if got := s.DiskBytes(); got > full/2 {
		t.Fatalf("DiskBytes %d after TrimDisk(%d)", got, full/2)
	}
	if !s.archive.Contains("k0") || s.archive.Contains("k1") {
		t.Fatal("trim did not follow recency")
	}
	if _, _, err := s.archive.Get("k1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("trimmed block: %v", err)
	}
	n := 0
	filepath.Walk(filepath.Join(dir, "blocks"), func(_ string, fi os.FileInfo, _ error) error {
		if fi != nil && !fi.IsDir() {
			n++
		}
		return nil
	})
	if n != s.archive.Len() {
		t.Fatalf("%d block files for %d blocks", n, s.archive.Len())
	}
	q, _ := os.ReadDir(filepath.Join(dir, "quarantine"))
	if len(q) != 0 {
		t.Fatal("trim quarantined instead of deleting")
	}
}
