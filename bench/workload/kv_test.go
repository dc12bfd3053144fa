package workload

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/tiers"
)

func TestKVHitRatesBoundedByBelady(t *testing.T) {
	rows, reach, err := kvHitRates(KVOptions{Items: 500, Accesses: 5000, Seed: 3, Strategies: tiers.Strategies()})
	if err != nil {
		t.Fatal(err)
	}
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
// prints it: go test ./internal/bench/ -run '^$' -bench RunKVQuick -benchtime 1x
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
