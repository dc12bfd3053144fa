package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/gpu"
)

func runGPUForTest(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runGPU(args, &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

func TestGPUCommandCPUJSON(t *testing.T) {
	code, out, errOut := runGPUForTest(t, nil, "--device", "cpu", "--json", "--probe-mib", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r gpuReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if r.Requested != "cpu" || r.Selected != "cpu" || r.Memory.Total == 0 {
		t.Fatalf("report %+v", r)
	}
	// Either the driver answered or the report says why not.
	if (r.CUDA == nil) == (r.CUDAError == "") {
		t.Fatalf("cuda %+v, cuda_error %q", r.CUDA, r.CUDAError)
	}
	if r.Probe == nil || len(r.Probe.Bandwidth) != 4 || r.Probe.Bandwidth[0].BlockSize != 1<<20 {
		t.Fatalf("probe %+v", r.Probe)
	}
	for _, b := range r.Probe.Bandwidth {
		if b.GBps <= 0 || b.Ratio <= 0 {
			t.Fatalf("probe row %+v", b)
		}
	}
}

func TestGPUCommandTable(t *testing.T) {
	// SIDECAR_DEVICE is read like every flag's variable.
	code, out, errOut := runGPUForTest(t, map[string]string{"SIDECAR_DEVICE": "cpu", "SIDECAR_PROBE_MIB": "1"})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"selected (--device cpu): cpu", "bandwidth (GB/s)", "pinned", "pageable"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "CUDA driver") && !strings.Contains(out, "CUDA: none usable: gpu: device unavailable") {
		t.Errorf("output neither lists GPUs nor says why not:\n%s", out)
	}
}

func TestGPUCommandNoCUDA(t *testing.T) {
	if _, err := gpu.CUDADevices(""); err == nil {
		t.Skip("this host has a usable GPU: --device cuda opens")
	}
	code, out, errOut := runGPUForTest(t, nil, "--device", "cuda", "--probe-mib", "0")
	if code != 1 || !strings.Contains(errOut, "no usable CUDA driver") || !strings.Contains(out, "not opened") {
		t.Fatalf("--device cuda without a GPU: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	// auto falls back to the CPU device.
	code, out, _ = runGPUForTest(t, nil, "--device", "auto", "--probe-mib", "0", "--json")
	var r gpuReport
	if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.Selected != "cpu" || r.Probe != nil {
		t.Fatalf("auto without a GPU: exit %d, %v, %+v", code, err, r)
	}
}

func TestGPUCommandBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--device", "tpu"}, {"--probe-mib", "-1"}, {"--nope"}, {"extra"}} {
		if code, _, _ := runGPUForTest(t, nil, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func TestOpenDevice(t *testing.T) {
	d, err := openDevice("cpu", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil || d.Kind() != gpu.KindCPU {
		t.Fatalf("openDevice(cpu) = %v, %v", d, err)
	}
	d.Close()
	if _, err := openDevice("gpu0", nil); err == nil {
		t.Fatal("openDevice accepted a bad kind")
	}
	d, err = openDevice("", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, cerr := gpu.CUDADevices(""); errors.Is(cerr, gpu.ErrNoCUDA) && d.Kind() != gpu.KindCPU {
		t.Fatalf("auto without CUDA opened %v", d.Kind())
	}
}
