package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvsidecar/kvsidecar/gpu"
)

func TestRunGPUOnCPU(t *testing.T) {
	r, err := RunGPU(GPUOptions{Kind: "cpu", Sizes: []int{64 << 10, 1 << 20}, Reps: 3})
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != "cpu" || r.GPU != nil || !strings.Contains(r.Baseline, "copy()") {
		t.Fatalf("report header %+v", r)
	}
	if len(r.Bandwidth) != 2*2*2 || len(r.Latency) != 2 {
		t.Fatalf("%d bandwidth rows, %d latency rows", len(r.Bandwidth), len(r.Latency))
	}
	seen := map[string]bool{}
	for _, b := range r.Bandwidth {
		seen[b.Direction+"/"+b.Host] = true
		if b.GBps <= 0 || b.PlainGBps <= 0 || b.Ratio <= 0 || b.Reps != 3 || b.EventGBps != 0 {
			t.Errorf("row %+v", b)
		}
	}
	if len(seen) != 4 {
		t.Fatalf("combinations measured: %v", seen)
	}
	for _, l := range r.Latency {
		if l.Ops != 3 || l.PutP50Ms <= 0 || l.GetP50Ms <= 0 || l.PutP99Ms < l.PutP50Ms || l.GetP99Ms < l.GetP50Ms {
			t.Errorf("latency %+v", l)
		}
	}
	var out bytes.Buffer
	if err := WriteGPUTable(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"device: cpu (cpu)", "focus latency", "bandwidth (GB/s)", "pageable", "1 MiB", "no pinned memory"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	var back GPUReport
	raw, _ := json.Marshal(r)
	if err := json.Unmarshal(raw, &back); err != nil || len(back.Bandwidth) != len(r.Bandwidth) {
		t.Fatalf("JSON round trip: %v", err)
	}
}

// gpuLikeDevice is a CPU device with the extra methods of the CUDA device,
// so RunGPU's GPU paths (plain baseline, pinned memory) run here.
type gpuLikeDevice struct {
	*gpu.CPU
	plainIn, plainOut, hostAllocs, hostFrees atomic.Int64
}

func (d *gpuLikeDevice) PlainCopyIn(dst gpu.Buffer, src []byte) error {
	d.plainIn.Add(1)
	return d.CopyIn(dst, src)
}

func (d *gpuLikeDevice) PlainCopyOut(dst []byte, src gpu.Buffer) error {
	d.plainOut.Add(1)
	return d.CopyOut(dst, src)
}

func (d *gpuLikeDevice) AllocHost(n int) ([]byte, error) {
	d.hostAllocs.Add(1)
	return make([]byte, n), nil
}

func (d *gpuLikeDevice) FreeHost([]byte) error {
	d.hostFrees.Add(1)
	return nil
}

func TestRunGPUUsesDeviceBaseline(t *testing.T) {
	cpu, _ := gpu.NewCPU(gpu.CPUOptions{})
	defer cpu.Close()
	dev := &gpuLikeDevice{CPU: cpu}
	r, err := RunGPU(GPUOptions{Device: dev, Sizes: []int{256 << 10}, Reps: 2, SkipLatency: true})
	if err != nil {
		t.Fatal(err)
	}
	// Per host kind and direction: one warm-up and two timed plain copies.
	if dev.plainIn.Load() != 2*3 || dev.plainOut.Load() != 2*3 {
		t.Fatalf("plain copies: %d in, %d out", dev.plainIn.Load(), dev.plainOut.Load())
	}
	if dev.hostAllocs.Load() != 1 || dev.hostFrees.Load() != 1 {
		t.Fatalf("pinned memory: %d allocs, %d frees", dev.hostAllocs.Load(), dev.hostFrees.Load())
	}
	if len(r.Latency) != 0 || !strings.Contains(r.Baseline, "cuMemcpyHtoD_v2") {
		t.Fatalf("report %+v", r)
	}
	for _, n := range r.Notes {
		if strings.Contains(n, "no pinned memory") {
			t.Fatalf("note %q for a device with pinned memory", n)
		}
	}
	if mi, _ := cpu.MemInfo(); mi.Free != mi.Total {
		t.Fatalf("RunGPU leaked device memory: %+v", mi)
	}
}

func TestRunGPUOptions(t *testing.T) {
	for _, o := range []GPUOptions{{Kind: "tpu"}, {Kind: "cpu", Sizes: []int{0}}, {Kind: "cpu", Reps: -1}} {
		if _, err := RunGPU(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	o := GPUOptions{Quick: true}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	if o.Kind != "auto" || len(o.Sizes) != 3 || o.reps(1<<20) != 60 || o.reps(16<<20) != 16 || o.reps(256<<20) != 3 {
		t.Fatalf("defaults: %+v, reps %d/%d", o, o.reps(1<<20), o.reps(256<<20))
	}
}

// TestRunGPUOnCUDA runs the benchmark on a real GPU and logs its tables
// (go test -v, or bench.test -test.v on a GPU host; KVSIDECAR_BENCH_FULL=1
// for the full run). It skips where CUDA is unusable.
func TestRunGPUOnCUDA(t *testing.T) {
	if _, err := gpu.CUDADevices(""); errors.Is(err, gpu.ErrNoCUDA) {
		t.Skipf("no usable CUDA on this host: %v", err)
	}
	r, err := RunGPU(GPUOptions{Kind: "cuda", Quick: os.Getenv("KVSIDECAR_BENCH_FULL") != "1"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	WriteGPUTable(&out, r)
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
