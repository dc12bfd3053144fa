package gpu

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestOpenCPU(t *testing.T) {
	d, err := Open("cpu", OpenOptions{CPU: CPUOptions{Capacity: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Kind() != KindCPU {
		t.Fatalf("kind %v", d.Kind())
	}
	if mi, _ := d.MemInfo(); mi.Total != 4096 {
		t.Fatalf("CPU options not passed: %+v", mi)
	}
	if _, err := Open("cpu", OpenOptions{CPU: CPUOptions{Capacity: -1}}); err == nil {
		t.Fatal("invalid CPU options accepted")
	}
	if _, err := Open("tpu", OpenOptions{}); err == nil || !strings.Contains(err.Error(), `"tpu"`) {
		t.Fatalf("unknown kind: %v", err)
	}
}

func TestOpenCUDAUnavailable(t *testing.T) {
	opts := OpenOptions{CUDA: CUDAOptions{Library: "/nonexistent/libcuda.so.1"}}
	if _, err := Open("cuda", opts); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf(`Open("cuda") without a driver: %v`, err)
	}
}

func TestOpenAutoFallsBackAndLogsOnce(t *testing.T) {
	fallbackLogged.Store(false)
	t.Cleanup(func() { fallbackLogged.Store(false) })
	var logs bytes.Buffer
	opts := OpenOptions{
		CPU:    CPUOptions{Capacity: 1 << 20},
		CUDA:   CUDAOptions{Library: "/nonexistent/libcuda.so.1"},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}
	for _, kind := range []string{"auto", "", "auto"} {
		d, err := Open(kind, opts)
		if err != nil {
			t.Fatal(err)
		}
		if d.Kind() != KindCPU {
			t.Fatalf("auto without a driver opened %v", d.Kind())
		}
		// The fallback device works.
		b, err := d.Alloc(10)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.CopyIn(b, []byte("0123456789")); err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
	out := logs.String()
	if strings.Count(out, "using the CPU device") != 1 {
		t.Fatalf("want one fallback line, got:\n%s", out)
	}
	if !strings.Contains(out, "level=INFO") || !strings.Contains(out, "dlopen /nonexistent/libcuda.so.1") {
		t.Fatalf("fallback line lacks level or reason:\n%s", out)
	}
}

func TestParseKind(t *testing.T) {
	for in, want := range map[string]string{"cpu": "cpu", "cuda": "cuda", "auto": "auto", "": "auto"} {
		if got, err := ParseKind(in); err != nil || got != want {
			t.Errorf("ParseKind(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseKind("gpu"); err == nil {
		t.Error(`ParseKind("gpu") succeeded`)
	}
}
