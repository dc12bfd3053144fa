package kv

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// PutBlob on a memory-only cache fails: it has no Archive to make the blob
// durable in.
func TestPutBlobNeedsArchive(t *testing.T) {
	c, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.PutBlob("ns", "k", BlobMeta{}, []byte("x")); err == nil {
		t.Fatal("durable PutBlob on a memory-only cache succeeded")
	}
}

// Issue 12 row 8: a shape whose element count overflows uint64
// (2^40 × 2^24 wraps to 0) matched an empty body and was accepted.
func TestBlobShapeOverflowIsInvalid(t *testing.T) {
	c, err := Open(Options{Store: tiers.Options{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, shape := range [][]int64{
		{1 << 40, 1 << 24},
		{1 << 40, 1 << 40},
		{1 << 20, 1 << 20, 1 << 20, 1 << 20},
		{3, 1 << 40, 1 << 40, 5},
	} {
		for _, dt := range []tiers.DType{0, tiers.DTypeF16} {
			err := c.PutBlob("ns", "k", BlobMeta{DType: dt, Shape: shape}, nil)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("shape %v dtype %v with an empty body: %v, want ErrInvalid", shape, dt, err)
			}
		}
	}
	// A large but sane shape still needs a matching body, and zero
	// dimensions describe an empty tensor.
	if err := c.PutBlob("ns", "k", BlobMeta{DType: tiers.DTypeF16, Shape: []int64{4, 0}}, nil); err != nil {
		t.Fatalf("empty tensor: %v", err)
	}
	if err := c.PutBlob("ns", "k", BlobMeta{DType: tiers.DTypeF16, Shape: []int64{2, 2}}, make([]byte, 8)); err != nil {
		t.Fatalf("2x2 f16: %v", err)
	}
}

// Issue 12 row 10: a blob whose archive file has a corrupt payload was
// announced by HEAD (200, with a length) while GET answered 404. Both
// must agree, and the file goes to quarantine on first discovery.
func TestStatAndGetAgreeOnCorruptArchiveBlob(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Options{Store: tiers.Options{Dir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	data := blobData(3)
	if err := c.PutBlob("ns", "k", BlobMeta{DType: tiers.DTypeF16}, data); err != nil {
		t.Fatal(err)
	}
	if err := c.PutBlob("ns", "good", BlobMeta{}, data[:100]); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Flip one payload byte of the larger file (the header stays valid).
	var victim string
	var size int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.Contains(p, "quarantine") {
			if fi, _ := d.Info(); fi != nil && fi.Size() > size {
				victim, size = p, fi.Size()
			}
		}
		return nil
	})
	b, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-16] ^= 0x5a
	if err := os.WriteFile(victim, b, 0o644); err != nil {
		t.Fatal(err)
	}

	c, err = Open(Options{Store: tiers.Options{Dir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if m, tier, err := c.StatBlob("ns", "k"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("HEAD of a corrupt blob: %+v %s %v, want ErrNotFound", m, tier, err)
	}
	if _, _, _, err := c.GetBlob("ns", "k"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GET of a corrupt blob: %v", err)
	}
	if q := c.Store().Quarantined(); len(q) != 1 {
		t.Fatalf("quarantined %+v, want the one file", q)
	}
	if m, tier, err := c.StatBlob("ns", "good"); err != nil || m.Size != 100 || tier != tiers.TierArchive && tier != tiers.TierWorking {
		t.Fatalf("HEAD of a sound archive blob: %+v %s %v", m, tier, err)
	}
}

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
	c2.RangeBlobs("ns", func(key string, m BlobMeta, _ tiers.Tier) bool {
		if string(m.Aux) != "meta" {
			t.Errorf("aux %q", m.Aux)
		}
		keys = append(keys, key)
		return true
	})
	c2.RangeBlobs("other", func(key string, _ BlobMeta, _ tiers.Tier) bool {
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

// A cached blob put is served at once, is not on disk until PersistBlob,
// and owned data is kept without a copy.
func TestPutBlobCachedThenPersist(t *testing.T) {
	dir := t.TempDir()
	open := func() *Cache {
		c, err := Open(Options{Store: tiers.Options{Dir: dir, DisableFocus: true, NoFlushOnClose: true}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := open()
	data := []byte("owned value")
	if err := c.PutBlobWith("ns", "a", BlobMeta{}, data, PutBlobOptions{Cached: true, Owned: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.PutBlobWith("ns", "b", BlobMeta{}, []byte("never persisted"), PutBlobOptions{Cached: true}); err != nil {
		t.Fatal(err)
	}
	if !c.ContainsBlob("ns", "a") || c.ContainsBlob("ns", "zz") || c.ContainsBlob("other", "a") {
		t.Fatal("ContainsBlob disagrees with what was put")
	}
	_, got, tier, err := c.GetBlob("ns", "a")
	if err != nil || tier != tiers.TierWorking || string(got) != "owned value" || &got[0] != &data[0] {
		t.Fatalf("get: %q tier %v err %v (shared: %v)", got, tier, err, err == nil && &got[0] == &data[0])
	}
	if err := c.PersistBlob("ns", "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.PersistBlob("ns", "missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("persist of a missing blob: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = open()
	defer c.Close()
	if _, got, tier, err := c.GetBlob("ns", "a"); err != nil || tier != tiers.TierArchive || string(got) != "owned value" {
		t.Fatalf("after reopen: %q tier %v err %v", got, tier, err)
	}
	if _, _, _, err := c.GetBlob("ns", "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unpersisted blob survived a close without flush: %v", err)
	}
}
