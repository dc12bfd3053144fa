package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/gpu"
)

// oomDevice is a CPU device that fails like a full GPU on demand: Alloc
// returns the error the CUDA device returns for CUDA_ERROR_OUT_OF_MEMORY,
// and CopyIn can fail like a broken transfer.
type oomDevice struct {
	*gpu.CPU
	oom, copyFails atomic.Bool
	allocTries     atomic.Int64
	live           atomic.Int64
}

func (d *oomDevice) Alloc(n int) (gpu.Buffer, error) {
	d.allocTries.Add(1)
	if d.oom.Load() {
		return gpu.Buffer{}, fmt.Errorf("gpu: cuda alloc %d bytes: %w", n, &gpu.CUDAError{Op: "cuMemAlloc_v2", Code: 2})
	}
	b, err := d.CPU.Alloc(n)
	if err == nil {
		d.live.Add(1)
	}
	return b, err
}

func (d *oomDevice) Free(b gpu.Buffer) error {
	err := d.CPU.Free(b)
	if err == nil {
		d.live.Add(-1)
	}
	return err
}

func (d *oomDevice) CopyIn(dst gpu.Buffer, src []byte) error {
	if d.copyFails.Load() {
		return errors.New("gpu: cuda copy: cuMemcpyHtoDAsync_v2: CUDA_ERROR_ILLEGAL_ADDRESS")
	}
	return d.CPU.CopyIn(dst, src)
}

// TestFocusDeviceOutOfMemory checks that a Focus device out of memory
// demotes instead of failing: puts land in Working, promotions stay in
// Working, and both work again once the device has room.
func TestFocusDeviceOutOfMemory(t *testing.T) {
	cpu, _ := gpu.NewCPU(gpu.CPUOptions{})
	dev := &oomDevice{CPU: cpu}
	defer cpu.Close()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	s, err := Open(Options{
		Device: dev, Clock: clock,
		Focus:   Budget{MaxBytes: 1 << 20},
		Working: Budget{MaxBytes: 4 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	meta := Meta{DType: DTypeF16}
	tier := func(key string) Tier {
		t.Helper()
		_, _, tr, err := s.Stat(key)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}

	if err := s.Put("fits", Value{Meta: meta, Data: value("fits", 64<<10)}, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if tier("fits") != TierFocus {
		t.Fatalf("put with room landed in %v", tier("fits"))
	}

	dev.oom.Store(true)
	if _, err := dev.Alloc(1); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("the fake's OOM does not classify as gpu.ErrOutOfMemory: %v", err)
	}
	want := value("oom", 64<<10)
	if err := s.Put("oom", Value{Meta: meta, Data: want}, PutOptions{}); err != nil {
		t.Fatalf("put on a full device: %v", err)
	}
	if tier("oom") != TierWorking {
		t.Fatalf("put on a full device landed in %v, want working", tier("oom"))
	}
	// Hot gets try to promote; the device refuses; the block stays in
	// Working and is served from there.
	tries := dev.allocTries.Load()
	for range 5 {
		v, tr, err := s.Get("oom")
		if err != nil || tr != TierWorking || !bytes.Equal(v.Data, want) {
			t.Fatalf("get on a full device: tier %v, %v, equal %v", tr, err, bytes.Equal(v.Data, want))
		}
	}
	if dev.allocTries.Load() == tries {
		t.Fatal("hot gets never tried to promote")
	}
	if tier("oom") != TierWorking {
		t.Fatalf("failed promotion moved the block to %v", tier("oom"))
	}
	if st := s.Stats().Tiers[0]; st.Tier != "focus" || st.Entries != 1 {
		t.Fatalf("focus after OOM: %+v", st)
	}

	// Room again: the next hot get promotes.
	dev.oom.Store(false)
	for range 3 {
		if _, _, err := s.Get("oom"); err != nil {
			t.Fatal(err)
		}
	}
	if tier("oom") != TierFocus {
		t.Fatalf("after the device has room: %v, want focus", tier("oom"))
	}

	// A failed copy frees the buffer it allocated, and the put still
	// succeeds through Working.
	dev.copyFails.Store(true)
	live := dev.live.Load()
	if err := s.Put("copyfail", Value{Meta: meta, Data: value("copyfail", 4096)}, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if tier("copyfail") != TierWorking || dev.live.Load() != live {
		t.Fatalf("failed copy: tier %v, live buffers %d -> %d", tier("copyfail"), live, dev.live.Load())
	}
}
