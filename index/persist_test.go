package index

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

func savedIndex(t *testing.T) (*Index, string) {
	t.Helper()
	x := newTestIndex(t, Options{}, pets...)
	if err := x.UpdateMeta("d1", Meta{Time: time.Unix(1700000000, 5).UTC(), Importance: 2.5, AccessCount: 7}); err != nil {
		t.Fatal(err)
	}
	x.Add(ctx, Doc{ID: "empty", Text: "the and of"}) // no terms, zero vector
	x.Delete("d3")
	path := filepath.Join(t.TempDir(), "index.bin")
	if err := x.Save(path); err != nil {
		t.Fatal(err)
	}
	return x, path
}

func TestSaveLoadRoundTrip(t *testing.T) {
	x, path := savedIndex(t)
	y, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if y.Len() != x.Len() {
		t.Fatalf("len %d, want %d", y.Len(), x.Len())
	}
	for _, id := range []string{"d0", "d1", "d2", "d4", "empty"} {
		a, _ := x.Get(id)
		b, ok := y.Get(id)
		if !ok || a.Text != b.Text || !a.Meta.Time.Equal(b.Meta.Time) || a.Meta.Importance != b.Meta.Importance ||
			a.Meta.AccessCount != b.Meta.AccessCount || !slices.Equal(a.Vector, b.Vector) {
			t.Errorf("%s: got %+v, want %+v", id, b, a)
		}
	}
	if _, ok := y.Get("d3"); ok {
		t.Error("deleted d3 came back")
	}
	for _, mode := range []Mode{ModeBM25, ModeVector, ModeHybrid} {
		a, _ := x.Search(ctx, "Caroline support group", 5, mode)
		b, _ := y.Search(ctx, "Caroline support group", 5, mode)
		if !slices.Equal(ids(a), ids(b)) {
			t.Errorf("%v: %v after load, %v before", mode, ids(b), ids(a))
		}
	}
	// Saving again over the file works and leaves no temporary files.
	if err := y.Save(path); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("folder holds %d entries", len(entries))
	}
}

func TestLoadFailuresAreErrCorrupt(t *testing.T) {
	_, path := savedIndex(t)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	write := func(b []byte) string {
		p := filepath.Join(t.TempDir(), "bad.bin")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := slices.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	cases := map[string]string{
		"flipped bit": write(flipped),
		"truncated":   write(good[:len(good)-9]),
		"empty":       write(nil),
		"garbage":     write([]byte("not an index at all, just text")),
	}
	for name, p := range cases {
		if _, err := Load(p, Options{}); !errors.Is(err, durable.ErrCorrupt) {
			t.Errorf("%s: %v, want durable.ErrCorrupt", name, err)
		}
	}
	_, err = Load(filepath.Join(t.TempDir(), "missing.bin"), Options{})
	if !errors.Is(err, durable.ErrCorrupt) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	_, err = Load(path, Options{Embedder: NewHashEmbedder(HashOptions{Dim: 256})})
	if !errors.Is(err, durable.ErrCorrupt) {
		t.Errorf("other embedder: %v", err)
	}
}

func TestRebuildAfterCorruption(t *testing.T) {
	x, path := savedIndex(t)
	os.WriteFile(path, []byte("junk"), 0o600)
	y, err := Load(path, Options{})
	if !errors.Is(err, durable.ErrCorrupt) || y != nil {
		t.Fatalf("Load: %v", err)
	}
	y, err = New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []Doc
	for _, id := range []string{"d0", "d1", "d2", "d4"} {
		d, _ := x.Get(id)
		d.Vector = nil // the owner keeps texts; vectors are recomputed
		docs = append(docs, d)
	}
	if err := y.Rebuild(ctx, docs); err != nil {
		t.Fatal(err)
	}
	a, _ := x.Search(ctx, "adoption agencies", 3, ModeHybrid)
	b, _ := y.Search(ctx, "adoption agencies", 3, ModeHybrid)
	if len(b) == 0 || a[0].ID != b[0].ID {
		t.Errorf("after rebuild %v, before %v", ids(b), ids(a))
	}
	// Rebuild replaces everything.
	if err := y.Rebuild(ctx, []Doc{{ID: "only", Text: "one"}}); err != nil || y.Len() != 1 {
		t.Fatalf("rebuild: %v, len %d", err, y.Len())
	}
}

func TestSaveToMissingFolderFails(t *testing.T) {
	x := newTestIndex(t, Options{}, pets...)
	if err := x.Save(filepath.Join(t.TempDir(), "no", "such", "dir", "i.bin")); err == nil {
		t.Fatal("no error")
	}
}
