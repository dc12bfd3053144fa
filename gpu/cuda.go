package gpu

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// CUDAOptions configure a CUDA device. The zero value opens the first
// visible GPU with the defaults below.
type CUDAOptions struct {
	// Ordinal selects the GPU among those the driver makes visible. The
	// driver applies CUDA_VISIBLE_DEVICES at cuInit and renumbers the GPUs
	// it lists 0, 1, … in the order listed, so with
	// CUDA_VISIBLE_DEVICES=2,0 ordinal 0 is physical GPU 2. Zero means the
	// first visible GPU. An ordinal past the visible ones is ErrNoCUDA.
	Ordinal int
	// Library is the driver library to load. Empty means
	// DefaultCUDALibrary (libcuda.so.1).
	Library string
	// SlabBytes is the size of the device memory slabs blocks are carved
	// from; a block larger than a slab gets an allocation of its own. Zero
	// means 256 MiB.
	SlabBytes int64
	// MaxBytes caps the device memory the device takes from the driver
	// (slabs and large blocks together); an allocation past it is
	// ErrOutOfMemory. Zero means no cap but the GPU's memory. Budgets are
	// the tiers' business; this cap protects an inference server sharing
	// the GPU from a misconfigured budget.
	MaxBytes int64
	// Streams is the number of copy lanes: a CUDA stream with its own
	// pinned staging buffers. It bounds concurrent copies; more wait for a
	// free lane. Zero means 4.
	Streams int
	// StagingBytes is the size of each of a lane's two pinned staging
	// buffers, used to copy pageable Go memory. Copies are cut into chunks
	// of this size and double-buffered: the CPU fills one buffer while the
	// DMA engine drains the other. Smaller chunks overlap more of a copy;
	// each costs a few driver calls (microseconds). Zero means 4 MiB
	// (8 MiB pinned per lane).
	StagingBytes int
}

const (
	defaultSlabBytes    = 256 << 20
	defaultStreams      = 4
	defaultStagingBytes = 4 << 20
)

func (o *CUDAOptions) validate() error {
	if o.Ordinal < 0 || o.SlabBytes < 0 || o.MaxBytes < 0 || o.Streams < 0 || o.StagingBytes < 0 {
		return fmt.Errorf("gpu: cuda options: negative value in %+v", *o)
	}
	if o.SlabBytes == 0 {
		o.SlabBytes = defaultSlabBytes
	}
	if o.Streams == 0 {
		o.Streams = defaultStreams
	}
	if o.StagingBytes == 0 {
		o.StagingBytes = defaultStagingBytes
	}
	if o.StagingBytes < poolAlign {
		return fmt.Errorf("gpu: cuda options: StagingBytes %d below %d", o.StagingBytes, poolAlign)
	}
	return nil
}

// CUDA is a Device in the memory of one NVIDIA GPU, reached through the
// driver API loaded at run time (see DESIGN.md, GPU). Create it with
// NewCUDA or Open and release it with Close.
//
// Device memory comes from a slab pool (no cuMemAlloc per block). Copies
// run on one of a few lanes, each a non-blocking stream with two pinned
// staging buffers and events: a copy from or to pageable Go memory is
// pipelined through the staging buffers; a copy from or to memory returned
// by AllocHost (already pinned) is one asynchronous DMA. Every copy waits
// for its stream before returning, so CopyIn and CopyOut are synchronous as
// the Device contract says.
//
// The driver keeps the current context per OS thread, and a goroutine may
// change threads between two calls. Every method therefore locks its
// goroutine to its thread and makes the device's primary context current
// (cuCtxSetCurrent, a thread-local store) for the duration of the call.
// That costs less than handing each call to one goroutine owning the
// context, and lets copies on different lanes run in parallel.
type CUDA struct {
	drv          *driver
	dev          int32
	ctx          uintptr
	info         DeviceInfo
	maxBytes     uint64
	stagingBytes int
	pool         *slabPool
	lanes        chan *lane
	allLanes     []*lane

	// life is held for reading by every call and for writing by Close, so
	// Close waits for copies in flight and nothing runs after it.
	life   sync.RWMutex
	closed bool // under life

	// hostMu protects host.
	hostMu sync.Mutex
	host   []hostRange // pinned allocations from AllocHost
}

var _ Device = (*CUDA)(nil)

// lane is a stream with its pinned staging buffers and events. A lane is
// used by one copy at a time.
type lane struct {
	stream      uintptr
	stage       [2][]byte
	stagePtr    [2]unsafe.Pointer
	ev          [2]uintptr // staging buffer k may be reused once ev[k] completed
	start, stop uintptr    // timing of CopyInTimed and CopyOutTimed
}

type hostRange struct {
	p    unsafe.Pointer
	size int
}

// NewCUDA opens the GPU selected by opts. When the driver library is
// missing, cuInit fails or no GPU is visible, the error matches ErrNoCUDA
// (and ErrUnavailable) and says why; callers then use the CPU device.
func NewCUDA(opts CUDAOptions) (*CUDA, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	drv, err := openDriver(opts.Library)
	if err != nil {
		return nil, err
	}
	return newCUDA(drv, opts)
}

func newCUDA(drv *driver, opts CUDAOptions) (*CUDA, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var count int32
	if err := drv.check("cuDeviceGetCount", drv.deviceGetCount(&count)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCUDA, err)
	}
	if opts.Ordinal >= int(count) {
		return nil, fmt.Errorf("%w: device ordinal %d asked, %d visible (CUDA_VISIBLE_DEVICES=%s)",
			ErrNoCUDA, opts.Ordinal, count, visibleDevicesEnv())
	}
	var dev int32
	if err := drv.check("cuDeviceGet", drv.deviceGet(&dev, int32(opts.Ordinal))); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCUDA, err)
	}
	info, err := queryDevice(drv, dev, opts.Ordinal)
	if err != nil {
		return nil, err
	}
	c := &CUDA{drv: drv, dev: dev, info: info, maxBytes: uint64(opts.MaxBytes), stagingBytes: opts.StagingBytes}
	if err := drv.check("cuDevicePrimaryCtxRetain", drv.primaryCtxRetain(&c.ctx, dev)); err != nil {
		if r := cuResult(err.(*CUDAError).Code); r.unavailable() {
			return nil, fmt.Errorf("%w: %w", ErrNoCUDA, err)
		}
		return nil, fmt.Errorf("gpu: cuda: %w", err)
	}
	if err := drv.check("cuCtxSetCurrent", drv.ctxSetCurrent(c.ctx)); err != nil {
		drv.primaryCtxRelease(dev)
		return nil, fmt.Errorf("gpu: cuda: %w", err)
	}
	c.pool = newSlabPool(cudaSlabs{drv}, uint64(opts.SlabBytes), c.maxBytes)
	c.lanes = make(chan *lane, opts.Streams)
	for range opts.Streams {
		l, err := c.newLane()
		if err != nil {
			c.destroyLanes()
			drv.primaryCtxRelease(dev)
			return nil, fmt.Errorf("gpu: cuda: create copy lane: %w", err)
		}
		c.allLanes = append(c.allLanes, l)
		c.lanes <- l
	}
	return c, nil
}

func visibleDevicesEnv() string {
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		return fmt.Sprintf("%q", v)
	}
	return "unset"
}

// newLane creates a stream, two pinned staging buffers and four events.
// The context is current. On error it frees what it created.
func (c *CUDA) newLane() (_ *lane, err error) {
	d := c.drv
	l := &lane{}
	defer func() {
		if err != nil {
			c.destroyLane(l)
		}
	}()
	if err := d.check("cuStreamCreate", d.streamCreate(&l.stream, cuStreamNonBlocking)); err != nil {
		return nil, err
	}
	for k := range 2 {
		if err := d.check("cuMemHostAlloc", d.memHostAlloc(&l.stagePtr[k], uint64(c.stagingBytes), cuMemHostAllocDefault)); err != nil {
			return nil, err
		}
		l.stage[k] = unsafe.Slice((*byte)(l.stagePtr[k]), c.stagingBytes)
	}
	for _, e := range []*uintptr{&l.ev[0], &l.ev[1], &l.start, &l.stop} {
		if err := d.check("cuEventCreate", d.eventCreate(e, cuEventDefault)); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// destroyLane frees whatever of l exists, after its stream drained.
func (c *CUDA) destroyLane(l *lane) {
	d := c.drv
	if l.stream != 0 {
		d.streamSynchronize(l.stream)
	}
	for _, e := range []uintptr{l.ev[0], l.ev[1], l.start, l.stop} {
		if e != 0 {
			d.eventDestroy(e)
		}
	}
	for k := range 2 {
		if l.stagePtr[k] != nil {
			d.memFreeHost(l.stagePtr[k])
			l.stagePtr[k], l.stage[k] = nil, nil
		}
	}
	if l.stream != 0 {
		d.streamDestroy(l.stream)
		l.stream = 0
	}
}

func (c *CUDA) destroyLanes() {
	for _, l := range c.allLanes {
		c.destroyLane(l)
	}
	c.allLanes = nil
}

// cudaSlabs is the slab pool's source: cuMemAlloc_v2 and cuMemFree_v2. Its
// callers hold the context current.
type cudaSlabs struct{ d *driver }

func (s cudaSlabs) allocSlab(n uint64) (uint64, error) {
	var p uint64
	if err := s.d.check("cuMemAlloc_v2", s.d.memAlloc(&p, n)); err != nil {
		return 0, fmt.Errorf("gpu: cuda alloc %d bytes: %w", n, err)
	}
	return p, nil
}

func (s cudaSlabs) freeSlab(p uint64) error {
	if err := s.d.check("cuMemFree_v2", s.d.memFree(p)); err != nil {
		return fmt.Errorf("gpu: cuda free %#x: %w", p, err)
	}
	return nil
}

// do runs fn with the device open, the goroutine locked to its thread and
// the primary context current on it.
func (c *CUDA) do(fn func() error) error {
	c.life.RLock()
	defer c.life.RUnlock()
	if c.closed {
		return ErrClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.drv.check("cuCtxSetCurrent", c.drv.ctxSetCurrent(c.ctx)); err != nil {
		return fmt.Errorf("gpu: cuda: %w", err)
	}
	return fn()
}

// Name returns the GPU's name, e.g. "NVIDIA H100 80GB HBM3".
func (c *CUDA) Name() string { return c.info.Name }

// Kind returns KindCUDA.
func (c *CUDA) Kind() Kind { return KindCUDA }

// Info describes the GPU.
func (c *CUDA) Info() DeviceInfo { return c.info }

// PoolStats describes the slab pool.
func (c *CUDA) PoolStats() PoolStats { return c.pool.stats() }

// Alloc reserves n bytes of device memory from the slab pool. It returns
// an error matching ErrOutOfMemory when neither the pool nor the GPU has
// room (or MaxBytes would be passed).
func (c *CUDA) Alloc(n int) (Buffer, error) {
	if n <= 0 {
		return Buffer{}, fmt.Errorf("gpu: cuda alloc %d bytes: size must be positive", n)
	}
	var b Buffer
	err := c.do(func() error {
		h, _, err := c.pool.alloc(n)
		b = Buffer{Handle: h, Size: n}
		return err
	})
	if err != nil {
		return Buffer{}, err
	}
	return b, nil
}

// Free returns b to the slab pool.
func (c *CUDA) Free(b Buffer) error {
	return c.do(func() error { return c.pool.free(b.Handle, b.Size) })
}

// check validates a copy of n bytes against b and returns b's address.
func (c *CUDA) check(b Buffer, n int) (uint64, error) {
	addr, ok := c.pool.lookup(b.Handle, b.Size)
	if !ok {
		return 0, fmt.Errorf("gpu: cuda buffer handle %d: %w", b.Handle, ErrInvalidBuffer)
	}
	if n > b.Size {
		return 0, fmt.Errorf("gpu: cuda copy of %d bytes into a %d-byte buffer: %w", n, b.Size, ErrInvalidBuffer)
	}
	return addr, nil
}

// CopyIn copies src into the start of dst and waits for the copy. Two
// copies into one buffer at once race; tiers never do that, nor free a
// buffer during a copy.
func (c *CUDA) CopyIn(dst Buffer, src []byte) error {
	_, err := c.copy(dst, src, true, false)
	return err
}

// CopyOut copies the first len(dst) bytes of src into dst and waits for
// the copy.
func (c *CUDA) CopyOut(dst []byte, src Buffer) error {
	_, err := c.copy(src, dst, false, false)
	return err
}

// CopyInTimed is CopyIn that also returns the time the GPU spent on the
// transfer, measured with CUDA events recorded on the copy's stream around
// it (host-side staging overlapped with the DMA included).
func (c *CUDA) CopyInTimed(dst Buffer, src []byte) (time.Duration, error) {
	return c.copy(dst, src, true, true)
}

// CopyOutTimed is CopyOut that also returns the GPU-side time.
func (c *CUDA) CopyOutTimed(dst []byte, src Buffer) (time.Duration, error) {
	return c.copy(src, dst, false, true)
}

func (c *CUDA) copy(b Buffer, host []byte, in, timed bool) (time.Duration, error) {
	l := <-c.lanes
	defer func() { c.lanes <- l }()
	var elapsed time.Duration
	err := c.do(func() error {
		addr, err := c.check(b, len(host))
		if err != nil || len(host) == 0 {
			return err
		}
		d := c.drv
		if timed {
			if err := d.check("cuEventRecord", d.eventRecord(l.start, l.stream)); err != nil {
				return err
			}
		}
		switch pinned := c.isPinned(host); {
		case in && pinned:
			err = d.check("cuMemcpyHtoDAsync_v2", d.memcpyHtoDAsync(addr, unsafe.Pointer(unsafe.SliceData(host)), uint64(len(host)), l.stream))
		case in:
			err = c.stagedIn(l, addr, host)
		case pinned:
			err = d.check("cuMemcpyDtoHAsync_v2", d.memcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(host)), addr, uint64(len(host)), l.stream))
		default:
			err = c.stagedOut(l, host, addr)
		}
		if err == nil && timed {
			err = d.check("cuEventRecord", d.eventRecord(l.stop, l.stream))
		}
		// Drain the stream even after an error: the lane's staging buffers
		// must not be reused while a DMA may still read them.
		if serr := d.check("cuStreamSynchronize", d.streamSynchronize(l.stream)); err == nil {
			err = serr
		}
		if err == nil && timed {
			var ms float32
			if err = d.check("cuEventElapsedTime", d.eventElapsedTime(&ms, l.start, l.stop)); err == nil {
				elapsed = time.Duration(float64(ms) * float64(time.Millisecond))
			}
		}
		return err
	})
	if err != nil {
		dir := "out of"
		if in {
			dir = "into"
		}
		if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrInvalidBuffer) {
			err = fmt.Errorf("gpu: cuda copy of %d bytes %s buffer %d: %w", len(host), dir, b.Handle, err)
		}
		return 0, err
	}
	return elapsed, nil
}

// stagedIn copies pageable src to dst through the lane's two staging
// buffers: chunk i is copied into buffer i%2 once the DMA that last read
// that buffer (chunk i-2) completed, so filling one overlaps draining the
// other. The caller synchronises the stream.
func (c *CUDA) stagedIn(l *lane, dst uint64, src []byte) error {
	d := c.drv
	chunk := len(l.stage[0])
	var pending [2]bool
	for i, off := 0, 0; off < len(src); i, off = i+1, off+chunk {
		k := i & 1
		n := min(chunk, len(src)-off)
		if pending[k] {
			if err := d.check("cuEventSynchronize", d.eventSynchronize(l.ev[k])); err != nil {
				return err
			}
		}
		parallelCopy(l.stage[k][:n], src[off:off+n])
		if err := d.check("cuMemcpyHtoDAsync_v2", d.memcpyHtoDAsync(dst+uint64(off), l.stagePtr[k], uint64(n), l.stream)); err != nil {
			return err
		}
		if err := d.check("cuEventRecord", d.eventRecord(l.ev[k], l.stream)); err != nil {
			return err
		}
		pending[k] = true
	}
	return nil
}

// stagedOut copies src to pageable dst through the staging buffers: the
// DMA of chunk i+1 is issued before the CPU copies chunk i out, so the two
// overlap. Chunk i+1 reuses the buffer of chunk i-1, already copied out.
func (c *CUDA) stagedOut(l *lane, dst []byte, src uint64) error {
	d := c.drv
	chunk := len(l.stage[0])
	chunks := (len(dst) + chunk - 1) / chunk
	issue := func(i int) error {
		k, off := i&1, i*chunk
		n := min(chunk, len(dst)-off)
		if err := d.check("cuMemcpyDtoHAsync_v2", d.memcpyDtoHAsync(l.stagePtr[k], src+uint64(off), uint64(n), l.stream)); err != nil {
			return err
		}
		return d.check("cuEventRecord", d.eventRecord(l.ev[k], l.stream))
	}
	if err := issue(0); err != nil {
		return err
	}
	for i := range chunks {
		if i+1 < chunks {
			if err := issue(i + 1); err != nil {
				return err
			}
		}
		k, off := i&1, i*chunk
		n := min(chunk, len(dst)-off)
		if err := d.check("cuEventSynchronize", d.eventSynchronize(l.ev[k])); err != nil {
			return err
		}
		parallelCopy(dst[off:off+n], l.stage[k][:n])
	}
	return nil
}

// parallelCopy is copy(dst, src) split over up to four goroutines for
// chunks of a megabyte or more. One core's memmove (10 to 20 GB/s) is
// slower than a PCIe Gen5 link (about 55 GB/s pinned), so a single-threaded
// staging copy would cap pageable transfers well below the link; a few
// cores keep the DMA engine fed. BenchmarkParallelCopy measures it.
func parallelCopy(dst, src []byte) {
	const part = 512 << 10
	n := min(len(dst), len(src))
	k := min(runtime.GOMAXPROCS(0), 4, n/part)
	if k < 2 {
		copy(dst, src)
		return
	}
	step := (n + k - 1) / k
	var wg sync.WaitGroup
	for off := step; off < n; off += step {
		end := min(off+step, n)
		wg.Go(func() { copy(dst[off:end], src[off:end]) })
	}
	copy(dst[:step], src[:step])
	wg.Wait()
}

// PlainCopyIn copies src into dst with one synchronous cuMemcpyHtoD_v2,
// no staging and no stream: the baseline the benchmarks compare CopyIn
// with.
func (c *CUDA) PlainCopyIn(dst Buffer, src []byte) error {
	return c.do(func() error {
		addr, err := c.check(dst, len(src))
		if err != nil || len(src) == 0 {
			return err
		}
		return c.drv.check("cuMemcpyHtoD_v2", c.drv.memcpyHtoD(addr, unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src))))
	})
}

// PlainCopyOut copies the first len(dst) bytes of src with one synchronous
// cuMemcpyDtoH_v2: the device-to-host baseline.
func (c *CUDA) PlainCopyOut(dst []byte, src Buffer) error {
	return c.do(func() error {
		addr, err := c.check(src, len(dst))
		if err != nil || len(dst) == 0 {
			return err
		}
		return c.drv.check("cuMemcpyDtoH_v2", c.drv.memcpyDtoH(unsafe.Pointer(unsafe.SliceData(dst)), addr, uint64(len(dst))))
	})
}

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

// MemInfo reports the GPU's memory from cuMemGetInfo_v2, adjusted to what
// this device can hand out: Free adds the pool's unused slab space (held
// from the driver, so not free for it) and, under MaxBytes, is bounded by
// the cap; Total is bounded by MaxBytes.
func (c *CUDA) MemInfo() (MemInfo, error) {
	var free, total uint64
	err := c.do(func() error { return c.drv.check("cuMemGetInfo_v2", c.drv.memGetInfo(&free, &total)) })
	if err != nil {
		return MemInfo{}, fmt.Errorf("gpu: cuda meminfo: %w", err)
	}
	st := c.pool.stats()
	mi := MemInfo{Total: total, Free: free + st.ReservedBytes - st.InUseBytes}
	if c.maxBytes != 0 {
		mi.Total = min(mi.Total, c.maxBytes)
		mi.Free = min(mi.Free, c.maxBytes-min(c.maxBytes, st.InUseBytes))
	}
	return mi, nil
}

// Close waits for calls in flight, frees every device buffer, the pinned
// memory of the lanes and of AllocHost, and releases the primary context.
// It is idempotent.
func (c *CUDA) Close() error {
	c.life.Lock()
	defer c.life.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := c.drv
	errs := []error{d.check("cuCtxSetCurrent", d.ctxSetCurrent(c.ctx))}
	errs = append(errs, c.pool.release())
	c.destroyLanes()
	c.hostMu.Lock()
	for _, r := range c.host {
		errs = append(errs, d.check("cuMemFreeHost", d.memFreeHost(r.p)))
	}
	c.host = nil
	c.hostMu.Unlock()
	errs = append(errs, d.check("cuDevicePrimaryCtxRelease", d.primaryCtxRelease(c.dev)))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gpu: cuda close: %w", err)
	}
	return nil
}
