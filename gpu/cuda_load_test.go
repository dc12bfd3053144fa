//go:build linux && (amd64 || arm64)

package gpu

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
)

// These run the real purego loader (no fake): a CGO_ENABLED=0 binary must
// dlopen, and a library that is missing or is not the CUDA driver must be
// a typed error, never a panic.

func TestLoadDriverMissingLibrary(t *testing.T) {
	_, err := NewCUDA(CUDAOptions{Library: "/nonexistent/libcuda.so.1"})
	if !errors.Is(err, ErrNoCUDA) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing library: %v", err)
	}
	if !strings.Contains(err.Error(), "dlopen /nonexistent/libcuda.so.1") {
		t.Fatalf("error does not say what failed: %v", err)
	}
}

func TestLoadDriverNotCUDA(t *testing.T) {
	// libc loads fine but has no cuInit.
	_, err := CUDADevices("libc.so.6")
	if errors.Is(err, ErrNoCUDA) && strings.Contains(err.Error(), "dlopen") {
		t.Skipf("no glibc here to stand in for a library without the driver API: %v", err)
	}
	if !errors.Is(err, ErrNoCUDA) || !strings.Contains(err.Error(), "symbol cuInit not found") {
		t.Fatalf("library without the driver API: %v", err)
	}
}

// TestDriverSignaturesBind registers every driver entry point's Go type with
// purego (against some libc function, never called): purego panics at
// registration on a type it cannot pass, which would otherwise surface only
// on a GPU host.
func TestDriverSignaturesBind(t *testing.T) {
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Skipf("no glibc here: %v", err)
	}
	sym, err := purego.Dlsym(h, "abs")
	if err != nil {
		t.Fatal(err)
	}
	d := &driver{}
	for _, s := range d.symbols() {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: purego cannot bind %T: %v", s.names[0], s.fptr, r)
				}
			}()
			purego.RegisterFunc(s.fptr, sym)
		}()
	}
}

// TestStubDriver builds testdata/stubcuda.c into a libcuda.so.1 stand-in
// (when a C compiler is at hand) and drives the CUDA device through the
// real purego binding: symbol lookup, 64-bit arguments, pointers written by
// C, return codes and the OOM classification cross the C ABI here.
func TestStubDriver(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build the stub driver")
	}
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", lib, "testdata/stubcuda.c").CombinedOutput(); err != nil {
		t.Skipf("cannot build the stub driver: %v\n%s", err, out)
	}
	info, err := CUDADevices(lib)
	if err != nil {
		t.Fatal(err)
	}
	want := DeviceInfo{Name: "Stub GPU", ComputeCapability: "8.6", PCIBusID: "0000:3b:00.0", TotalBytes: 64 << 20, FreeBytes: 64 << 20}
	if info.DriverVersion != "13.0" || len(info.Devices) != 1 || info.Devices[0] != want {
		t.Fatalf("CUDADevices = %+v", info)
	}
	c, err := NewCUDA(CUDAOptions{Library: lib, SlabBytes: 8 << 20, Streams: 2, StagingBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(8, 9))
	for _, n := range []int{1, 100_000, 3 << 20} {
		b, src := stagedRoundTrip(t, c, rng, n)
		pin, err := c.AllocHost(n)
		if err != nil {
			t.Fatal(err)
		}
		if el, err := c.CopyOutTimed(pin, b); err != nil || el <= 0 || !bytes.Equal(pin, src) {
			t.Fatalf("%d bytes pinned, timed: %v, %v", n, el, err)
		}
		if err := c.FreeHost(pin); err != nil {
			t.Fatal(err)
		}
		if err := c.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	// The stub's 64 MiB are full after 8 slabs: OOM crosses the ABI as
	// CUresult 2 and is classified.
	var err2 error
	for range 100 {
		if _, err2 = c.Alloc(7 << 20); err2 != nil {
			break
		}
	}
	var ce *CUDAError
	if !errors.Is(err2, ErrOutOfMemory) || !errors.As(err2, &ce) || ce.Desc != "out of memory" {
		t.Fatalf("stub OOM: %v", err2)
	}
	if mi, err := c.MemInfo(); err != nil || mi.Total != 64<<20 {
		t.Fatalf("MemInfo = %+v, %v", mi, err)
	}
}
