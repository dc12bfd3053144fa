package memory

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/clock"
)

// fakeShared is a shared store of the disk budget (the KV archive's role).
type fakeShared struct {
	mu    sync.Mutex
	bytes int64
	trims int
}

func (f *fakeShared) DiskBytes() int64 { f.mu.Lock(); defer f.mu.Unlock(); return f.bytes }
func (f *fakeShared) TrimDisk(max int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.trims++
	f.bytes = min(f.bytes, max)
}

func age(t *testing.T, s *Store, id string, d time.Duration) {
	t.Helper()
	when := time.Now().Add(-d)
	if err := os.Chtimes(sessionPath(s.opts.Dir, "t", id), when, when); err != nil {
		t.Fatal(err)
	}
}

func exists(s *Store, id string) bool {
	_, err := s.Session("t", id)
	return err == nil
}

// TestSessionTTL reproduces issue 12 row 16's first half: nothing on disk
// ever expired. Sessions not written for SessionTTL are deleted, loaded or
// not, log and index alike.
func TestSessionTTL(t *testing.T) {
	dir := t.TempDir()
	mod := func(o *Options) { o.Clock = clock.System; o.Storage.SessionTTL = time.Hour }
	s := openStore(t, dir, mod)
	for _, id := range []string{"old-loaded", "old-unloaded", "fresh"} {
		prepare(t, s, "t", id, ModeAppend, text("user", "hello "+id)).Complete(text("assistant", "hi"))
	}
	s.Close() // writes the index files
	s = openStore(t, dir, mod)
	exists(s, "old-loaded") // loaded again; the others stay on disk only
	age(t, s, "old-loaded", 2*time.Hour)
	age(t, s, "old-unloaded", 2*time.Hour)
	age(t, s, "fresh", 30*time.Minute)
	idx := strings.TrimSuffix(sessionPath(dir, "t", "old-unloaded"), ".log") + ".idx"
	os.WriteFile(idx, []byte("index"), 0o600) // as if it had units

	s.sweeper.Sweep(time.Now())
	if exists(s, "old-loaded") || exists(s, "old-unloaded") || !exists(s, "fresh") {
		t.Fatalf("after the sweep: old-loaded %v, old-unloaded %v, fresh %v",
			exists(s, "old-loaded"), exists(s, "old-unloaded"), exists(s, "fresh"))
	}
	if _, err := os.Stat(idx); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("index of an expired session: %v", err)
	}
	if st := s.Stats(); st.SessionsExpired != 2 || st.DiskBytes <= 0 {
		t.Fatalf("stats: expired %d, disk %d", st.SessionsExpired, st.DiskBytes)
	}
	// An expired session id starts afresh.
	prepare(t, s, "t", "old-loaded", ModeAppend, text("user", "back")).Abort()
	if v, _ := s.Session("t", "old-loaded"); messageTexts(v) != "back" {
		t.Fatalf("recreated session holds %q", messageTexts(v))
	}
	q, _ := os.ReadDir(filepath.Join(dir, "quarantine"))
	if len(q) != 0 {
		t.Fatal("expiry quarantined instead of deleting")
	}
}

// TestMaxDiskBytes: over the budget the shared store is trimmed first,
// then quarantined files, then the least recently written sessions go.
func TestMaxDiskBytes(t *testing.T) {
	dir := t.TempDir()
	shared := &fakeShared{bytes: 1 << 20}
	var budget int64 = 1 << 40 // set below once sizes are known
	open := func() *Store {
		return openStore(t, dir, func(o *Options) {
			o.Clock = clock.System
			o.Storage.Shared = shared
			o.Storage.MaxDiskBytes = budget
		})
	}
	s := open()
	const n = 20
	for i := range n {
		id := fmt.Sprintf("s%02d", i)
		prepare(t, s, "t", id, ModeAppend, text("user", strings.Repeat("word ", 200)+id)).Complete(text("assistant", "ok"))
	}
	// Closed before the logs are aged: nothing writes them afterwards.
	s.Close()
	s = open()
	for i := range n {
		age(t, s, fmt.Sprintf("s%02d", i), time.Duration(n-i)*time.Minute) // s00 oldest
	}
	os.MkdirAll(filepath.Join(dir, "quarantine"), 0o755)
	os.WriteFile(filepath.Join(dir, "quarantine", "damaged"), make([]byte, 4096), 0o600)
	s.sweeper.Sweep(time.Now())
	st := s.Stats()
	perSession := (st.DiskBytes - 4096) / n
	// Room for the sessions but half of them: everything else goes first.
	// The budget is an option of the sweep: the store opens again with it.
	budget = st.DiskBytes - 4096 - perSession*n/2 + perSession/2
	s.Close()
	s = open()
	s.sweeper.Sweep(time.Now())

	st = s.Stats()
	if shared.trims == 0 || shared.DiskBytes() != 0 {
		t.Fatalf("shared store not trimmed first: %d bytes, %d trims", shared.DiskBytes(), shared.trims)
	}
	if _, err := os.Stat(filepath.Join(dir, "quarantine", "damaged")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("quarantined file kept while over budget")
	}
	if st.DiskBytes+st.SharedDiskBytes > budget {
		t.Fatalf("usage %d + %d over budget %d", st.DiskBytes, st.SharedDiskBytes, budget)
	}
	gone := 0
	for i := range n {
		if !exists(s, fmt.Sprintf("s%02d", i)) {
			if i != gone {
				t.Fatalf("s%02d deleted before an older session", i)
			}
			gone++
		}
	}
	if gone == 0 || gone == n || st.SessionsEvicted != int64(gone) {
		t.Fatalf("%d sessions evicted (stat %d)", gone, st.SessionsEvicted)
	}
}

func TestSweepCleansTempsOrphansAndOldQuarantine(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, func(o *Options) { o.Clock = clock.System; o.Storage.QuarantineTTL = 24 * time.Hour })
	prepare(t, s, "t", "s", ModeAppend, text("user", "x")).Abort()
	log := sessionPath(dir, "t", "s")
	shard := filepath.Dir(log)
	old := time.Now().Add(-48 * time.Hour)
	files := map[string]bool{ // path → must survive
		filepath.Join(shard, ".abc.log.1.tmp"):              false,
		filepath.Join(shard, "0123456789abcdef.idx"):        false, // no log
		filepath.Join(dir, "quarantine", "old.damaged"):     false,
		filepath.Join(dir, "quarantine", "new.damaged"):     true,
		strings.TrimSuffix(log, ".log") + ".idx":            true,
		filepath.Join(filepath.Dir(shard), ".pool.x.2.tmp"): false,
		filepath.Join(filepath.Dir(shard), "pool-x.log"):    true,
	}
	os.MkdirAll(filepath.Join(dir, "quarantine"), 0o755)
	for p := range files {
		os.WriteFile(p, []byte("x"), 0o600)
		if !strings.HasPrefix(filepath.Base(p), "new") {
			os.Chtimes(p, old, old)
		}
	}
	os.Chtimes(log, old, old) // old but no TTL set: kept
	s.sweeper.Sweep(time.Now())
	for p, keep := range files {
		_, err := os.Stat(p)
		if keep != (err == nil) {
			t.Errorf("%s: kept %v, want %v", p, err == nil, keep)
		}
	}
	if !exists(s, "s") {
		t.Fatal("session deleted without a TTL")
	}
}

// TestRetentionRunsEverySweepPeriod: the Store's goroutine sweeps on its
// own (fake time, synctest).
func TestRetentionRunsEverySweepPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		s, err := Open(Options{Dir: dir, Fsync: FsyncNever, Storage: StorageOptions{MaxDiskBytes: 1, SweepEvery: time.Minute}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		prepare(t, s, "t", "s", ModeAppend, text("user", "x")).Abort()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if !exists(s, "s") {
			t.Fatal("swept before the period")
		}
		time.Sleep(31 * time.Second)
		synctest.Wait()
		if exists(s, "s") || s.Stats().SessionsEvicted != 1 {
			t.Fatalf("not swept after the period: evicted %d", s.Stats().SessionsEvicted)
		}
	})
}
