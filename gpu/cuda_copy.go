package gpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

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

// CopyWays is how many goroutines a pageable staging copy splits over at
// most (parallelCopy): what a process that moves KV through this package
// should keep in GOMAXPROCS.
const CopyWays = 4

// parallelCopy is copy(dst, src) split over up to CopyWays goroutines for
// chunks of a megabyte or more. One core's memmove (10 to 20 GB/s) is
// slower than a PCIe Gen5 link (about 55 GB/s pinned), so a single-threaded
// staging copy would cap pageable transfers well below the link; a few
// cores keep the DMA engine fed. BenchmarkParallelCopy measures it.
func parallelCopy(dst, src []byte) {
	const part = 512 << 10
	n := min(len(dst), len(src))
	k := min(runtime.GOMAXPROCS(0), CopyWays, n/part)
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
