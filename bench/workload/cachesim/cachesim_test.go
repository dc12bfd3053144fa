package cachesim

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/tiers"
	"github.com/kvsidecar/kvsidecar/tiers/tracefile"
)

func keys(ks ...uint64) Trace {
	n := map[uint64]bool{}
	for _, k := range ks {
		n[k] = true
	}
	return Trace{Name: "t", Items: len(n), Keys: ks}
}

func TestBeladyAndLRU(t *testing.T) {
	// a b c a d a b, capacity 2: OPT misses a b c d b and hits a twice.
	tr := keys(0, 1, 2, 0, 3, 0, 1)
	if got := Belady(tr, 2); got != 2.0/7 {
		t.Fatalf("belady = %v, want 2/7", got)
	}
	p, err := NewTiers(tiers.StrategyLRU, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := Replay(tr, p); got != 1.0/7 {
		t.Fatalf("lru = %v, want 1/7", got)
	}
}

func TestStaticOracle(t *testing.T) {
	// counts: 0×3, 1×2, 2×1; capacity 1 keeps key 0: two repeat hits.
	if got := StaticOracle(keys(0, 1, 0, 2, 1, 0), 1); got != 2.0/6 {
		t.Fatalf("static oracle = %v", got)
	}
}

func TestSyntheticTraces(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	tr := Uniform8020(1000, 50000, rng)
	count := map[uint64]int{}
	for _, x := range tr.Keys {
		count[x]++
	}
	top := 0
	for _, c := range count {
		if c > 100 { // hot items expect 200 accesses each, cold 12.5
			top += c
		}
	}
	if f := float64(top) / 50000; f < 0.77 || f > 0.83 {
		t.Fatalf("hot share %.3f, want about 0.8", f)
	}
	z := Zipf(1000, 50000, 0.99, rng)
	if z.Name != "zipf-0.99" || z.Items != 1000 {
		t.Fatalf("%s over %d items", z.Name, z.Items)
	}
	count = map[uint64]int{}
	maxc := 0
	for _, x := range z.Keys {
		count[x]++
		maxc = max(maxc, count[x])
	}
	// P(rank 1) = 1/H(1000, 0.99) ≈ 0.13
	if f := float64(maxc) / 50000; f < 0.11 || f > 0.15 {
		t.Fatalf("top item share %.3f, want about 0.13", f)
	}
}

func TestRunBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	traces := []Trace{Uniform8020(500, 5000, rng), Zipf(500, 5000, 0.99, rng)}
	rows, err := Run(traces, []int{10, 20, 50}, TiersStrategies())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows", len(rows))
	}
	for i, r := range rows {
		if len(r.HitRates) != len(tiers.Strategies()) || r.Static > r.Belady+1e-12 {
			t.Fatalf("row %+v", r)
		}
		for j, hr := range r.HitRates {
			if hr <= 0 || hr > r.Belady+1e-12 {
				t.Errorf("%s %d%% %s: %.3f against Belady %.3f", r.Trace, r.SizePct, tiers.Strategies()[j], hr, r.Belady)
			}
		}
		if i > 0 && rows[i-1].Trace == r.Trace && r.Belady < rows[i-1].Belady {
			t.Errorf("%s: Belady falls from %d%% to %d%%", r.Trace, rows[i-1].SizePct, r.SizePct)
		}
	}
}

func TestTraceRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.trace")
	w, err := tracefile.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []tiers.TraceEvent{
		{Op: tiers.TraceGet, Key: "session-a"},                                  // miss
		{Op: tiers.TracePut, Key: "session-a", Size: 10},                        // its fill: no access
		{Op: tiers.TraceGet, Key: "session-a", Size: 10, Tier: tiers.TierFocus}, // hit
		{Op: tiers.TracePut, Key: "session-b", Size: 7},                         // a put of its own: an access
		{Op: tiers.TraceDelete, Key: "session-a"},
		{Op: tiers.TraceGet, Key: "session-a"}, // a new key after the delete
	} {
		w.Record(ev)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Appending after a restart continues the trace.
	w, err = tracefile.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w.Record(tiers.TraceEvent{Op: tiers.TraceGet, Key: "session-b", Size: 7, Tier: tiers.TierArchive})
	w.Close()

	tr, st, err := ReadTraceFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// a (its fill is no access), a, b, delete a, a, b.
	a, b := tr.Keys[0], tr.Keys[2]
	wantKeys := []uint64{a, a, b, a, a, b}
	wantDel := []bool{false, false, false, true, false, false}
	if tr.Name != "x" || tr.Items != 2 || !slices.Equal(tr.Keys, wantKeys) || !slices.Equal(tr.Deleted, wantDel) || a == b {
		t.Fatalf("trace %s over %d keys: %v %v", tr.Name, tr.Items, tr.Keys, tr.Deleted)
	}
	if st != (TraceStats{Gets: 4, Puts: 2, Deletes: 1, Hits: 2}) {
		t.Fatalf("stats %+v", st)
	}
	// The deletion frees room and makes the next access to a a miss: two
	// hits in five accesses, for LRU, Belady and the static oracle alike.
	p, _ := NewTiers(tiers.StrategyLRU, 2)
	if lru, opt, static := Replay(tr, p), Belady(tr, 2), StaticOracle(tr, 2); lru != 0.4 || opt != 0.4 || static != 0.4 {
		t.Fatalf("lru %v, belady %v, static %v; want 0.4", lru, opt, static)
	}
	// With room for one, Belady keeps a for its hit, then b's last access
	// misses: a deleted key is never worth keeping.
	if opt := Belady(tr, 1); opt != 0.2 {
		t.Fatalf("belady at 1: %v", opt)
	}
	for _, bad := range []string{"x 00 1 none", "g zz 1 none", "g 00 1"} {
		if _, _, err := ReadTrace("bad", strings.NewReader(bad)); err == nil {
			t.Errorf("%q read without error", bad)
		}
	}
}
