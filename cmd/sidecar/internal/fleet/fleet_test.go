package fleet_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver/redistest"
	"github.com/kvsidecar/kvsidecar/cmd/sidecar/internal/fleet"
	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/remote"
)

var ctx = context.Background()

func open(t *testing.T, srv *redisserver.Server, owner string) *fleet.Fleet {
	t.Helper()
	st, err := remote.Open(ctx, remote.Options{URL: srv.URL(), Owner: owner, LeaseTTL: 300 * time.Millisecond, Timeout: 3 * time.Second}) // the per-call timeout: AOF fsyncs on a loaded machine take longer than the lease
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f, err := fleet.New(fleet.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A turn waits for the other replica's turn on the same session, and
// gives up with ErrBusy only after LeaseWait; its writes are fenced by the
// lease it holds.
func TestAcquireWaitsAndFences(t *testing.T) {
	srv := redistest.Start(t, redisserver.Options{})
	a, b := open(t, srv, "10.0.0.1:1"), open(t, srv, "10.0.0.2:1")
	release, err := a.Acquire(ctx, "t1", "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Log().Append(ctx, "t1", "s", 0, [][]byte{[]byte("r0")}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		rel, err := b.Acquire(ctx, "t1", "s")
		if err == nil {
			_, err = b.Log().Append(ctx, "t1", "s", 1, [][]byte{[]byte("r1")})
			rel()
		}
		done <- err
	}()
	release()
	if err := <-done; err != nil {
		t.Fatalf("b's turn after a released: %v", err)
	}
	// Positions are checked: a stale writer gets memory's conflict.
	if _, err := a.Log().Append(ctx, "t1", "s", 1, [][]byte{[]byte("other")}); !errors.Is(err, memory.ErrSharedConflict) {
		t.Fatalf("stale append: %v", err)
	}
	// A holder that never releases: the other waits LeaseWait (twice the
	// lease TTL, during which the holder's store renews it) and is told.
	if _, err := a.Acquire(ctx, "t1", "busy"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "t1", "busy"); !errors.Is(err, fleet.ErrBusy) {
		t.Fatalf("b while a holds the lease: %v", err)
	}
	if st := b.Stats(); st.LeasesAcquired != 1 || st.Durability != "aof appendfsync=always" {
		t.Fatalf("stats %+v", st)
	}
}

// A store that cannot be reached does not stop a turn.
func TestAcquireWithTheStoreDown(t *testing.T) {
	srv := redistest.Start(t, redisserver.Options{})
	a := open(t, srv, "10.0.0.1:1")
	srv.Kill()
	release, err := a.Acquire(ctx, "t1", "s")
	if err != nil || release == nil {
		t.Fatalf("acquire with the store down: %v", err)
	}
	release()
	if st := a.Stats(); st.Degraded != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Engine states: stored with their metadata, found by the longest prefix,
// gone ones reported as engine.ErrSharedNotFound.
func TestStates(t *testing.T) {
	srv := redistest.Start(t, redisserver.Options{})
	s := open(t, srv, "10.0.0.1:1").States()
	if err := s.PutState(ctx, "fp1", "id1", []string{"a", "b"}, []byte("raw1"), []byte("meta1")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutState(ctx, "fp1", "id2", []string{"a", "b", "c"}, []byte("raw2"), []byte("meta2")); err != nil {
		t.Fatal(err)
	}
	id, n, err := s.LookupState(ctx, "fp1", []string{"a", "b", "x"})
	if err != nil || id != "id2" || n != 2 {
		t.Fatalf("lookup a,b,x: %s %d %v", id, n, err)
	}
	if id, n, _ := s.LookupState(ctx, "fp2", []string{"a"}); id != "" || n != 0 {
		t.Fatalf("another model: %s %d", id, n)
	}
	raw, meta, err := s.GetState(ctx, "id2")
	if err != nil || string(raw) != "raw2" || string(meta) != "meta2" {
		t.Fatalf("get: %q %q %v", raw, meta, err)
	}
	if _, _, err := s.GetState(ctx, "nope"); !errors.Is(err, engine.ErrSharedNotFound) {
		t.Fatalf("get a missing state: %v", err)
	}
}
