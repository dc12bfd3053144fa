package reviewlog

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

func open(t *testing.T, dir string) *Logs {
	t.Helper()
	j := journal.New(journal.Options{Quarantine: filepath.Join(dir, "quarantine"), SyncAppends: true})
	ls := New(Options{Dir: dir, Journal: j, Size: 3})
	t.Cleanup(func() { ls.Close() })
	return ls
}

// TestBoundedAndRepaired: the decisions log keeps the newest Size
// decisions (compacted on disk), survives a torn tail, and a log copied
// from another scope is set aside.
func TestBoundedAndRepaired(t *testing.T) {
	dir := t.TempDir()
	ls := open(t, dir)
	for i := range 8 {
		if err := ls.Append("t", "u", Review{FactID: "fact-" + string(rune('a'+i)), Decision: "keep", At: time.Unix(int64(i), 0).UTC()}); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(ls *Logs, user string) string {
		t.Helper()
		rs, err := ls.List("t", user, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.FactID)
		}
		return strings.Join(out, " ")
	}
	if got := ids(ls, "u"); got != "fact-h fact-g fact-f" {
		t.Fatalf("kept %q", got)
	}
	if l, _ := ls.get("t", "u"); l.records > 2*3 {
		t.Fatalf("%d records on disk, want at most 6", l.records)
	}
	ls.Close()
	path := logPath(dir, "t", "u")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{0x20, 0, 0, 0, 1, 2}) // a torn record
	f.Close()
	ls = open(t, dir)
	if got := ids(ls, "u"); got != "fact-h fact-g fact-f" {
		t.Fatalf("after a torn tail: %q", got)
	}
	ls.Close()
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(logPath(dir, "t", "v"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ls = open(t, dir)
	if got := ids(ls, "v"); got != "" {
		t.Fatalf("another user's log served: %q", got)
	}
	if _, err := os.Stat(logPath(dir, "t", "v")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the foreign log was not set aside: %v", err)
	}
}
