package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/gpu/gputest"
	"github.com/kvsidecar/kvsidecar/gpu/probe"
)

// `sidecar bench gpu` on the CPU device: the probe's bandwidth rows, then
// FocusLatency's, one per size.
func TestRunGPUOnCPU(t *testing.T) {
	r, err := probe.Run(probe.Options{Kind: "cpu", Sizes: []int{64 << 10, 1 << 20}, Reps: 3, Latency: FocusLatency})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Bandwidth) != 2*2*2 || len(r.Latency) != 2 {
		t.Fatalf("%d bandwidth rows, %d latency rows", len(r.Bandwidth), len(r.Latency))
	}
	for i, l := range r.Latency {
		if l.BlockSize != []int{64 << 10, 1 << 20}[i] || l.Ops != 3 || l.PutP50Ms <= 0 || l.GetP50Ms <= 0 || l.PutP99Ms < l.PutP50Ms || l.GetP99Ms < l.GetP50Ms {
			t.Errorf("latency %+v", l)
		}
	}
}

// TestRunGPUOnCUDA runs the benchmark on a real GPU and logs its tables
// (go test -v, or bench.test -test.v on a GPU host; KVSIDECAR_BENCH_FULL=1
// for the full run). It skips where CUDA is unusable (fails under
// KVSIDECAR_REQUIRE_GPU=1).
func TestRunGPUOnCUDA(t *testing.T) {
	if _, err := gpu.CUDADevices(""); errors.Is(err, gpu.ErrNoCUDA) {
		gputest.NoCUDA(t, "%v", err)
	}
	r, err := probe.Run(probe.Options{Kind: "cuda", Quick: os.Getenv("KVSIDECAR_BENCH_FULL") != "1", Latency: FocusLatency})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	probe.WriteTable(&out, r)
	raw, _ := json.Marshal(r)
	t.Logf("\n%s\n%s", out.String(), raw)
	if r.Kind != "cuda" || r.GPU == nil || len(r.Bandwidth) != 12 || len(r.Latency) != 3 {
		t.Fatalf("report %+v", r)
	}
	for _, b := range r.Bandwidth {
		if b.GBps <= 0 || b.PlainGBps <= 0 || b.EventGBps <= 0 {
			t.Errorf("row %+v", b)
		}
	}
}
