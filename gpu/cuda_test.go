package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/gpu/gputest"
)

// Tests against a real GPU. They skip, saying why, where the driver or a
// GPU is missing, or fail under KVSIDECAR_REQUIRE_GPU=1 (gputest.NoCUDA);
// scripts/gpu-test.sh builds this package's test binary to run them on a
// GPU host, with that variable set.

func openCUDA(t *testing.T, opts CUDAOptions) *CUDA {
	t.Helper()
	c, err := NewCUDA(opts)
	if errors.Is(err, ErrNoCUDA) {
		gputest.NoCUDA(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func TestCUDADevices(t *testing.T) {
	info, err := CUDADevices("")
	if errors.Is(err, ErrNoCUDA) {
		gputest.NoCUDA(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver %s, CUDA_VISIBLE_DEVICES=%s", info.DriverVersion, info.VisibleDevices)
	cc := regexp.MustCompile(`^\d+\.\d+$`)
	pci := regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.0$`)
	for _, d := range info.Devices {
		t.Logf("%+v", d)
		if d.Name == "" || !cc.MatchString(d.ComputeCapability) || !pci.MatchString(d.PCIBusID) ||
			d.TotalBytes == 0 || d.FreeBytes == 0 || d.FreeBytes > d.TotalBytes {
			t.Errorf("implausible device %+v", d)
		}
	}
	if len(info.Devices) == 0 || !regexp.MustCompile(`^\d+\.\d$`).MatchString(info.DriverVersion) {
		t.Fatalf("info %+v", info)
	}
}

// stagedRoundTrip allocates n bytes on c and copies n random bytes in and
// out through pageable memory (staged both ways), failing t unless they
// come back equal. It returns the buffer and the bytes it holds.
func stagedRoundTrip(t *testing.T, c *CUDA, rng *rand.Rand, n int) (Buffer, []byte) {
	t.Helper()
	b, err := c.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	src := randomBytes(rng, n)
	got := make([]byte, n)
	if err := c.CopyIn(b, src); err != nil {
		t.Fatal(err)
	}
	if err := c.CopyOut(got, b); err != nil || !bytes.Equal(got, src) {
		t.Fatalf("%d bytes pageable: %v, equal %v", n, err, bytes.Equal(got, src))
	}
	return b, src
}

func TestCUDARoundTrip(t *testing.T) {
	c := openCUDA(t, CUDAOptions{})
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 4097, 1 << 20, 16<<20 + 13, 64 << 20} {
		b, src := stagedRoundTrip(t, c, rng, n)
		got := make([]byte, n)
		// Pinned: one DMA each way, checked against the plain driver copy.
		pin, err := c.AllocHost(n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range pin {
			pin[i] = ^src[i]
		}
		if err := c.CopyIn(b, pin); err != nil {
			t.Fatal(err)
		}
		if err := c.PlainCopyOut(got, b); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i] != ^src[i] {
				t.Fatalf("%d bytes pinned CopyIn: byte %d differs", n, i)
			}
		}
		clear(pin)
		if err := c.PlainCopyIn(b, src); err != nil {
			t.Fatal(err)
		}
		if err := c.CopyOut(pin, b); err != nil || !bytes.Equal(pin, src) {
			t.Fatalf("%d bytes pinned CopyOut: %v", n, err)
		}
		if err := c.FreeHost(pin); err != nil {
			t.Fatal(err)
		}
		if err := c.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCUDAEventsTimeWork(t *testing.T) {
	c := openCUDA(t, CUDAOptions{})
	small, big := 1<<20, 256<<20
	var times []float64
	for _, n := range []int{small, big} {
		b, err := c.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		pin, err := c.AllocHost(n)
		if err != nil {
			t.Fatal(err)
		}
		el, err := c.CopyInTimed(b, pin)
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.CopyOutTimed(pin, b)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d MiB pinned: in %v (%.1f GB/s), out %v", n>>20, el, float64(n)/el.Seconds()/1e9, out)
		if el <= 0 || out <= 0 {
			t.Fatalf("events measured %v and %v for %d bytes", el, out, n)
		}
		times = append(times, el.Seconds())
		c.FreeHost(pin)
		c.Free(b)
	}
	// 256 times the bytes over the same link: the events must see it.
	if times[1] <= times[0] {
		t.Fatalf("256 MiB took %v s, 1 MiB %v s: events do not time the copies", times[1], times[0])
	}
}

func TestCUDAPoolReuse(t *testing.T) {
	c := openCUDA(t, CUDAOptions{SlabBytes: 64 << 20})
	for range 1000 {
		b, err := c.Alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	var bufs []Buffer
	for range 64 {
		b, err := c.Alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	if st := c.PoolStats(); st.Slabs != 1 || st.ReservedBytes != 64<<20 || st.Buffers != 64 {
		t.Fatalf("1064 blocks of 1 MiB: %+v, want one 64 MiB slab", st)
	}
	for _, b := range bufs {
		c.Free(b)
	}
}

func TestCUDAOutOfMemory(t *testing.T) {
	c := openCUDA(t, CUDAOptions{MaxBytes: 512 << 20, SlabBytes: 128 << 20})
	// More than the GPU has: the driver's OOM, classified.
	_, err := c.Alloc(int(c.Info().TotalBytes) + 1)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("alloc past the GPU's memory: %v", err)
	}
	var ce *CUDAError
	c2 := openCUDA(t, CUDAOptions{})
	if _, err := c2.Alloc(int(c.Info().TotalBytes) + 1); !errors.As(err, &ce) || ce.Op != "cuMemAlloc_v2" {
		t.Fatalf("driver OOM not a CUDAError: %v", err)
	}
	// Past MaxBytes: the pool's OOM.
	var bufs []Buffer
	for {
		b, err := c.Alloc(100 << 20)
		if errors.Is(err, ErrOutOfMemory) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
		if len(bufs) > 10 {
			t.Fatal("MaxBytes not enforced")
		}
	}
	// The device still works after OOM.
	c.Free(bufs[0])
	b, err := c.Alloc(100 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CopyIn(b, make([]byte, 100<<20)); err != nil {
		t.Fatal(err)
	}
}

func TestCUDAConcurrent(t *testing.T) {
	c := openCUDA(t, CUDAOptions{Streams: 2})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 20 {
				n := 1 + rng.IntN(4<<20)
				b, err := c.Alloc(n)
				if err != nil {
					t.Error(err)
					return
				}
				src := randomBytes(rng, n)
				got := make([]byte, n)
				if err := c.CopyIn(b, src); err != nil {
					t.Error(err)
				} else if err := c.CopyOut(got, b); err != nil || !bytes.Equal(got, src) {
					t.Errorf("goroutine %d: %v, equal %v", g, err, bytes.Equal(got, src))
				}
				c.Free(b)
			}
		})
	}
	wg.Wait()
	if st := c.PoolStats(); st.Buffers != 0 {
		t.Fatalf("leaked buffers: %+v", st)
	}
}

// TestCUDAVisibleDevices re-runs this binary with CUDA_VISIBLE_DEVICES set
// (the driver reads it once, at cuInit, so it takes a fresh process).
func TestCUDAVisibleDevices(t *testing.T) {
	if os.Getenv("KVSIDECAR_GPU_HELPER") == "1" {
		info, err := CUDADevices("")
		fmt.Printf("devices=%d err=%v\n", len(info.Devices), err)
		return
	}
	if _, err := CUDADevices(""); errors.Is(err, ErrNoCUDA) {
		gputest.NoCUDA(t, "%v", err)
	}
	run := func(visible string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCUDAVisibleDevices$")
		cmd.Env = append(os.Environ(), "KVSIDECAR_GPU_HELPER=1", "CUDA_VISIBLE_DEVICES="+visible)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := run("0"); !strings.Contains(out, "devices=1 err=<nil>") {
		t.Errorf("CUDA_VISIBLE_DEVICES=0:\n%s", out)
	}
	if out := run(""); !strings.Contains(out, "devices=0") || !strings.Contains(out, "no usable CUDA driver") {
		t.Errorf("CUDA_VISIBLE_DEVICES empty:\n%s", out)
	}
}
