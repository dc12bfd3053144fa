package kv

import (
	"errors"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/tiers"
)

func TestPrefixQuery(t *testing.T) {
	a := PrefixQuery("m", []int32{1, 2, 3})
	if a != PrefixQuery("m", []int32{1, 2, 3}) {
		t.Fatal("not stable")
	}
	for _, other := range []string{PrefixQuery("m", []int32{1, 2}), PrefixQuery("m2", []int32{1, 2, 3}), PrefixQuery("m", []int32{1, 2, 4}), PrefixQuery("m", nil)} {
		if other == a {
			t.Fatalf("collision with %s", other)
		}
	}
}

// PutBlobCached works on a memory-only cache, serves like PutBlob and
// replaces an older blob.
func TestPutBlobCached(t *testing.T) {
	c, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.PutBlob("ns", "k", BlobMeta{}, []byte("x")); err == nil {
		t.Fatal("durable PutBlob on a memory-only cache succeeded")
	}
	data := []byte("slot state")
	if err := c.PutBlobCached("ns", "k", BlobMeta{}, data); err != nil {
		t.Fatal(err)
	}
	data[0] = 'X' // the cache copied
	_, got, tier, err := c.GetBlob("ns", "k")
	if err != nil || string(got) != "slot state" || tier.String() == "" {
		t.Fatalf("%q %s %v", got, tier, err)
	}
	if err := c.PutBlobCached("ns", "k", BlobMeta{}, []byte("newer")); err != nil {
		t.Fatal(err)
	}
	if _, got, _, _ := c.GetBlob("ns", "k"); string(got) != "newer" {
		t.Fatalf("%q", got)
	}
	if err := c.PutBlobCached("", "k", BlobMeta{}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty namespace: %v", err)
	}
	if err := c.DeleteBlob("ns", "k"); err != nil {
		t.Fatal(err)
	}
}

func TestRecordLoadAndCompute(t *testing.T) {
	c, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.RecordCompute(200 * time.Millisecond)
	c.RecordLoad(tiers.TierArchive, 10*time.Millisecond)
	c.RecordLoad(tiers.TierArchive, 30*time.Millisecond)
	st, a := c.Stats(), c.AmortizationStats()
	if st.Hits != 2 || st.Misses != 1 || a.TotalTurns != 3 || a.Computes != 1 || a.ComputeSaved != 2 {
		t.Fatalf("stats %+v, amortization %+v", st, a)
	}
	if a.MeanComputeCost != 200*time.Millisecond || a.MeanLoadCost["archive"] != 20*time.Millisecond {
		t.Fatalf("costs %v %v", a.MeanComputeCost, a.MeanLoadCost)
	}
}

// TestPutWithHintFeedsWeightedStrategy: with room for three blocks, the
// weighted strategy drops the unimportant one, not the oldest. (With two,
// the oldest important block and the newer unimportant one tie:
// 0.3·importance against 0.3·recency.)
func TestPutWithHintFeedsWeightedStrategy(t *testing.T) {
	blk := func(seed uint64) *Block { return testBlock(2, 2, 64, 64, seed) }
	size := int64(len(blk(1).K[0])) * 4 // K and V of 2 layers
	c, err := Open(Options{Store: tiers.Options{
		DisableFocus: true, Strategy: "weighted",
		Working: tiers.Budget{MaxBytes: size*3 + size/2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.PutWithHint("s", "important-old", blk(1), Hint{Importance: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.PutWithHint("s", "unimportant", blk(2), Hint{Importance: 0}); err != nil {
		t.Fatal(err)
	}
	if err := c.PutWithHint("s", "important-mid", blk(3), Hint{Importance: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.PutWithHint("s", "important-new", blk(4), Hint{Importance: 1}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.Contains("s", "unimportant") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // demotion runs in the store's goroutine
	}
	if c.Contains("s", "unimportant") || !c.Contains("s", "important-old") || !c.Contains("s", "important-mid") || !c.Contains("s", "important-new") {
		t.Fatalf("kept unimportant %v, important-old %v, important-new %v",
			c.Contains("s", "unimportant"), c.Contains("s", "important-old"), c.Contains("s", "important-new"))
	}
}
