package bench

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/tiers"
)

func TestKVBelady(t *testing.T) {
	// a b c a d a b, capacity 2: OPT keeps a throughout and hits a twice
	// more... exactly: misses a b c d b, hits a a.
	tr := []int32{0, 1, 2, 0, 3, 0, 1}
	if got := kvBelady(tr, 2); got != 2.0/7 {
		t.Fatalf("belady = %v, want 2/7", got)
	}
	if got := kvReplay(tr, 2, tiers.StrategyLRU); got != 1.0/7 {
		t.Fatalf("lru = %v, want 1/7", got)
	}
}

func TestKVHitRatesBoundedByBelady(t *testing.T) {
	rows, reach := kvHitRates(KVOptions{Items: 500, Accesses: 5000, Seed: 3, Strategies: tiers.Strategies()})
	if len(rows) != 2*3*len(tiers.Strategies()) || len(reach) != 2 {
		t.Fatalf("%d rows, %d reach", len(rows), len(reach))
	}
	for _, r := range rows {
		if r.HitRate > r.Belady+1e-12 || r.HitRate <= 0 || r.StaticOracle > r.Belady+1e-12 {
			t.Errorf("%s %d%% %s: hit rate %.3f against Belady %.3f", r.Trace, r.SizePct, r.Strategy, r.HitRate, r.Belady)
		}
	}
	// Bigger caches never lose under OPT.
	for i := 0; i+len(tiers.Strategies()) < len(rows); i++ {
		a, b := rows[i], rows[i+len(tiers.Strategies())]
		if a.Trace == b.Trace && b.Belady < a.Belady {
			t.Errorf("%s: Belady %.3f at %d%% but %.3f at %d%%", a.Trace, a.Belady, a.SizePct, b.Belady, b.SizePct)
		}
	}
}

func TestKVTraces(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	tr := kvTrace80_20(1000, 50000, rng)
	count := map[int32]int{}
	for _, x := range tr {
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
	z := kvTraceZipf(1000, 50000, 0.99, rng)
	count = map[int32]int{}
	maxc := 0
	for _, x := range z {
		count[x]++
		maxc = max(maxc, count[x])
	}
	// P(rank 1) = 1/H(1000, 0.99) ≈ 0.13
	if f := float64(maxc) / 50000; f < 0.11 || f > 0.15 {
		t.Fatalf("top item share %.3f, want about 0.13", f)
	}
}

func TestKVCompression(t *testing.T) {
	rows := kvCompression(KVOptions{Quick: true})
	ratio := map[string]float64{}
	for _, r := range rows {
		ratio[r.Data+"/"+r.Codec] = r.Ratio
	}
	plain, planes, q8 := ratio["fp16 KV (normal)/zstd"], ratio["fp16 KV (normal)/planes+zstd"], ratio["fp16 KV (normal)/q8+zstd (lossy)"]
	if !(planes > plain && q8 > 1.5*planes && ratio["conversation text/zstd"] > 2) {
		t.Fatalf("ratios %v", ratio)
	}
}

// BenchmarkRunKVQuick runs the whole KV report in quick mode once and
// prints it: go test ./bench/ -run '^$' -bench RunKVQuick -benchtime 1x
// (KVBENCH_JSON=file also writes the JSON report there).
func BenchmarkRunKVQuick(b *testing.B) {
	for b.Loop() {
		r, err := RunKV(KVOptions{Quick: true})
		if err != nil {
			b.Fatal(err)
		}
		var sb strings.Builder
		if err := WriteKVTable(&sb, r); err != nil {
			b.Fatal(err)
		}
		b.Log("\n" + sb.String())
		if f := os.Getenv("KVBENCH_JSON"); f != "" {
			j, _ := json.MarshalIndent(r, "", "  ")
			os.WriteFile(f, j, 0o644)
		}
	}
}

func TestKVStaticOracle(t *testing.T) {
	// counts: 0×3, 1×2, 2×1; capacity 1 keeps item 0: two repeat hits.
	if got := kvStaticOracle([]int32{0, 1, 0, 2, 1, 0}, 1); got != 2.0/6 {
		t.Fatalf("static oracle = %v", got)
	}
}
