package gpu

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// memSource is a slab source over a pretend address space with a capacity.
type memSource struct {
	capacity, used uint64
	next           uint64
	live           map[uint64]uint64
	allocs, frees  int
}

func newMemSource(capacity uint64) *memSource {
	return &memSource{capacity: capacity, next: 1 << 40, live: map[uint64]uint64{}}
}

func (m *memSource) allocSlab(n uint64) (uint64, error) {
	m.allocs++
	if m.used+n > m.capacity {
		return 0, &CUDAError{Op: "cuMemAlloc_v2", Code: int(cuErrOutOfMemory)}
	}
	a := m.next
	m.next += n + 1<<20 // gaps: slabs are never adjacent
	m.used += n
	m.live[a] = n
	return a, nil
}

func (m *memSource) freeSlab(a uint64) error {
	n, ok := m.live[a]
	if !ok {
		return errors.New("double free of a slab")
	}
	m.frees++
	m.used -= n
	delete(m.live, a)
	return nil
}

// checkPool verifies the pool's invariants: each slab's free extents are
// sorted, coalesced and inside it; free plus used is its size; live
// allocations do not overlap each other or free space.
func checkPool(t *testing.T, p *slabPool) {
	t.Helper()
	type span struct{ a, b uint64 }
	var spans []span
	var inUse uint64
	for _, a := range p.live {
		spans = append(spans, span{a.addr, a.addr + a.rounded})
		inUse += a.rounded
	}
	var reserved uint64
	for _, s := range p.slabs {
		reserved += s.size
		var free uint64
		for i, e := range s.free {
			if e.size == 0 || e.off+e.size > s.size {
				t.Fatalf("bad extent %+v in slab of %d", e, s.size)
			}
			if i > 0 && s.free[i-1].off+s.free[i-1].size >= e.off {
				t.Fatalf("extents not sorted and coalesced: %+v", s.free)
			}
			free += e.size
			spans = append(spans, span{s.base + e.off, s.base + e.off + e.size})
		}
		if free+s.used != s.size {
			t.Fatalf("slab: free %d + used %d != size %d", free, s.used, s.size)
		}
	}
	for _, a := range p.live {
		if a.slab == nil {
			reserved += a.rounded
		}
	}
	if inUse != p.inUse || reserved != p.reserved {
		t.Fatalf("counters: inUse %d (have %d), reserved %d (have %d)", inUse, p.inUse, reserved, p.reserved)
	}
	slices.SortFunc(spans, func(x, y span) int {
		if x.a < y.a {
			return -1
		}
		if x.a > y.a {
			return 1
		}
		return 0
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].a < spans[i-1].b {
			t.Fatalf("overlap: %#x-%#x and %#x-%#x", spans[i-1].a, spans[i-1].b, spans[i].a, spans[i].b)
		}
	}
}

func TestSlabPoolCarvesAndCoalesces(t *testing.T) {
	src := newMemSource(1 << 30)
	p := newSlabPool(src, 1<<20, 0)
	ha, a, _ := p.alloc(100)      // rounds to 4 KiB
	hb, b, _ := p.alloc(4096)     // next to a
	hc, c, _ := p.alloc(8192 + 1) // 12 KiB
	if b != a+4096 || c != b+4096 {
		t.Fatalf("not carved in order: %#x %#x %#x", a, b, c)
	}
	if src.allocs != 1 {
		t.Fatalf("%d slabs for three small blocks", src.allocs)
	}
	checkPool(t, p)
	// Free the middle, then its neighbours: one extent again.
	if err := p.free(hb, 4096); err != nil {
		t.Fatal(err)
	}
	if err := p.free(ha, 100); err != nil {
		t.Fatal(err)
	}
	if err := p.free(hc, 8193); err != nil {
		t.Fatal(err)
	}
	checkPool(t, p)
	if s := p.slabs[0]; len(s.free) != 1 || s.free[0] != (extent{0, 1 << 20}) {
		t.Fatalf("free list after freeing everything: %+v", s.free)
	}
	// The only empty slab is kept as a spare.
	if len(p.slabs) != 1 || src.frees != 0 {
		t.Fatalf("spare slab released: %d slabs, %d frees", len(p.slabs), src.frees)
	}
	if err := p.free(ha, 100); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("double free: %v", err)
	}
	// The memory is reused, the handle is not: the stale handle stays
	// invalid though a new block of the same size sits at its address.
	hd, d, _ := p.alloc(100)
	if d != a || hd == ha {
		t.Fatalf("reuse: address %#x (was %#x), handle %d (was %d)", d, a, hd, ha)
	}
	if _, ok := p.lookup(ha, 100); ok {
		t.Fatal("stale handle accepted")
	}
	if err := p.free(ha, 100); !errors.Is(err, ErrInvalidBuffer) {
		t.Fatalf("free of a stale handle: %v", err)
	}
}

func TestSlabPoolBestFit(t *testing.T) {
	p := newSlabPool(newMemSource(1<<30), 1<<20, 0)
	var blocks, handles []uint64
	for range 8 {
		h, a, _ := p.alloc(64 << 10)
		blocks, handles = append(blocks, a), append(handles, h)
	}
	// Holes of 64 KiB (block 1) and 128 KiB (blocks 4 and 5).
	p.free(handles[1], 64<<10)
	p.free(handles[4], 64<<10)
	p.free(handles[5], 64<<10)
	checkPool(t, p)
	// A 60 KiB block takes the 64 KiB hole, not a piece of the larger one.
	_, x, _ := p.alloc(60 << 10)
	if x != blocks[1] {
		t.Fatalf("best fit took %#x, want the 64 KiB hole at %#x", x, blocks[1])
	}
	_, y, _ := p.alloc(128 << 10)
	if y != blocks[4] {
		t.Fatalf("128 KiB block at %#x, want the coalesced hole at %#x", y, blocks[4])
	}
	checkPool(t, p)
}

func TestSlabPoolDedicatedAndSpare(t *testing.T) {
	src := newMemSource(1 << 30)
	p := newSlabPool(src, 1<<20, 0)
	hbig, big, err := p.alloc(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.slabs) != 0 || src.live[big] != 3<<20 {
		t.Fatal("a block larger than a slab did not get its own allocation")
	}
	if err := p.free(hbig, 3<<20); err != nil || src.frees != 1 {
		t.Fatalf("dedicated free: %v, %d frees", err, src.frees)
	}
	// Two full slabs emptied: one stays as a spare, one goes back.
	var bs []uint64
	for range 2 {
		h, _, _ := p.alloc(1 << 20)
		bs = append(bs, h)
	}
	for _, a := range bs {
		p.free(a, 1<<20)
	}
	if len(p.slabs) != 1 || src.frees != 2 {
		t.Fatalf("after emptying two slabs: %d slabs held, %d frees", len(p.slabs), src.frees)
	}
	checkPool(t, p)
	if err := p.release(); err != nil || src.used != 0 {
		t.Fatalf("release: %v, %d bytes left", err, src.used)
	}
}

func TestSlabPoolOutOfMemory(t *testing.T) {
	src := newMemSource(3 << 20)
	p := newSlabPool(src, 2<<20, 0)
	if _, _, err := p.alloc(2 << 20); err != nil { // slab 1, full
		t.Fatal(err)
	}
	// No room for a 2 MiB slab: the pool takes the 512 KiB it needs.
	if _, _, err := p.alloc(512 << 10); err != nil {
		t.Fatalf("partial slab: %v", err)
	}
	if src.used != 2<<20+512<<10 {
		t.Fatalf("device used %d", src.used)
	}
	_, _, err := p.alloc(1 << 20)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("full device: %v", err)
	}
	checkPool(t, p)

	// Under a cap the pool never asks the device past it.
	src = newMemSource(1 << 30)
	p = newSlabPool(src, 1<<20, 1<<20+256<<10)
	p.alloc(1 << 20)
	if _, _, err := p.alloc(128 << 10); err != nil {
		t.Fatalf("under the cap: %v", err)
	}
	if _, _, err := p.alloc(256 << 10); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("past the cap: %v", err)
	}
	if src.used > 1<<20+256<<10 {
		t.Fatalf("cap passed: %d bytes taken", src.used)
	}
}

func TestSlabPoolRandom(t *testing.T) {
	src := newMemSource(64 << 20)
	p := newSlabPool(src, 4<<20, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	live := map[uint64]int{}
	for i := range 5000 {
		if len(live) > 0 && rng.IntN(2) == 0 {
			for a, n := range live {
				if err := p.free(a, n); err != nil {
					t.Fatal(err)
				}
				delete(live, a)
				break
			}
		} else {
			n := 1 + rng.IntN(1<<20)
			if rng.IntN(50) == 0 {
				n = 5 << 20 // dedicated
			}
			a, _, err := p.alloc(n)
			if errors.Is(err, ErrOutOfMemory) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			live[a] = n
		}
		if i%97 == 0 {
			checkPool(t, p)
		}
	}
	checkPool(t, p)
	for a, n := range live {
		p.free(a, n)
	}
	if p.inUse != 0 || len(p.slabs) > 1 {
		t.Fatalf("after freeing all: %d in use, %d slabs", p.inUse, len(p.slabs))
	}
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}
