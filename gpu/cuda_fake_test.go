//go:build linux

package gpu

import (
	"sync"
	"syscall"
	"unsafe"
)

// fakeGPU implements the driver entry points in Go so that the CUDA device
// (slab pool, lanes, staged and pinned copies, context handling, error
// classification) is tested on hosts without a GPU. Copies happen at
// enqueue time, which the staging pipeline must tolerate like any other
// completion order.
//
// It checks what a real driver would punish quietly: every call that needs
// a context must come from an OS thread on which the device's context was
// made current (the test would otherwise pass here and fail on a GPU).
type fakeGPU struct {
	capacity uint64 // device memory

	mu        sync.Mutex
	next      uint64
	used      uint64
	dev       map[uint64][]byte // device allocations by address
	host      map[unsafe.Pointer][]byte
	current   map[int]uintptr // thread id -> current context
	retained  int
	streams   map[uintptr]bool
	events    map[uintptr]int64 // event -> tick recorded (-1: never)
	tick      int64
	allocs    int // cuMemAlloc calls
	noCtx     []string
	fail      map[string]cuResult // op -> result for its next call
	handleSeq uintptr
}

const fakeCtx uintptr = 0xC7

func newFakeGPU(capacity uint64) (*fakeGPU, *driver) {
	f := &fakeGPU{
		capacity: capacity, next: 0x7f00_0000_0000,
		dev: map[uint64][]byte{}, host: map[unsafe.Pointer][]byte{}, current: map[int]uintptr{},
		streams: map[uintptr]bool{}, events: map[uintptr]int64{}, fail: map[string]cuResult{}, handleSeq: 0x1000,
	}
	d := &driver{lib: "fake"}
	d.init = func(uint32) cuResult { return f.result("cuInit") }
	d.driverGetVersion = func(v *int32) cuResult { *v = 13000; return cuSuccess }
	d.deviceGetCount = func(n *int32) cuResult { *n = 1; return f.result("cuDeviceGetCount") }
	d.deviceGet = func(dev *int32, ord int32) cuResult {
		if ord != 0 {
			return cuErrInvalidDevice
		}
		*dev = 0
		return cuSuccess
	}
	d.deviceGetName = func(name *byte, n int32, _ int32) cuResult {
		s := unsafe.Slice(name, n)
		copy(s, "Fake GPU\x00")
		return cuSuccess
	}
	d.deviceTotalMem = func(b *uint64, _ int32) cuResult { *b = f.capacity; return cuSuccess }
	d.deviceGetAttribute = func(v *int32, a int32, _ int32) cuResult {
		*v = map[int32]int32{cuAttrCCMajor: 9, cuAttrCCMinor: 0, cuAttrPCIDomainID: 0, cuAttrPCIBusID: 0x65, cuAttrPCIDeviceID: 0}[a]
		return cuSuccess
	}
	d.primaryCtxRetain = func(c *uintptr, _ int32) cuResult {
		if r := f.result("cuDevicePrimaryCtxRetain"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		f.retained++
		f.mu.Unlock()
		*c = fakeCtx
		return cuSuccess
	}
	d.primaryCtxRelease = func(int32) cuResult {
		f.mu.Lock()
		f.retained--
		f.mu.Unlock()
		return cuSuccess
	}
	d.ctxSetCurrent = func(c uintptr) cuResult {
		f.mu.Lock()
		f.current[syscall.Gettid()] = c
		f.mu.Unlock()
		return cuSuccess
	}
	d.memAlloc = func(p *uint64, n uint64) cuResult {
		if r := f.need("cuMemAlloc_v2"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.allocs++
		if f.used+n > f.capacity {
			return cuErrOutOfMemory
		}
		f.used += n
		*p = f.next
		f.dev[f.next] = make([]byte, n)
		f.next += roundUp(n, 1<<21) // like the driver: 2 MiB granules, never reused
		return cuSuccess
	}
	d.memFree = func(p uint64) cuResult {
		if r := f.need("cuMemFree_v2"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		m, ok := f.dev[p]
		if !ok {
			return cuErrInvalidValue
		}
		f.used -= uint64(len(m))
		delete(f.dev, p)
		return cuSuccess
	}
	d.memHostAlloc = func(p *unsafe.Pointer, n uint64, _ uint32) cuResult {
		if r := f.need("cuMemHostAlloc"); r != cuSuccess {
			return r
		}
		m := make([]byte, n)
		f.mu.Lock()
		*p = unsafe.Pointer(&m[0])
		f.host[*p] = m
		f.mu.Unlock()
		return cuSuccess
	}
	d.memFreeHost = func(p unsafe.Pointer) cuResult {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.host[p]; !ok {
			return cuErrInvalidValue
		}
		delete(f.host, p)
		return cuSuccess
	}
	d.memcpyHtoDAsync = func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) cuResult {
		if r := f.needStream("cuMemcpyHtoDAsync_v2", s); r != cuSuccess {
			return r
		}
		return f.copyIn(dst, unsafe.Slice((*byte)(src), n))
	}
	d.memcpyHtoD = func(dst uint64, src unsafe.Pointer, n uint64) cuResult {
		if r := f.need("cuMemcpyHtoD_v2"); r != cuSuccess {
			return r
		}
		return f.copyIn(dst, unsafe.Slice((*byte)(src), n))
	}
	d.memcpyDtoHAsync = func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) cuResult {
		if r := f.needStream("cuMemcpyDtoHAsync_v2", s); r != cuSuccess {
			return r
		}
		return f.copyOut(unsafe.Slice((*byte)(dst), n), src)
	}
	d.memcpyDtoH = func(dst unsafe.Pointer, src uint64, n uint64) cuResult {
		if r := f.need("cuMemcpyDtoH_v2"); r != cuSuccess {
			return r
		}
		return f.copyOut(unsafe.Slice((*byte)(dst), n), src)
	}
	d.streamCreate = func(s *uintptr, _ uint32) cuResult {
		if r := f.need("cuStreamCreate"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.handleSeq++
		*s = f.handleSeq
		f.streams[*s] = true
		return cuSuccess
	}
	d.streamDestroy = func(s uintptr) cuResult {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.streams, s)
		return cuSuccess
	}
	d.streamSynchronize = func(s uintptr) cuResult { return f.needStream("cuStreamSynchronize", s) }
	d.eventCreate = func(e *uintptr, _ uint32) cuResult {
		if r := f.need("cuEventCreate"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.handleSeq++
		*e = f.handleSeq
		f.events[*e] = -1
		return cuSuccess
	}
	d.eventDestroy = func(e uintptr) cuResult {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.events, e)
		return cuSuccess
	}
	d.eventRecord = func(e, s uintptr) cuResult {
		if r := f.need("cuEventRecord"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.events[e]; !ok || !f.streams[s] {
			return cuErrInvalidHandle
		}
		f.tick++
		f.events[e] = f.tick
		return cuSuccess
	}
	d.eventSynchronize = func(e uintptr) cuResult {
		if r := f.need("cuEventSynchronize"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if t, ok := f.events[e]; !ok || t < 0 {
			return cuErrInvalidHandle
		}
		return cuSuccess
	}
	d.eventElapsedTime = func(ms *float32, a, b uintptr) cuResult {
		if r := f.need("cuEventElapsedTime"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		ta, oka := f.events[a]
		tb, okb := f.events[b]
		if !oka || !okb || ta < 0 || tb < 0 {
			return cuErrInvalidHandle
		}
		*ms = float32(tb-ta) * 0.25 // a quarter millisecond per operation in between
		return cuSuccess
	}
	d.memGetInfo = func(free, total *uint64) cuResult {
		if r := f.need("cuMemGetInfo_v2"); r != cuSuccess {
			return r
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		*free, *total = f.capacity-f.used, f.capacity
		return cuSuccess
	}
	d.getErrorString = func(r cuResult, s *unsafe.Pointer) cuResult {
		msg, ok := map[cuResult]string{cuErrOutOfMemory: "out of memory\x00", cuErrNoDevice: "no CUDA-capable device is detected\x00"}[r]
		if !ok {
			return cuErrInvalidValue
		}
		*s = unsafe.Pointer(unsafe.StringData(msg))
		return cuSuccess
	}
	return f, d
}

// result returns an injected failure for op, once.
func (f *fakeGPU) result(op string) cuResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.fail[op]; ok {
		delete(f.fail, op)
		return r
	}
	return cuSuccess
}

// need checks that the calling thread has the context current, then
// returns any injected failure.
func (f *fakeGPU) need(op string) cuResult {
	f.mu.Lock()
	if f.current[syscall.Gettid()] != fakeCtx {
		f.noCtx = append(f.noCtx, op)
		f.mu.Unlock()
		return cuErrInvalidContext
	}
	f.mu.Unlock()
	return f.result(op)
}

func (f *fakeGPU) failNext(op string, r cuResult) {
	f.mu.Lock()
	f.fail[op] = r
	f.mu.Unlock()
}

// needStream is need for a call on stream s, which must exist.
func (f *fakeGPU) needStream(op string, s uintptr) cuResult {
	if r := f.need(op); r != cuSuccess {
		return r
	}
	if !f.isStream(s) {
		return cuErrInvalidHandle
	}
	return cuSuccess
}

func (f *fakeGPU) isStream(s uintptr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.streams[s]
}

// span returns the device memory [addr, addr+n) or false.
func (f *fakeGPU) span(addr, n uint64) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for base, m := range f.dev {
		if addr >= base && addr+n <= base+uint64(len(m)) {
			return m[addr-base : addr-base+n], true
		}
	}
	return nil, false
}

func (f *fakeGPU) copyIn(dst uint64, src []byte) cuResult {
	m, ok := f.span(dst, uint64(len(src)))
	if !ok {
		return cuErrInvalidValue
	}
	copy(m, src)
	f.bump()
	return cuSuccess
}

func (f *fakeGPU) copyOut(dst []byte, src uint64) cuResult {
	m, ok := f.span(src, uint64(len(dst)))
	if !ok {
		return cuErrInvalidValue
	}
	copy(dst, m)
	f.bump()
	return cuSuccess
}

func (f *fakeGPU) bump() {
	f.mu.Lock()
	f.tick++
	f.mu.Unlock()
}

// leaks reports what the fake still holds.
func (f *fakeGPU) leaks() (devBytes uint64, host, streams, events, retained int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.used, len(f.host), len(f.streams), len(f.events), f.retained
}
