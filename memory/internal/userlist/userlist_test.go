package userlist

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

// TestAddReadRewrite: ids come back in order and once; a torn append is
// skipped; Drop and Replace rewrite the list.
func TestAddReadRewrite(t *testing.T) {
	dir := t.TempDir()
	l := New(Options{Journal: journal.New(journal.Options{})})
	path := Path(filepath.Join(dir, "users", "u.uidx"))
	if ids, err := l.Read(path); err != nil || ids != nil {
		t.Fatalf("a missing list: %q, %v", ids, err)
	}
	for _, id := range []string{"a", "b", "a", "c"} {
		if err := l.Add(path, id); err != nil {
			t.Fatal(err)
		}
	}
	l.Sync()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{7, 0, 0, 0, 1}) // torn
	f.Close()
	if err := l.Add(path, "d"); err != nil {
		t.Fatal(err)
	}
	if ids, err := l.Read(path); err != nil || !slices.Equal(ids, []string{"a", "b", "c", "d"}) {
		t.Fatalf("Read = %q, %v", ids, err)
	}
	if err := l.Drop(path, map[string]bool{"b": true}); err != nil {
		t.Fatal(err)
	}
	if ids, _ := l.Read(path); !slices.Equal(ids, []string{"a", "c", "d"}) {
		t.Fatalf("after Drop: %q", ids)
	}
	if err := l.Replace(path, []string{"z"}); err != nil {
		t.Fatal(err)
	}
	if ids, _ := l.Read(path); !slices.Equal(ids, []string{"z"}) {
		t.Fatalf("after Replace: %q", ids)
	}
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Read(path); err == nil {
		t.Fatal("a list with a bad magic read without error")
	}
}
