package kv

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// Issue 12 row 8: a shape whose element count overflows uint64
// (2^40 × 2^24 wraps to 0) matched an empty body and was accepted.
func TestBlobShapeOverflowIsInvalid(t *testing.T) {
	c, err := Open(Options{})
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
		for _, dt := range []DType{0, DTypeF16} {
			err := c.PutBlobCached("ns", "k", BlobMeta{DType: dt, Shape: shape}, nil)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("shape %v dtype %v with an empty body: %v, want ErrInvalid", shape, dt, err)
			}
		}
	}
	// A large but sane shape still needs a matching body, and zero
	// dimensions describe an empty tensor.
	if err := c.PutBlobCached("ns", "k", BlobMeta{DType: DTypeF16, Shape: []int64{4, 0}}, nil); err != nil {
		t.Fatalf("empty tensor: %v", err)
	}
	if err := c.PutBlobCached("ns", "k", BlobMeta{DType: DTypeF16, Shape: []int64{2, 2}}, make([]byte, 8)); err != nil {
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
	if err := c.PutBlob("ns", "k", BlobMeta{DType: DTypeF16}, data); err != nil {
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
