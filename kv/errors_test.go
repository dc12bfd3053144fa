package kv

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// TestErrorsNameEachPackageOnce: messages used to stack ("kv: get blob: kv:
// not found: tiers: get: tiers: not found").
func TestErrorsNameEachPackageOnce(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, Options{Store: tiers.Options{Dir: dir}})
	_, _, _, err := c.GetBlob("ns", "missing")
	if !errors.Is(err, ErrNotFound) || err.Error() != "kv: not found: blob ns/missing" {
		t.Fatalf("missing blob: %q", err)
	}
	if _, _, err := c.StatBlob("ns", "missing"); err == nil || err.Error() != "kv: not found: blob ns/missing" {
		t.Fatalf("stat: %q", err)
	}
	if err := c.DeleteBlob("ns", "missing"); err == nil || err.Error() != "kv: not found: blob ns/missing" {
		t.Fatalf("delete: %q", err)
	}

	// A corrupt archive file: not found, marked corrupt, each prefix once.
	if err := c.PutBlob("ns", "bad", BlobMeta{}, []byte(strings.Repeat("payload ", 100))); err != nil {
		t.Fatal(err)
	}
	c.Close()
	var file string
	filepath.Walk(filepath.Join(dir, "blocks"), func(p string, fi os.FileInfo, _ error) error {
		if fi != nil && strings.HasSuffix(p, ".kva") {
			file = p
		}
		return nil
	})
	data, _ := os.ReadFile(file)
	data[len(data)-10] ^= 0xff
	os.WriteFile(file, data, 0o600)
	c = openCache(t, Options{Store: tiers.Options{Dir: dir}})
	_, _, _, err = c.GetBlob("ns", "bad")
	if !errors.Is(err, ErrNotFound) || !errors.Is(err, durable.ErrCorrupt) {
		t.Fatalf("corrupt blob: %v", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "kv: not found: blob ns/bad: tiers: corrupt block: ") ||
		strings.Count(msg, "kv:") != 1 || strings.Count(msg, "tiers:") != 1 || strings.Contains(msg, "not found: tiers") && strings.Count(msg, "not found") != 1 {
		t.Fatalf("corrupt blob message: %q", msg)
	}
}
