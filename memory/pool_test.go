package memory

import (
	"encoding/json"
	"errors"
	"os"
	"testing"
)

func ver(v uint64) *uint64 { return &v }

func TestPoolVersionsAndConflicts(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	put := func(key, val string, exp *uint64, sess string) (PoolEntry, error) {
		return s.PoolPut("t", key, PoolWrite{Value: json.RawMessage(val), ExpectedVersion: exp, Session: sess,
			Metadata: map[string]string{"by": sess}})
	}
	a, err := put("plan", `{"step": 1}`, ver(0), "s1") // create only
	if err != nil || a.Version != 1 || a.Creator != "s1" || string(a.Value) != `{"step":1}` {
		t.Fatalf("create: %+v %v", a, err)
	}
	if _, err := put("plan", `2`, ver(0), "s2"); !errors.Is(err, ErrConflict) {
		t.Fatalf("create over existing: %v", err)
	}
	b, err := put("plan", `{"step":2}`, ver(1), "s2")
	if err != nil || b.Version != 2 || b.Creator != "s1" || b.Updater != "s2" || !b.CreatedAt.Equal(a.CreatedAt) || !b.UpdatedAt.After(a.UpdatedAt) {
		t.Fatalf("conditional update: %+v %v", b, err)
	}
	cur, err := put("plan", `3`, ver(1), "s3") // stale version
	if !errors.Is(err, ErrConflict) || cur.Version != 2 {
		t.Fatalf("stale write: %+v %v", cur, err)
	}
	c, err := put("plan", `3`, nil, "s3") // last writer wins
	if err != nil || c.Version != 3 || c.Metadata["by"] != "s3" {
		t.Fatalf("unconditional: %+v %v", c, err)
	}
	if err := s.PoolDelete("t", "plan", 2); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale delete: %v", err)
	}
	if err := s.PoolDelete("t", "plan", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PoolGet("t", "plan"); !errors.Is(err, ErrKeyNotFound) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("get deleted: %v", err)
	}
	if err := s.PoolDelete("t", "plan", 0); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("delete missing: %v", err)
	}
	// Re-created keys never reuse a version (no ABA).
	d, err := put("plan", `4`, ver(0), "s4")
	if err != nil || d.Version <= c.Version {
		t.Fatalf("re-create: %+v %v", d, err)
	}
	if st := s.Stats(); st.PoolConflicts != 3 {
		t.Fatalf("conflicts %d", st.PoolConflicts)
	}
	for _, bad := range []PoolWrite{{}, {Value: json.RawMessage(`{`)}, {Value: json.RawMessage(`1`), Session: "a\x00b"}} {
		if _, err := s.PoolPut("t", "k", bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("bad write %+v: %v", bad, err)
		}
	}
	if _, err := s.PoolPut("t", "", PoolWrite{Value: json.RawMessage(`1`)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty key: %v", err)
	}
}

func TestPoolPrefixListingAndTenants(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	for _, k := range []string{"task/b", "task/a", "note/x", "task/c", "tas"} {
		if _, err := s.PoolPut("t", k, PoolWrite{Value: json.RawMessage(`"` + k + `"`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PoolPut("other", "task/z", PoolWrite{Value: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	keys := func(es []PoolEntry) (out []string) {
		for _, e := range es {
			out = append(out, e.Key)
		}
		return out
	}
	got, _ := s.PoolList("t", "task/", 0)
	if want := []string{"task/a", "task/b", "task/c"}; !equalStrings(keys(got), want) {
		t.Fatalf("prefix list %v, want %v", keys(got), want)
	}
	got, _ = s.PoolList("t", "task/", 2)
	if want := []string{"task/a", "task/b"}; !equalStrings(keys(got), want) {
		t.Fatalf("limited list %v", keys(got))
	}
	got, _ = s.PoolList("t", "", 0)
	if len(got) != 5 {
		t.Fatalf("all: %v", keys(got))
	}
	if _, err := s.PoolGet("other", "task/a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("tenant leak: %v", err)
	}
	got, _ = s.PoolList("nobody", "", 0)
	if got == nil || len(got) != 0 {
		t.Fatalf("empty pool list %v", got)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPoolDurableAndTornTail: entries survive a restart; a torn last record
// is cut and the acknowledged ones kept; versions keep growing.
func TestPoolDurableAndTornTail(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	var last PoolEntry
	for i, k := range []string{"a", "b", "c", "a"} {
		e, err := s.PoolPut("t", k, PoolWrite{Value: json.RawMessage(`1`), Session: "s", Metadata: map[string]string{"i": string(rune('0' + i))}})
		if err != nil {
			t.Fatal(err)
		}
		last = e
	}
	if err := s.PoolDelete("t", "b", 0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	f, err := os.OpenFile(poolPath(dir, "t"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{200, 0, 0, 0, 1, 2, 3}) // a torn record
	f.Close()
	s = openStore(t, dir, nil)
	got, err := s.PoolList("t", "", 0)
	if err != nil || len(got) != 2 || got[0].Key != "a" || got[0].Version != last.Version || got[0].Metadata["i"] != "3" ||
		!got[0].CreatedAt.Equal(last.CreatedAt) {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if s.Stats().Quarantined != 1 {
		t.Fatalf("torn tail not reported")
	}
	e, err := s.PoolPut("t", "b", PoolWrite{Value: json.RawMessage(`2`), ExpectedVersion: ver(0)})
	if err != nil || e.Version != last.Version+2 {
		t.Fatalf("version after restart %d, want %d (%v)", e.Version, last.Version+2, err)
	}
}

// TestPoolCompaction: a log of mostly overwritten records is compacted on
// open without losing entries or versions.
func TestPoolCompaction(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	var last PoolEntry
	for range 1100 {
		last, _ = s.PoolPut("t", "k", PoolWrite{Value: json.RawMessage(`{"big":"value"}`)})
	}
	s.Close()
	before, _ := os.Stat(poolPath(dir, "t"))
	s = openStore(t, dir, nil)
	e, err := s.PoolGet("t", "k")
	after, _ := os.Stat(poolPath(dir, "t"))
	if err != nil || e.Version != last.Version || after.Size() >= before.Size()/10 {
		t.Fatalf("compaction: %+v %v, size %d → %d", e, err, before.Size(), after.Size())
	}
	e, _ = s.PoolPut("t", "k", PoolWrite{Value: json.RawMessage(`1`)})
	s.Close()
	s = openStore(t, dir, nil)
	if g, _ := s.PoolGet("t", "k"); g.Version != e.Version || string(g.Value) != "1" {
		t.Fatalf("after compaction and write: %+v", g)
	}
}
