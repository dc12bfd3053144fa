package gpu

import (
	"fmt"
	"sync"
)

// CPUOptions configure a CPU device. The zero value is ready to use (NewCPU
// applies EnsureDefaults and Validate).
type CPUOptions struct {
	// Capacity caps the bytes the device hands out. Zero means 1 GiB; the
	// CPU device does not ask the OS how much memory there is, tiers above
	// it set their own budgets.
	Capacity int64
}

const defaultCPUCapacity = 1 << 30

// EnsureDefaults fills every zero field with its documented default and
// returns o. NewCPU calls it; calling it twice changes nothing.
func (o *CPUOptions) EnsureDefaults() *CPUOptions {
	if o.Capacity == 0 {
		o.Capacity = defaultCPUCapacity
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *CPUOptions) Validate() error {
	if o.Capacity < 0 {
		return fmt.Errorf("gpu: cpu capacity %d is negative", o.Capacity)
	}
	return nil
}

// CPU is a Device backed by Go memory. Its buffers are byte slices kept in a
// map by handle; copies are memmoves. Create it with NewCPU.
type CPU struct {
	capacity int64

	// mu protects the fields below.
	mu     sync.Mutex
	next   uint64
	used   int64
	bufs   map[uint64][]byte
	closed bool
}

var _ Device = (*CPU)(nil)

// NewCPU returns a CPU device. It fails only on invalid options.
func NewCPU(opts CPUOptions) (*CPU, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &CPU{capacity: opts.Capacity, bufs: make(map[uint64][]byte)}, nil
}

// Name returns "cpu".
func (c *CPU) Name() string { return "cpu" }

// Kind returns KindCPU.
func (c *CPU) Kind() Kind { return KindCPU }

// Alloc reserves n bytes of host memory.
func (c *CPU) Alloc(n int) (Buffer, error) {
	if n <= 0 {
		return Buffer{}, fmt.Errorf("gpu: cpu alloc %d bytes: size must be positive", n)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return Buffer{}, ErrClosed
	}
	if c.used+int64(n) > c.capacity {
		used := c.used
		c.mu.Unlock()
		return Buffer{}, fmt.Errorf("gpu: cpu alloc %d bytes (%d of %d used): %w", n, used, c.capacity, ErrOutOfMemory)
	}
	c.used += int64(n)
	c.next++
	h := c.next
	c.mu.Unlock()
	// Allocate outside the lock: zeroing a large slice takes a while.
	mem := make([]byte, n)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Buffer{}, ErrClosed
	}
	c.bufs[h] = mem
	return Buffer{Handle: h, Size: n}, nil
}

// Free releases b.
func (c *CPU) Free(b Buffer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	mem, ok := c.bufs[b.Handle]
	if !ok || len(mem) != b.Size {
		return fmt.Errorf("gpu: cpu free handle %d: %w", b.Handle, ErrInvalidBuffer)
	}
	delete(c.bufs, b.Handle)
	c.used -= int64(len(mem))
	return nil
}

func (c *CPU) lookup(b Buffer, n int) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	mem, ok := c.bufs[b.Handle]
	if !ok || len(mem) != b.Size {
		return nil, fmt.Errorf("gpu: cpu handle %d: %w", b.Handle, ErrInvalidBuffer)
	}
	if n > len(mem) {
		return nil, fmt.Errorf("gpu: cpu copy of %d bytes into a %d-byte buffer: %w", n, len(mem), ErrInvalidBuffer)
	}
	return mem, nil
}

// CopyIn copies src into the start of dst. Copies into one buffer from
// several goroutines at once race like writes to one slice would; tiers
// never do that.
func (c *CPU) CopyIn(dst Buffer, src []byte) error {
	mem, err := c.lookup(dst, len(src))
	if err != nil {
		return err
	}
	copy(mem, src)
	return nil
}

// CopyOut copies the first len(dst) bytes of src into dst.
func (c *CPU) CopyOut(dst []byte, src Buffer) error {
	mem, err := c.lookup(src, len(dst))
	if err != nil {
		return err
	}
	copy(dst, mem)
	return nil
}

// MemInfo reports the capacity and what is not allocated.
func (c *CPU) MemInfo() (MemInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return MemInfo{}, ErrClosed
	}
	return MemInfo{Total: uint64(c.capacity), Free: uint64(c.capacity - c.used)}, nil
}

// Close frees every buffer. It is idempotent.
func (c *CPU) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.bufs = nil
	c.used = 0
	return nil
}
