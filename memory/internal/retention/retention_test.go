package retention

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestSweep: an expired session is handed to Remove, a busy one is kept
// for the next sweep, an old temporary file and an orphaned index go, and
// the disk is measured; Stop ends the goroutine.
func TestSweep(t *testing.T) {
	dir := t.TempDir()
	shard := filepath.Join(dir, "tenant", "ab")
	if err := os.MkdirAll(shard, 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	write := func(name string, age time.Duration) string {
		p := filepath.Join(shard, name)
		if err := os.WriteFile(p, make([]byte, 100), 0o600); err != nil {
			t.Fatal(err)
		}
		when := now.Add(-age)
		os.Chtimes(p, when, when)
		return p
	}
	old, busy, fresh := write("old.log", 3*time.Hour), write("busy.log", 3*time.Hour), write("fresh.log", time.Minute)
	orphan, tmp := write("gone.idx", 3*time.Hour), write(".x.log.1.tmp", 3*time.Hour)
	var removed []string
	sw := Start(Options{Dir: dir, Quarantine: "quarantine", SessionTTL: time.Hour, QuarantineTTL: time.Hour,
		Every: time.Hour, IndexGrace: time.Minute, Now: time.Now,
		Remove: func(path string) bool {
			removed = append(removed, path)
			if path == busy {
				return false
			}
			return os.Remove(path) == nil
		}})
	defer sw.Stop(context.Background())
	sw.Sweep(now)
	slices.Sort(removed)
	if want := []string{busy, old}; !slices.Equal(removed, want) {
		t.Fatalf("Remove called for %q, want %q", removed, want)
	}
	for _, p := range []string{orphan, tmp} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s kept", filepath.Base(p))
		}
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatal("a fresh session was deleted")
	}
	if st := sw.Stats(); st.SessionsExpired != 1 || st.DiskBytes != 200 {
		t.Fatalf("Stats = %+v, want 1 expired, 200 bytes (busy and fresh)", st)
	}
	if !sw.Stop(context.Background()) || !sw.Stop(context.Background()) {
		t.Fatal("Stop did not end the goroutine")
	}
}
