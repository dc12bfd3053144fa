//go:build linux

package gpu

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// The tests in this file drive the CUDA device against fakeGPU: they run
// everywhere and check the device's own logic. cuda_test.go runs the same
// kinds of checks against a real GPU when one is there.

func newFakeCUDA(t *testing.T, capacity uint64, opts CUDAOptions) (*CUDA, *fakeGPU) {
	t.Helper()
	f, d := newFakeGPU(capacity)
	if opts.StagingBytes == 0 {
		opts.StagingBytes = 16 << 10 // small chunks: many per copy
	}
	if opts.SlabBytes == 0 {
		opts.SlabBytes = 1 << 20
	}
	if err := opts.EnsureDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	c, err := newCUDA(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c, f
}

func checkNoLeaks(t *testing.T, f *fakeGPU) {
	t.Helper()
	dev, host, streams, events, retained := f.leaks()
	if dev != 0 || host != 0 || streams != 0 || events != 0 || retained != 0 {
		t.Fatalf("after Close: %d device bytes, %d pinned, %d streams, %d events, %d context refs", dev, host, streams, events, retained)
	}
	if len(f.noCtx) > 0 {
		t.Fatalf("calls without the context current: %v", f.noCtx)
	}
}

func TestCUDAFakeRoundTrip(t *testing.T) {
	c, f := newFakeCUDA(t, 64<<20, CUDAOptions{Streams: 2})
	if c.Kind() != KindCUDA || c.Name() != "Fake GPU" {
		t.Fatalf("kind %v name %q", c.Kind(), c.Name())
	}
	if in := c.Info(); in.ComputeCapability != "9.0" || in.PCIBusID != "0000:65:00.0" || in.TotalBytes != 64<<20 {
		t.Fatalf("info %+v", in)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	// Sizes around the 16 KiB staging chunk: one byte, a partial chunk,
	// exactly one, many with a tail.
	for _, n := range []int{1, 4095, 16 << 10, 3*(16<<10) + 7, 300_001} {
		b, src := stagedRoundTrip(t, c, rng, n)
		got := make([]byte, n)
		// Pinned memory takes the direct path.
		pin, err := c.AllocHost(n)
		if err != nil {
			t.Fatal(err)
		}
		if !c.isPinned(pin) || !c.isPinned(pin[n/2:]) || c.isPinned(src) {
			t.Fatal("isPinned misclassifies")
		}
		if err := c.CopyOut(pin, b); err != nil || !bytes.Equal(pin, src) {
			t.Fatalf("%d bytes: pinned CopyOut: %v", n, err)
		}
		pin[0] ^= 0xff
		if err := c.CopyIn(b, pin); err != nil {
			t.Fatal(err)
		}
		if err := c.PlainCopyOut(got, b); err != nil || got[0] != src[0]^0xff || !bytes.Equal(got[1:], src[1:]) {
			t.Fatalf("%d bytes: pinned CopyIn then PlainCopyOut: %v", n, err)
		}
		if err := c.PlainCopyIn(b, src); err != nil {
			t.Fatal(err)
		}
		if err := c.CopyOut(got, b); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("%d bytes: PlainCopyIn: %v", n, err)
		}
		if err := c.FreeHost(pin); err != nil {
			t.Fatal(err)
		}
		if err := c.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, f)
}

func TestCUDAFakeConcurrent(t *testing.T) {
	// More goroutines than lanes and than cores, yielding between calls, so
	// goroutines change OS threads: the fake fails any call made on a
	// thread where the context is not current.
	c, f := newFakeCUDA(t, 256<<20, CUDAOptions{Streams: 2})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range 30 {
				n := 1 + rng.IntN(100_000)
				b, err := c.Alloc(n)
				if err != nil {
					t.Error(err)
					return
				}
				src := randomBytes(rng, n)
				runtime.Gosched()
				if err := c.CopyIn(b, src); err != nil {
					t.Error(err)
					return
				}
				got := make([]byte, n)
				if err := c.CopyOut(got, b); err != nil || !bytes.Equal(got, src) {
					t.Errorf("goroutine %d op %d: %v, equal %v", g, i, err, bytes.Equal(got, src))
					return
				}
				if err := c.Free(b); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if st := c.PoolStats(); st.Buffers != 0 || st.InUseBytes != 0 {
		t.Fatalf("pool after frees: %+v", st)
	}
	c.Close()
	checkNoLeaks(t, f)
}

func TestCUDAFakePoolReuse(t *testing.T) {
	c, f := newFakeCUDA(t, 64<<20, CUDAOptions{SlabBytes: 1 << 20})
	defer c.Close()
	for range 200 {
		b, err := c.Alloc(64 << 10)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	var bufs []Buffer
	for range 16 { // exactly one slab's worth
		b, err := c.Alloc(64 << 10)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	f.mu.Lock()
	allocs := f.allocs
	f.mu.Unlock()
	if allocs != 1 {
		t.Fatalf("216 block allocations made %d cuMemAlloc calls, want 1 slab", allocs)
	}
	if st := c.PoolStats(); st.Slabs != 1 || st.Buffers != 16 || st.InUseBytes != 1<<20 || st.ReservedBytes != 1<<20 {
		t.Fatalf("pool %+v", st)
	}
	for _, b := range bufs {
		c.Free(b)
	}
}

func TestCUDAFakeOutOfMemory(t *testing.T) {
	c, f := newFakeCUDA(t, 3<<20, CUDAOptions{SlabBytes: 2 << 20})
	// First block: a 2 MiB slab. Second: no room for another slab, so the
	// pool takes just what the block needs. Third: the GPU is full.
	a, err := c.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Alloc(1 << 20) // still fits in the first slab
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Alloc(1 << 20)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("alloc on a full GPU: %v", err)
	}
	var ce *CUDAError
	if !errors.As(err, &ce) || ce.Code != int(cuErrOutOfMemory) || ce.Op != "cuMemAlloc_v2" || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("OOM error %v does not carry the CUresult", err)
	}
	if _, err := c.Alloc(8 << 20); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("dedicated alloc on a full GPU: %v", err)
	}
	// Freeing makes room again.
	for _, x := range []Buffer{a, b, d} {
		if err := c.Free(x); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Alloc(1 << 20); err != nil {
		t.Fatalf("alloc after frees: %v", err)
	}
	c.Close()
	checkNoLeaks(t, f)

	// MaxBytes caps the pool before the GPU is full.
	c, f = newFakeCUDA(t, 64<<20, CUDAOptions{SlabBytes: 1 << 20, MaxBytes: 2 << 20})
	if _, err := c.Alloc(3 << 20); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("alloc past MaxBytes: %v", err)
	}
	mi, err := c.MemInfo()
	if err != nil || mi.Total != 2<<20 || mi.Free != 2<<20 {
		t.Fatalf("MemInfo under MaxBytes = %+v, %v", mi, err)
	}
	c.Close()
	checkNoLeaks(t, f)
}

func TestCUDAFakeMemInfo(t *testing.T) {
	c, _ := newFakeCUDA(t, 64<<20, CUDAOptions{SlabBytes: 1 << 20})
	defer c.Close()
	if _, err := c.Alloc(64 << 10); err != nil {
		t.Fatal(err)
	}
	mi, err := c.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	// The driver sees a 1 MiB slab gone; the device can still hand out
	// all but the 64 KiB block.
	if mi.Total != 64<<20 || mi.Free != 64<<20-64<<10 {
		t.Fatalf("MemInfo = %+v", mi)
	}
}

func TestCUDAFakeErrors(t *testing.T) {
	c, f := newFakeCUDA(t, 64<<20, CUDAOptions{Streams: 1})
	b, err := c.Alloc(100_000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Alloc(0); err == nil {
		t.Fatal("Alloc(0) succeeded")
	}
	if err := c.CopyIn(b, make([]byte, 100_001)); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("oversized copy: %v", err)
	}
	if err := c.CopyOut(make([]byte, 10), Buffer{Handle: b.Handle + 1, Size: 10}); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("copy from an unknown handle: %v", err)
	}
	if err := c.Free(Buffer{Handle: b.Handle, Size: 5}); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("free with the wrong size: %v", err)
	}
	if err := c.FreeHost(make([]byte, 8)); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("FreeHost of Go memory: %v", err)
	}

	// A DMA failing midway through a staged copy is an error naming the
	// call, and the lane (the only one) is usable afterwards.
	f.failNext("cuMemcpyHtoDAsync_v2", cuErrIllegalAddress)
	err = c.CopyIn(b, make([]byte, 100_000))
	var ce *CUDAError
	if !errors.As(err, &ce) || ce.Op != "cuMemcpyHtoDAsync_v2" || errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("injected DMA failure: %v", err)
	}
	f.failNext("cuEventSynchronize", cuErrIllegalAddress)
	if err := c.CopyOut(make([]byte, 100_000), b); err == nil {
		t.Fatal("injected event failure not reported")
	}
	src := bytes.Repeat([]byte{7}, 100_000)
	if err := c.CopyIn(b, src); err != nil {
		t.Fatalf("copy after a failed one: %v", err)
	}

	if err := c.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(b); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("double free: %v", err)
	}
	if err := c.CopyIn(b, src); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("use after free: %v", err)
	}
	c.Close()
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for name, err := range map[string]error{
		"alloc":   func() error { _, err := c.Alloc(1); return err }(),
		"copy":    c.CopyIn(b, src),
		"meminfo": func() error { _, err := c.MemInfo(); return err }(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	checkNoLeaks(t, f)
}

func TestCUDAFakeOpenFailures(t *testing.T) {
	// cuInit reporting no device is ErrNoCUDA (and ErrUnavailable) with
	// the driver's description.
	f, d := newFakeGPU(1 << 20)
	f.failNext("cuInit", cuErrNoDevice)
	err := d.initialize()
	if !errors.Is(err, ErrNoCUDA) || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no CUDA-capable device") {
		t.Fatalf("cuInit NO_DEVICE: %v", err)
	}
	if d.initialize() != err {
		t.Fatal("cuInit outcome not kept")
	}

	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	f, d = newFakeGPU(1 << 20)
	f.failNext("cuInit", cuErrNoDevice)
	if err := d.initialize(); !strings.Contains(err.Error(), `CUDA_VISIBLE_DEVICES="" hides every device`) {
		t.Fatalf("empty CUDA_VISIBLE_DEVICES not explained: %v", err)
	}

	// An ordinal past the visible GPUs.
	_, d = newFakeGPU(1 << 20)
	opts := CUDAOptions{Ordinal: 1}
	opts.EnsureDefaults()
	if _, err := newCUDA(d, opts); !errors.Is(err, ErrNoCUDA) || !strings.Contains(err.Error(), "ordinal 1 asked, 1 visible") {
		t.Fatalf("ordinal past the visible GPUs: %v", err)
	}

	// No room for the pinned staging buffers: OOM, and nothing leaks.
	f, d = newFakeGPU(1 << 20)
	f.failNext("cuMemHostAlloc", cuErrOutOfMemory)
	opts = CUDAOptions{}
	opts.EnsureDefaults()
	if _, err := newCUDA(d, opts); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("staging alloc failure: %v", err)
	}
	checkNoLeaks(t, f)
}

func TestCUDAFakeTimed(t *testing.T) {
	c, f := newFakeCUDA(t, 64<<20, CUDAOptions{})
	b, _ := c.Alloc(100_000)
	el, err := c.CopyInTimed(b, make([]byte, 100_000))
	if err != nil || el <= 0 {
		t.Fatalf("CopyInTimed = %v, %v", el, err)
	}
	el, err = c.CopyOutTimed(make([]byte, 100_000), b)
	if err != nil || el <= 0 {
		t.Fatalf("CopyOutTimed = %v, %v", el, err)
	}
	c.Close()
	checkNoLeaks(t, f)
}
