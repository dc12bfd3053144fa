package gpu

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"
)

// CUDAOptions configure a CUDA device. The zero value opens the first
// visible GPU with the defaults below (NewCUDA applies EnsureDefaults and
// Validate).
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

// EnsureDefaults fills every zero field with its documented default and
// returns o. NewCUDA calls it; calling it twice changes nothing.
func (o *CUDAOptions) EnsureDefaults() *CUDAOptions {
	if o.SlabBytes == 0 {
		o.SlabBytes = defaultSlabBytes
	}
	if o.Streams == 0 {
		o.Streams = defaultStreams
	}
	if o.StagingBytes == 0 {
		o.StagingBytes = defaultStagingBytes
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *CUDAOptions) Validate() error {
	if o.Ordinal < 0 || o.SlabBytes < 0 || o.MaxBytes < 0 || o.Streams < 0 || o.StagingBytes < 0 {
		return fmt.Errorf("gpu: cuda options: negative value in %+v", *o)
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
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
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
