package kv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/tiers"
)

func testBlock(layers, heads, tokens, dim int, seed uint64) *Block {
	r := rand.New(rand.NewPCG(seed, 7))
	b := &Block{ModelID: "llama-3-8b", DType: tiers.DTypeF16, KVHeads: heads, Tokens: tokens, HeadDim: dim}
	n := heads * tokens * dim
	for range layers {
		k, v := make([]byte, 2*n), make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(k[2*i:], tiers.F32ToF16(float32(r.NormFloat64())))
			binary.LittleEndian.PutUint16(v[2*i:], tiers.F32ToF16(float32(r.NormFloat64())))
		}
		b.K, b.V = append(b.K, k), append(b.V, v)
	}
	return b
}

func sameBlock(a, b *Block) bool {
	if a.ModelID != b.ModelID || a.DType != b.DType || a.KVHeads != b.KVHeads || a.Tokens != b.Tokens ||
		a.HeadDim != b.HeadDim || len(a.K) != len(b.K) {
		return false
	}
	for l := range a.K {
		if !bytes.Equal(a.K[l], b.K[l]) || !bytes.Equal(a.V[l], b.V[l]) {
			return false
		}
	}
	return true
}

// TestValidate: malformed blocks are ErrInvalid.
func TestValidate(t *testing.T) {
	if err := testBlock(3, 2, 5, 8, 1).Validate(); err != nil {
		t.Fatal(err)
	}
	invalid := []*Block{
		{DType: tiers.DTypeF16, KVHeads: 1, Tokens: 1, HeadDim: 1},                                     // no layers
		{DType: 0, KVHeads: 1, Tokens: 1, HeadDim: 1, K: [][]byte{{0}}, V: [][]byte{{0}}},              // no dtype
		{DType: tiers.DTypeF16, KVHeads: 1, Tokens: 1, HeadDim: 1, K: [][]byte{{0}}, V: [][]byte{{0}}}, // short layer
		{DType: tiers.DTypeQ8, KVHeads: 1, Tokens: 1, HeadDim: 1, K: [][]byte{{0}}, V: nil},            // V missing
	}
	for i, b := range invalid {
		if err := b.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("case %d: %v", i, err)
		}
	}
}

func openCache(t *testing.T, o Options) *Cache {
	t.Helper()
	c, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCacheBasics(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, Options{Store: tiers.Options{Dir: dir}})
	b1, b2 := testBlock(2, 2, 4, 8, 1), testBlock(2, 2, 4, 8, 2)
	if _, _, err := c.Get("s1", "q"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("empty cache: %v", err)
	}
	if err := c.Put("s1", "q", b1); err != nil {
		t.Fatal(err)
	}
	if err := c.Put("s1", "q2", b2); err != nil {
		t.Fatal(err)
	}
	// "s" + "1q" must not meet "s1" + "q".
	if err := c.Put("s", "1q", b2); err != nil {
		t.Fatal(err)
	}
	got, tier, err := c.Get("s1", "q")
	if err != nil || !sameBlock(got, b1) || tier != tiers.TierFocus {
		t.Fatalf("get: %v from %s", err, tier)
	}
	if !c.Contains("s1", "q2") || c.Contains("s1", "q3") {
		t.Fatal("Contains")
	}
	st := c.Stats()
	if st.Size != 3 || st.Hits != 1 || st.Misses != 1 || st.HitRate != 0.5 || st.Strategy != tiers.DefaultStrategy || len(st.Tiers) != 3 {
		t.Fatalf("stats %+v", st)
	}
	if err := c.Invalidate("s1"); err != nil {
		t.Fatal(err)
	}
	if c.Contains("s1", "q") || c.Contains("s1", "q2") || !c.Contains("s", "1q") {
		t.Fatal("Invalidate must remove every query of s1 and nothing else")
	}
	// What survives a restart comes back, and can still be invalidated.
	if err := c.Put("s2", "q", b1); err != nil {
		t.Fatal(err)
	}
	c.Close()
	c = openCache(t, Options{Store: tiers.Options{Dir: dir}})
	got, tier, err = c.Get("s2", "q")
	if err != nil || !sameBlock(got, b1) || tier != tiers.TierArchive {
		t.Fatalf("after reopen: %v from %s", err, tier)
	}
	if c.Stats().Size != 2 {
		t.Fatalf("size after reopen %d", c.Stats().Size)
	}
	c.Invalidate("s2")
	if c.Contains("s2", "q") {
		t.Fatal("invalidate after reopen")
	}
}

func TestGetOrComputeOnce(t *testing.T) {
	c := openCache(t, Options{})
	var calls atomic.Int32
	release := make(chan struct{})
	want := testBlock(1, 1, 2, 4, 3)
	compute := func(context.Context) (*Block, error) {
		calls.Add(1)
		<-release
		return want, nil
	}
	const n = 8
	var wg sync.WaitGroup
	var computed, shared atomic.Int32
	started := make(chan struct{}, n)
	for range n {
		wg.Go(func() {
			started <- struct{}{}
			b, out, err := c.GetOrCompute(context.Background(), "s", "q", compute)
			if err != nil || !sameBlock(b, want) {
				t.Errorf("GetOrCompute: %v", err)
			}
			if out.Computed {
				computed.Add(1)
			}
			if out.Shared || out.Tier != tiers.TierNone {
				shared.Add(1)
			}
		})
	}
	for range n {
		<-started
	}
	close(release)
	wg.Wait()
	if calls.Load() != 1 || computed.Load() != 1 || shared.Load() != n-1 {
		t.Fatalf("compute ran %d times, computed %d, shared or loaded %d", calls.Load(), computed.Load(), shared.Load())
	}
	b, out, err := c.GetOrCompute(context.Background(), "s", "q", compute)
	if err != nil || out.Computed || out.Tier != tiers.TierFocus || !sameBlock(b, want) {
		t.Fatalf("second turn: %+v %v", out, err)
	}
	a := c.AmortizationStats()
	if a.TotalTurns != n+1 || a.Computes != 1 || a.ComputeSaved != n || a.AvgReuseCount != n {
		t.Fatalf("amortization %+v", a)
	}
	if a.AmortizationRatio != float64(n)/float64(n+1) {
		t.Fatalf("amortization %+v", a)
	}
}

func TestGetOrComputeFailureNotCached(t *testing.T) {
	c := openCache(t, Options{})
	boom := errors.New("boom")
	calls := 0
	compute := func(context.Context) (*Block, error) {
		calls++
		if calls == 1 {
			return nil, boom
		}
		if calls == 2 {
			panic("compute bug")
		}
		return testBlock(1, 1, 1, 2, 4), nil
	}
	if _, _, err := c.GetOrCompute(context.Background(), "s", "q", compute); !errors.Is(err, boom) {
		t.Fatalf("first: %v", err)
	}
	if c.Contains("s", "q") {
		t.Fatal("failed compute cached")
	}
	if _, _, err := c.GetOrCompute(context.Background(), "s", "q", compute); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("second: %v", err)
	}
	if _, out, err := c.GetOrCompute(context.Background(), "s", "q", compute); err != nil || !out.Computed {
		t.Fatalf("third: %+v %v", out, err)
	}
	if calls != 3 {
		t.Fatalf("compute ran %d times", calls)
	}
}

func TestInvalidateDuringCompute(t *testing.T) {
	c := openCache(t, Options{})
	compute := func(context.Context) (*Block, error) {
		c.Invalidate("s") // the session changed while we computed
		return testBlock(1, 1, 1, 2, 5), nil
	}
	if _, _, err := c.GetOrCompute(context.Background(), "s", "q", compute); err != nil {
		t.Fatal(err)
	}
	if c.Contains("s", "q") {
		t.Fatal("a block computed across an invalidation was cached")
	}
}

func TestBlobs(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, Options{Store: tiers.Options{Dir: dir}, MaxBlobBytes: 1 << 20})
	data := []byte("0123456789ab")
	meta := BlobMeta{DType: tiers.DTypeF16, Shape: []int64{2, 3}}
	ns, key := "engine/a", "../../etc/passwd\x00"
	if err := c.PutBlob(ns, key, meta, data); err != nil {
		t.Fatal(err)
	}
	data[0] = 'X' // the cache copied
	m, got, tier, err := c.GetBlob(ns, key)
	if err != nil || string(got) != "0123456789ab" || tier != tiers.TierFocus || m.Size != 12 || m.DType != tiers.DTypeF16 || len(m.Shape) != 2 {
		t.Fatalf("GetBlob: %+v %q %s %v", m, got, tier, err)
	}
	if m, tier, err := c.StatBlob(ns, key); err != nil || m.Size != 12 || tier != tiers.TierFocus {
		t.Fatalf("StatBlob: %+v %s %v", m, tier, err)
	}
	bad := []struct {
		ns, key string
		meta    BlobMeta
		n       int
		want    error
	}{
		{"", "k", BlobMeta{}, 1, ErrInvalid},
		{"n", "", BlobMeta{}, 1, ErrInvalid},
		{strings.Repeat("n", MaxNamespaceLen+1), "k", BlobMeta{}, 1, ErrInvalid},
		{"n", "k", BlobMeta{DType: tiers.DTypeF32, Shape: []int64{3}}, 8, ErrInvalid},
		{"n", "k", BlobMeta{Shape: []int64{-1}}, 8, ErrInvalid},
		{"n", "k", BlobMeta{}, 2 << 20, ErrTooLarge},
	}
	for i, b := range bad {
		if err := c.PutBlob(b.ns, b.key, b.meta, make([]byte, b.n)); !errors.Is(err, b.want) {
			t.Errorf("case %d: %v, want %v", i, err, b.want)
		}
	}
	if _, _, _, err := c.GetBlob(ns, "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing blob: %v", err)
	}
	c.Close()
	c = openCache(t, Options{Store: tiers.Options{Dir: dir}})
	if _, got, tier, err := c.GetBlob(ns, key); err != nil || string(got) != "0123456789ab" || tier != tiers.TierArchive {
		t.Fatalf("after reopen: %q %s %v", got, tier, err)
	}
	if err := c.DeleteBlob(ns, key); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteBlob(ns, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if _, _, err := c.StatBlob(ns, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("stat after delete: %v", err)
	}
}

const blobCrashEnv = "KV_BLOB_CRASH_DIR"

// TestBlobCrash kills a child process (SIGKILL) that PUTs blobs and checks
// that every blob it acknowledged is served after reopening, byte for byte.
func TestBlobCrash(t *testing.T) {
	if dir := os.Getenv(blobCrashEnv); dir != "" {
		c, err := Open(Options{Store: tiers.Options{Dir: dir}})
		if err != nil {
			os.Exit(2)
		}
		for i := range 1000 {
			if err := c.PutBlob("ns", strconv.Itoa(i), BlobMeta{}, blobData(i)); err != nil {
				os.Exit(3)
			}
			os.Stdout.WriteString("ack " + strconv.Itoa(i) + "\n")
		}
		os.Exit(0)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBlobCrash$")
	cmd.Env = append(os.Environ(), blobCrashEnv+"="+dir)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if n, ok := strings.CutPrefix(sc.Text(), "ack "); ok {
			i, _ := strconv.Atoi(n)
			acked = append(acked, i)
			if len(acked) == 10 {
				cmd.Process.Kill()
			}
		}
	}
	cmd.Wait()
	if len(acked) < 10 {
		t.Fatalf("child acknowledged only %d blobs", len(acked))
	}
	c := openCache(t, Options{Store: tiers.Options{Dir: dir}})
	for _, i := range acked {
		_, got, _, err := c.GetBlob("ns", strconv.Itoa(i))
		if err != nil || !bytes.Equal(got, blobData(i)) {
			t.Fatalf("acknowledged blob %d: %v", i, err)
		}
	}
	if q := c.Store().Quarantined(); len(q) != 0 {
		t.Fatalf("quarantined after crash: %+v", q)
	}
}

func blobData(i int) []byte {
	b := make([]byte, 64<<10+i)
	for j := range b {
		b[j] = byte(i*31 + j*7)
	}
	return b
}

// With Options.Tuner the cache runs an AdaptiveTuner, reports it in Stats
// and stops it in Close.
func TestCacheWithTuner(t *testing.T) {
	c, err := Open(Options{Store: tiers.Options{Strategy: tiers.StrategyWeighted}, Tuner: &tiers.TunerOptions{Every: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Tuner() == nil {
		t.Fatal("no tuner")
	}
	c.Tuner().Step()
	st := c.Stats()
	if st.Tuner == nil || st.Tuner.Epochs != 1 || st.Tuning.PromoteThreshold != 2 || st.Tuning.Balance < 0 {
		t.Fatalf("stats %+v", st)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Tuner: &tiers.TunerOptions{BalanceStep: 2}}); err == nil {
		t.Fatal("a bad tuner option accepted")
	}
}
