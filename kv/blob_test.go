package kv

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// GetOrComputeBlob computes once however many callers ask, stores the blob
// durably with its Aux, and counts one miss with the compute's cost plus
// the extra it reports; a second call is a hit that reads nothing.
func TestGetOrComputeBlob(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, Options{Store: tiers.Options{Dir: dir}})
	var runs atomic.Int32
	started, release := make(chan struct{}, 4), make(chan struct{})
	compute := func(context.Context) (BlobMeta, []byte, time.Duration, error) {
		runs.Add(1)
		started <- struct{}{}
		<-release
		return BlobMeta{Aux: []byte("meta")}, []byte("state bytes"), 100 * time.Millisecond, nil
	}
	var wg sync.WaitGroup
	outs := make([]Outcome, 4)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, out, err := c.GetOrComputeBlob(context.Background(), "ns", "k", compute)
			if err != nil || m.Size != int64(len("state bytes")) {
				t.Errorf("call %d: %+v %v", i, m, err)
			}
			outs[i] = out
		}()
	}
	<-started // callers arriving after the compute ends find the blob: one compute either way
	close(release)
	wg.Wait()
	computed := 0
	for _, o := range outs {
		if o.Computed {
			computed++
		}
	}
	if runs.Load() != 1 || computed != 1 {
		t.Fatalf("compute ran %d times, %d callers computed", runs.Load(), computed)
	}
	if _, out, err := c.GetOrComputeBlob(context.Background(), "ns", "k", compute); err != nil || out.Computed || out.Tier == tiers.TierNone {
		t.Fatalf("second call: %+v %v", out, err)
	}
	a := c.AmortizationStats()
	if a.Computes != 1 || a.MeanComputeCost < 100*time.Millisecond {
		t.Fatalf("amortization %+v", a)
	}
	// A failed compute stores nothing.
	boom := errors.New("boom")
	if _, _, err := c.GetOrComputeBlob(context.Background(), "ns", "bad", func(context.Context) (BlobMeta, []byte, time.Duration, error) {
		return BlobMeta{}, nil, 0, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("failed compute: %v", err)
	}
	if _, _, err := c.StatBlob("ns", "bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("failed compute stored something: %v", err)
	}
	// Durable: a reopened cache lists the blob with its Aux and serves it
	// through LoadBlob, counted as a hit from the Archive.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2 := openCache(t, Options{Store: tiers.Options{Dir: dir}})
	var keys []string
	c2.RangeBlobs("ns", func(key string, m BlobMeta, _ Tier) bool {
		if string(m.Aux) != "meta" {
			t.Errorf("aux %q", m.Aux)
		}
		keys = append(keys, key)
		return true
	})
	c2.RangeBlobs("other", func(key string, _ BlobMeta, _ Tier) bool {
		t.Errorf("namespace other lists %q", key)
		return true
	})
	if len(keys) != 1 || keys[0] != "k" {
		t.Fatalf("keys %q", keys)
	}
	m, data, tier, err := c2.LoadBlob("ns", "k")
	if err != nil || string(data) != "state bytes" || string(m.Aux) != "meta" || tier != tiers.TierArchive {
		t.Fatalf("load: %q %+v %s %v", data, m, tier, err)
	}
	if _, _, _, err := c2.LoadBlob("ns", "missing"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if st, a := c2.Stats(), c2.AmortizationStats(); st.Hits != 1 || st.Misses != 0 || a.MeanLoadCost["archive"] <= 0 {
		t.Fatalf("stats %+v amortization %+v", st, a)
	}
}
