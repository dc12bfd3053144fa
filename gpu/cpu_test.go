package gpu

import (
	"bytes"
	"errors"
	"sync"
	"testing"
)

func TestCPURoundTrip(t *testing.T) {
	d, err := NewCPU(CPUOptions{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Kind() != KindCPU || d.Kind().String() != "cpu" || d.Name() != "cpu" {
		t.Fatalf("kind %v name %q", d.Kind(), d.Name())
	}
	b, err := d.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	src := bytes.Repeat([]byte("kv"), 50)
	if err := d.CopyIn(b, src); err != nil {
		t.Fatal(err)
	}
	src[0] = 'X' // the device holds its own copy
	got := make([]byte, 100)
	if err := d.CopyOut(got, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte("kv"), 50)) {
		t.Fatalf("CopyOut = %q", got)
	}
	mi, _ := d.MemInfo()
	if mi.Total != 1<<20 || mi.Free != 1<<20-100 {
		t.Fatalf("MemInfo = %+v", mi)
	}
	if err := d.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(b); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("double free: %v", err)
	}
	if err := d.CopyOut(got, b); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("use after free: %v", err)
	}
	mi, _ = d.MemInfo()
	if mi.Free != 1<<20 {
		t.Fatalf("free after Free = %d", mi.Free)
	}
}

func TestCPUErrors(t *testing.T) {
	d, _ := NewCPU(CPUOptions{Capacity: 1000})
	if _, err := d.Alloc(0); err == nil {
		t.Fatal("Alloc(0) succeeded")
	}
	b, err := d.Alloc(600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(600); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("over capacity: %v", err)
	}
	if err := d.CopyIn(b, make([]byte, 601)); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("oversized copy: %v", err)
	}
	if err := d.Free(Buffer{Handle: b.Handle, Size: 5}); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("wrong size free: %v", err)
	}
	if _, err := NewCPU(CPUOptions{Capacity: -1}); err == nil {
		t.Fatal("negative capacity accepted")
	}
	d.Close()
	if _, err := d.Alloc(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("alloc after close: %v", err)
	}
	if _, err := d.MemInfo(); !errors.Is(err, ErrClosed) {
		t.Fatalf("meminfo after close: %v", err)
	}
}

func TestCPUConcurrent(t *testing.T) {
	d, _ := NewCPU(CPUOptions{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				b, err := d.Alloc(64 + i)
				if err != nil {
					t.Error(err)
					return
				}
				src := bytes.Repeat([]byte{byte(g)}, b.Size)
				if err := d.CopyIn(b, src); err != nil {
					t.Error(err)
				}
				dst := make([]byte, b.Size)
				if err := d.CopyOut(dst, b); err != nil || !bytes.Equal(dst, src) {
					t.Errorf("goroutine %d: mismatch %v", g, err)
				}
				if err := d.Free(b); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if mi, _ := d.MemInfo(); mi.Free != mi.Total {
		t.Fatalf("leaked: %+v", mi)
	}
}
