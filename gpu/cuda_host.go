package gpu

import (
	"fmt"
	"unsafe"
)

// AllocHost returns n bytes of pinned (page-locked) host memory from
// cuMemHostAlloc. Copies from or to it skip the staging buffers: one DMA
// each. The memory is not Go memory: it lives until FreeHost or Close, and
// using the slice afterwards is a use-after-free. Pin sparingly: pinned
// pages are taken from the OS for good.
func (c *CUDA) AllocHost(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("gpu: cuda host alloc %d bytes: size must be positive", n)
	}
	var p unsafe.Pointer
	err := c.do(func() error {
		return c.drv.check("cuMemHostAlloc", c.drv.memHostAlloc(&p, uint64(n), cuMemHostAllocDefault))
	})
	if err != nil {
		return nil, fmt.Errorf("gpu: cuda host alloc %d bytes: %w", n, err)
	}
	c.hostMu.Lock()
	c.host = append(c.host, hostRange{p: p, size: n})
	c.hostMu.Unlock()
	return unsafe.Slice((*byte)(p), n), nil
}

// FreeHost releases memory from AllocHost. b must be the slice AllocHost
// returned (or start where it starts).
func (c *CUDA) FreeHost(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("gpu: cuda free host: empty slice: %w", ErrInvalidBuffer)
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	c.hostMu.Lock()
	i := -1
	for j, r := range c.host {
		if r.p == p {
			i = j
			break
		}
	}
	if i < 0 {
		c.hostMu.Unlock()
		return fmt.Errorf("gpu: cuda free host %p: %w", p, ErrInvalidBuffer)
	}
	c.host = append(c.host[:i], c.host[i+1:]...)
	c.hostMu.Unlock()
	return c.do(func() error { return c.drv.check("cuMemFreeHost", c.drv.memFreeHost(p)) })
}

// isPinned reports whether b lies inside one AllocHost allocation.
func (c *CUDA) isPinned(b []byte) bool {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	end := start + uintptr(len(b))
	c.hostMu.Lock()
	defer c.hostMu.Unlock()
	for _, r := range c.host {
		rs := uintptr(r.p)
		if start >= rs && end <= rs+uintptr(r.size) {
			return true
		}
	}
	return false
}
