package gpu

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// slabPool carves device allocations out of large slabs so that the hot
// path (a Focus put) never calls cuMemAlloc: cuMemAlloc and cuMemFree take
// tens to hundreds of microseconds, synchronise the device and fragment its
// address space, while a KV block is allocated and freed on every put,
// demotion and promotion.
//
// Each slab keeps its free extents sorted by offset and coalesced, and an
// allocation takes the best-fitting extent over all slabs (the smallest
// that fits, lowest address on ties), which keeps large holes whole for
// large blocks. Sizes are rounded up to poolAlign. A request larger than a
// slab gets a dedicated allocation from the source, freed with it.
//
// When no extent fits, the pool asks the source for a new slab; if the
// device has no room for a whole slab it asks for one just big enough for
// the request, and only then reports ErrOutOfMemory. A slab that becomes
// empty is returned to the source unless it is the only empty one: one
// spare absorbs put/delete churn without a cuMemAlloc each time.
//
// The pool is pure bookkeeping over a slabSource, so it is tested without a
// GPU. Its methods are safe for concurrent use.
type slabPool struct {
	src       slabSource
	slabBytes uint64
	maxBytes  uint64 // 0: no cap

	// mu protects the fields below.
	mu       sync.Mutex
	slabs    []*slab
	live     map[uint64]poolAlloc // by handle
	lastID   uint64
	reserved uint64 // bytes held from the source: slabs and dedicated allocations
	inUse    uint64 // rounded bytes handed out
}

// slabSource allocates and frees device memory; it returns addresses.
type slabSource interface {
	allocSlab(n uint64) (uint64, error)
	freeSlab(addr uint64) error
}

// poolAlign is the granule of the pool. 4 KiB keeps DMA transfers page
// aligned on both sides and bounds the waste on KV blocks of megabytes.
const poolAlign = 4096

type slab struct {
	base, size uint64
	free       []extent // sorted by off, coalesced
	used       uint64
}

type extent struct{ off, size uint64 }

type poolAlloc struct {
	addr    uint64
	slab    *slab // nil: dedicated allocation
	size    int   // requested bytes, as in the Buffer
	rounded uint64
}

// PoolStats describes a CUDA device's slab pool.
type PoolStats struct {
	// Slabs is the number of slabs held, dedicated allocations excluded.
	Slabs int `json:"slabs"`
	// SlabBytes is the size of one slab.
	SlabBytes uint64 `json:"slab_bytes"`
	// ReservedBytes is device memory held from the driver: slabs and
	// dedicated allocations.
	ReservedBytes uint64 `json:"reserved_bytes"`
	// InUseBytes is what live buffers occupy, rounded to the pool's 4 KiB
	// granule.
	InUseBytes uint64 `json:"in_use_bytes"`
	// Buffers is the number of live buffers.
	Buffers int `json:"buffers"`
}

func newSlabPool(src slabSource, slabBytes, maxBytes uint64) *slabPool {
	return &slabPool{src: src, slabBytes: roundUp(slabBytes, poolAlign), maxBytes: maxBytes, live: make(map[uint64]poolAlloc)}
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }

// alloc returns a handle to n bytes (n > 0) and their address. Handles
// are never reused, so a stale Buffer is rejected even after its memory
// went to another allocation: it cannot write into someone else's block.
func (p *slabPool) alloc(n int) (handle, addr uint64, err error) {
	r := roundUp(uint64(n), poolAlign)
	p.mu.Lock()
	defer p.mu.Unlock()
	if r > p.slabBytes {
		if err := p.capCheck(r); err != nil {
			return 0, 0, err
		}
		addr, err := p.src.allocSlab(r)
		if err != nil {
			return 0, 0, err
		}
		p.reserved += r
		p.inUse += r
		p.lastID++
		p.live[p.lastID] = poolAlloc{addr: addr, size: n, rounded: r}
		return p.lastID, addr, nil
	}
	s, i := p.bestFit(r)
	if s == nil {
		if s, err = p.grow(r); err != nil {
			return 0, 0, err
		}
		i = 0
	}
	e := &s.free[i]
	addr = s.base + e.off
	e.off += r
	e.size -= r
	if e.size == 0 {
		s.free = slices.Delete(s.free, i, i+1)
	}
	s.used += r
	p.inUse += r
	p.lastID++
	p.live[p.lastID] = poolAlloc{addr: addr, slab: s, size: n, rounded: r}
	return p.lastID, addr, nil
}

func (p *slabPool) capCheck(n uint64) error {
	if p.maxBytes != 0 && p.reserved+n > p.maxBytes {
		return fmt.Errorf("gpu: cuda pool: %d more bytes would pass its cap of %d (%d reserved, %d in use): %w",
			n, p.maxBytes, p.reserved, p.inUse, ErrOutOfMemory)
	}
	return nil
}

// bestFit returns the slab and index of the smallest free extent of at
// least r bytes.
func (p *slabPool) bestFit(r uint64) (*slab, int) {
	var best *slab
	bi := -1
	for _, s := range p.slabs {
		for i, e := range s.free {
			if e.size >= r && (best == nil || e.size < best.free[bi].size) {
				best, bi = s, i
			}
		}
	}
	return best, bi
}

// grow adds a slab able to hold r bytes: a full slab, or, when the device
// has no room for one, a slab of exactly r bytes.
func (p *slabPool) grow(r uint64) (*slab, error) {
	size := p.slabBytes
	if p.maxBytes != 0 && p.reserved+size > p.maxBytes {
		size = r // under a cap, take only what this request needs
	}
	if err := p.capCheck(size); err != nil {
		return nil, err
	}
	addr, err := p.src.allocSlab(size)
	if err != nil && errors.Is(err, ErrOutOfMemory) {
		// Give empty slabs too small for r back, then ask for r alone.
		p.releaseEmpty()
		size = r
		addr, err = p.src.allocSlab(size)
	}
	if err != nil {
		return nil, err
	}
	s := &slab{base: addr, size: size, free: []extent{{0, size}}}
	p.slabs = append(p.slabs, s)
	p.reserved += size
	return s, nil
}

// lookup returns the address of a live allocation with this size.
func (p *slabPool) lookup(handle uint64, size int) (uint64, bool) {
	p.mu.Lock()
	a, ok := p.live[handle]
	p.mu.Unlock()
	return a.addr, ok && a.size == size
}

// free releases a live allocation with this size.
func (p *slabPool) free(handle uint64, size int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.live[handle]
	if !ok || a.size != size {
		return fmt.Errorf("gpu: cuda free handle %d (%d bytes): %w", handle, size, ErrInvalidBuffer)
	}
	delete(p.live, handle)
	p.inUse -= a.rounded
	if a.slab == nil {
		p.reserved -= a.rounded
		return p.src.freeSlab(a.addr)
	}
	s := a.slab
	s.used -= a.rounded
	s.insertFree(a.addr-s.base, a.rounded)
	if s.used == 0 && p.emptySlabs() > 1 {
		p.slabs = slices.DeleteFunc(p.slabs, func(x *slab) bool { return x == s })
		p.reserved -= s.size
		return p.src.freeSlab(s.base)
	}
	return nil
}

// releaseEmpty returns every empty slab to the source.
func (p *slabPool) releaseEmpty() {
	p.slabs = slices.DeleteFunc(p.slabs, func(s *slab) bool {
		if s.used != 0 {
			return false
		}
		p.reserved -= s.size
		_ = p.src.freeSlab(s.base) // nothing to do about it: the memory is gone either way
		return true
	})
}

func (p *slabPool) emptySlabs() int {
	n := 0
	for _, s := range p.slabs {
		if s.used == 0 {
			n++
		}
	}
	return n
}

// insertFree returns [off, off+n) to the free list, merging neighbours.
func (s *slab) insertFree(off, n uint64) {
	i, _ := slices.BinarySearchFunc(s.free, off, func(e extent, off uint64) int {
		switch {
		case e.off < off:
			return -1
		case e.off > off:
			return 1
		}
		return 0
	})
	s.free = slices.Insert(s.free, i, extent{off, n})
	if i+1 < len(s.free) && s.free[i].off+s.free[i].size == s.free[i+1].off {
		s.free[i].size += s.free[i+1].size
		s.free = slices.Delete(s.free, i+1, i+2)
	}
	if i > 0 && s.free[i-1].off+s.free[i-1].size == s.free[i].off {
		s.free[i-1].size += s.free[i].size
		s.free = slices.Delete(s.free, i, i+1)
	}
}

func (p *slabPool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{Slabs: len(p.slabs), SlabBytes: p.slabBytes, ReservedBytes: p.reserved, InUseBytes: p.inUse, Buffers: len(p.live)}
}

// release frees every slab and dedicated allocation, live or not. It
// returns the first error; the pool is empty afterwards either way.
func (p *slabPool) release() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, a := range p.live {
		if a.slab == nil {
			errs = append(errs, p.src.freeSlab(a.addr))
		}
	}
	for _, s := range p.slabs {
		errs = append(errs, p.src.freeSlab(s.base))
	}
	p.slabs, p.live, p.reserved, p.inUse = nil, make(map[uint64]poolAlloc), 0, 0
	return errors.Join(errs...)
}
