package remote_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver/redistest"
	"github.com/kvsidecar/kvsidecar/remote"
)

func TestLeaseExclusiveAndReleased(t *testing.T) {
	a, srv := open(t, nil, func(o *remote.Options) { o.Owner = "10.0.0.1:8080" })
	b, _ := open(t, srv, func(o *remote.Options) { o.Owner = "10.0.0.2:8080" })
	la, err := a.TryAcquire(ctx, "t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(la.Token(), "10.0.0.1:8080 ") {
		t.Fatalf("token %q does not start with the owner", la.Token())
	}
	var held *remote.HeldError
	if _, err := b.TryAcquire(ctx, "t1", "s1"); !errors.As(err, &held) || held.Owner != "10.0.0.1:8080" || !errors.Is(err, remote.ErrHeld) {
		t.Fatalf("b's TryAcquire while a holds it: %v", err)
	}
	// Another session, or the same id of another tenant, is free.
	if l, err := b.TryAcquire(ctx, "t1", "s2"); err != nil {
		t.Fatal(err)
	} else {
		l.Release(ctx)
	}
	if l, err := b.TryAcquire(ctx, "t2", "s1"); err != nil {
		t.Fatal(err)
	} else {
		l.Release(ctx)
	}
	// A second request in the same process waits like any other.
	if _, err := a.TryAcquire(ctx, "t1", "s1"); !errors.Is(err, remote.ErrHeld) {
		t.Fatalf("a second TryAcquire by the holder's own process: %v", err)
	}
	// b waits in Acquire until a releases.
	got := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, "t1", "s1")
		if err == nil {
			defer l.Release(ctx)
		}
		got <- err
	}()
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("b's Acquire after a released: %v", err)
	}
	if err := la.Release(ctx); !errors.Is(err, remote.ErrNotOwner) {
		t.Fatalf("second Release: %v", err)
	}
	// Acquire gives up when its context ends.
	lb, err := b.TryAcquire(ctx, "t1", "s3")
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Release(ctx)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := a.Acquire(cctx, "t1", "s3"); !errors.Is(err, remote.ErrHeld) {
		t.Fatalf("Acquire past its context: %v", err)
	}
}

// A replica killed while holding a lease: another takes over once the
// lease expires; the killed replica restarted under the same address takes
// it back at once (it knows the old instance is dead).
func TestLeaseTakeoverAfterCrash(t *testing.T) {
	srv := redistest.Start(t, redisserver.Options{})
	short := func(owner string) func(*remote.Options) {
		return func(o *remote.Options) { o.Owner, o.LeaseTTL = owner, 300*time.Millisecond }
	}
	a, _ := open(t, srv, short("10.0.0.1:8080"))
	b, _ := open(t, srv, short("10.0.0.2:8080"))
	if _, err := a.TryAcquire(ctx, "t1", "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, "t1", "s2"); err != nil {
		t.Fatal(err)
	}
	a.Crash()
	if _, err := b.TryAcquire(ctx, "t1", "s1"); !errors.Is(err, remote.ErrHeld) {
		t.Fatalf("right after the crash: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lb, err := b.Acquire(wctx, "t1", "s1")
	if err != nil {
		t.Fatalf("b never took over: %v", err)
	}
	defer lb.Release(ctx)
	// a comes back on the same address: its dead incarnation's lease on
	// s2 is taken at once, not after the TTL (a long one here).
	a2, _ := open(t, srv, func(o *remote.Options) { o.Owner = "10.0.0.1:8080" })
	if a2.Instance() == a.Instance() {
		t.Fatal("same instance id twice")
	}
	if l, err := a2.TryAcquire(ctx, "t1", "s2"); err != nil {
		t.Fatalf("restarted owner reclaiming its own lease: %v", err)
	} else {
		l.Release(ctx)
	}
	// but not b's.
	if _, err := a2.TryAcquire(ctx, "t1", "s1"); !errors.Is(err, remote.ErrHeld) {
		t.Fatalf("restarted owner took another's lease: %v", err)
	}
}

// A held lease outlives many TTLs while its Store renews it.
func TestLeaseRenewedWhileHeld(t *testing.T) {
	a, srv := open(t, nil, func(o *remote.Options) { o.Owner, o.LeaseTTL = "10.0.0.1:8080", time.Second })
	b, _ := open(t, srv, func(o *remote.Options) { o.Owner = "10.0.0.2:8080" })
	la, err := a.TryAcquire(ctx, "t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) < 3500*time.Millisecond; time.Sleep(100 * time.Millisecond) {
		if _, err := b.TryAcquire(ctx, "t1", "s1"); !errors.Is(err, remote.ErrHeld) {
			t.Fatalf("after %v the lease was free: %v", time.Since(start), err)
		}
	}
	if la.Lost() {
		t.Fatal("renewed lease reported lost")
	}
	if err := la.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	la.Release(ctx)
	if err := la.Renew(ctx); !errors.Is(err, remote.ErrNotOwner) || !la.Lost() {
		t.Fatalf("Renew after Release: %v", err)
	}
}

// Fencing: a holder whose lease expired and was taken can no longer
// append; the new holder's history is the only one.
func TestFencedAppend(t *testing.T) {
	srv := redistest.Start(t, redisserver.Options{})
	a, _ := open(t, srv, func(o *remote.Options) { o.Owner, o.LeaseTTL = "10.0.0.1:8080", 200*time.Millisecond })
	b, _ := open(t, srv, func(o *remote.Options) { o.Owner = "10.0.0.2:8080" })
	la, err := a.TryAcquire(ctx, "t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Append(ctx, "t1", "s1", la, 0, []byte("a0")); err != nil {
		t.Fatal(err)
	}
	a.Crash() // stops renewing, as a paused or partitioned replica would
	// A live Store to send a's stale token through.
	a2, _ := open(t, srv, func(o *remote.Options) { o.Owner = "10.0.0.1:8080" })
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lb, err := b.Acquire(wctx, "t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Append(ctx, "t1", "s1", lb, 1, []byte("b1")); err != nil {
		t.Fatal(err)
	}
	// a's stale lease, used through a live connection.
	if _, err := a2.Append(ctx, "t1", "s1", la, 1, []byte("a1")); !errors.Is(err, remote.ErrNotOwner) {
		t.Fatalf("append with a lost lease: %v", err)
	}
	recs, _ := b.Records(ctx, "t1", "s1", 0, 0)
	if len(recs) != 2 || string(recs[1]) != "b1" {
		t.Fatalf("history %q", recs)
	}
}

// Two replicas, many concurrent turns on one session: each turn takes the
// lease, reads the length, appends its two records there. The history
// never forks: every turn lands whole, in some order, nothing lost.
func TestConcurrentTurnsNeverFork(t *testing.T) {
	srv := redistest.Start(t, redisserver.Options{})
	a, _ := open(t, srv, func(o *remote.Options) { o.Owner = "10.0.0.1:8080" })
	b, _ := open(t, srv, func(o *remote.Options) { o.Owner = "10.0.0.2:8080" })
	const turns = 40
	var wg sync.WaitGroup
	errs := make(chan error, turns)
	for i := range turns {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			l, err := s.Acquire(wctx, "t1", "shared")
			if err != nil {
				errs <- err
				return
			}
			defer l.Release(ctx)
			n, err := s.RecordCount(ctx, "t1", "shared")
			if err != nil {
				errs <- err
				return
			}
			_, err = s.Append(ctx, "t1", "shared", l, n, []byte(fmt.Sprintf("user %d", i)), []byte(fmt.Sprintf("assistant %d", i)))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	recs, _ := a.Records(ctx, "t1", "shared", 0, 0)
	if len(recs) != 2*turns {
		t.Fatalf("%d records, want %d", len(recs), 2*turns)
	}
	seen := map[string]bool{}
	for i := 0; i < len(recs); i += 2 {
		var u, as int
		fmt.Sscanf(string(recs[i]), "user %d", &u)
		fmt.Sscanf(string(recs[i+1]), "assistant %d", &as)
		if u != as || seen[string(recs[i])] {
			t.Fatalf("records %d, %d: %q %q: a turn split or repeated", i, i+1, recs[i], recs[i+1])
		}
		seen[string(recs[i])] = true
	}
}

// kill -9 of redis-server and a restart on the same folder: everything
// acknowledged is there, under appendfsync always (at once) and everysec
// (once its fsync ran); the same Store carries on once the server is back.
func TestKill9RestartLosesNothingAcknowledged(t *testing.T) {
	for _, fsync := range []string{"always", "everysec"} {
		t.Run(fsync, func(t *testing.T) {
			srv := redistest.Start(t, redisserver.Options{AppendFsync: fsync})
			s, _ := open(t, srv, func(o *remote.Options) { o.TTL = time.Hour })
			const n = 50
			var blobs [][]byte
			for i := range n {
				blobs = append(blobs, blobOf(1000+i*97, byte(i)))
				if err := s.PutBlob(ctx, "t1", fmt.Sprint("b", i), blobs[i], []byte{byte(i)}); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Append(ctx, "t1", "s", nil, int64(i), []byte(fmt.Sprint("rec ", i))); err != nil {
					t.Fatal(err)
				}
				if err := s.IndexPut(ctx, "t1", "fp", []string{fmt.Sprint("h", i)}, fmt.Sprint("b", i)); err != nil {
					t.Fatal(err)
				}
			}
			if fsync == "everysec" {
				// everysec fsyncs the AOF once a second in the background: a
				// kill -9 may lose the last second's writes (that is the
				// policy), so let one fsync pass; under load it can lag.
				time.Sleep(2500 * time.Millisecond)
			}
			srv.Kill()
			if err := s.Ping(ctx); err == nil {
				t.Fatal("ping answered with the server killed")
			}
			if err := srv.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				got, info, err := s.GetBlob(ctx, "t1", fmt.Sprint("b", i))
				if err != nil || !bytes.Equal(got, blobs[i]) || !bytes.Equal(info.Aux, []byte{byte(i)}) {
					t.Fatalf("blob %d after restart: %v", i, err)
				}
			}
			recs, err := s.Records(ctx, "t1", "s", 0, 0)
			if err != nil || len(recs) != n || string(recs[n-1]) != fmt.Sprint("rec ", n-1) {
				t.Fatalf("records after restart: %d %v", len(recs), err)
			}
			hs := make([]string, n)
			for i := range hs {
				hs[i] = fmt.Sprint("h", i)
			}
			ids, err := s.IndexGet(ctx, "t1", "fp", hs)
			if err != nil || ids[n-1] != fmt.Sprint("b", n-1) || ids[0] != "b0" {
				t.Fatalf("index after restart: %v %v", ids, err)
			}
			// Scripts are loaded again (the restarted server lost its
			// script cache) and leases still work.
			if _, err := s.Append(ctx, "t1", "s", nil, n, []byte("after")); err != nil {
				t.Fatalf("append after restart: %v", err)
			}
			l, err := s.TryAcquire(ctx, "t1", "s")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
