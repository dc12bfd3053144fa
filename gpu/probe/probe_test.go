package probe

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvsidecar/kvsidecar/gpu"
)

func TestRunOnCPU(t *testing.T) {
	// A stand-in for the benchmark's Focus latency: called once per size,
	// after that size's bandwidth, with the repetitions asked for.
	var sizes []int
	stub := func(dev gpu.Device, data []byte, reps int) (Latency, error) {
		sizes = append(sizes, len(data))
		return Latency{BlockSize: len(data), Ops: reps, PutP50Ms: 1, PutP99Ms: 2, GetP50Ms: 1, GetP99Ms: 2}, nil
	}
	r, err := Run(Options{Kind: "cpu", Sizes: []int{64 << 10, 1 << 20}, Reps: 3, Latency: stub})
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != "cpu" || r.GPU != nil || !strings.Contains(r.Baseline, "copy()") {
		t.Fatalf("report header %+v", r)
	}
	if len(r.Bandwidth) != 2*2*2 || len(r.Latency) != 2 || !slices.Equal(sizes, []int{64 << 10, 1 << 20}) || r.Latency[1].Ops != 3 {
		t.Fatalf("%d bandwidth rows, latency %+v of sizes %v", len(r.Bandwidth), r.Latency, sizes)
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
	var out bytes.Buffer
	if err := WriteTable(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"device: cpu (cpu)", "focus latency", "bandwidth (GB/s)", "pageable", "1 MiB", "no pinned memory"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	var back Report
	raw, _ := json.Marshal(r)
	if err := json.Unmarshal(raw, &back); err != nil || len(back.Bandwidth) != len(r.Bandwidth) {
		t.Fatalf("JSON round trip: %v", err)
	}
	// Without the hook: bandwidth only, and no latency table.
	r, err = Run(Options{Kind: "cpu", Sizes: []int{64 << 10}, Reps: 2})
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := WriteTable(&out, r); err != nil || len(r.Latency) != 0 || strings.Contains(out.String(), "latency") || !strings.Contains(out.String(), "64 KiB") {
		t.Fatalf("%v: %+v\n%s", err, r, out.String())
	}
}

// gpuLikeDevice is a CPU device with the extra methods of the CUDA device,
// so Run's GPU paths (plain baseline, pinned memory) run here.
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

func TestRunUsesDeviceBaseline(t *testing.T) {
	cpu, _ := gpu.NewCPU(gpu.CPUOptions{})
	defer cpu.Close()
	dev := &gpuLikeDevice{CPU: cpu}
	r, err := Run(Options{Device: dev, Sizes: []int{256 << 10}, Reps: 2})
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
		t.Fatalf("Run leaked device memory: %+v", mi)
	}
}

func TestOptions(t *testing.T) {
	for _, o := range []Options{{Kind: "tpu"}, {Kind: "cpu", Sizes: []int{0}}, {Kind: "cpu", Reps: -1}} {
		if _, err := Run(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	o := Options{Quick: true}
	if err := o.EnsureDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	if o.Kind != "auto" || len(o.Sizes) != 3 || o.reps(1<<20) != 60 || o.reps(16<<20) != 16 || o.reps(256<<20) != 3 {
		t.Fatalf("defaults: %+v, reps %d/%d", o, o.reps(1<<20), o.reps(256<<20))
	}
}
