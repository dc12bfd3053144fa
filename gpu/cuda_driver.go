package gpu

import (
	"fmt"
	"os"
	"sync"
	"unsafe"
)

// The CUDA driver API, bound at run time.
//
// Every entry point is a Go func field filled by purego from libcuda.so.1
// (cuda_load_linux.go), so the package builds with CGO_ENABLED=0 and a host
// without the driver gets ErrNoCUDA instead of a link failure. Tests fill the
// same fields with a fake driver (cuda_fake_test.go) to exercise the slab
// pool, the staged copies and error classification on hosts without a GPU.
//
// Types follow cuda.h on 64-bit Linux: CUresult, CUdevice and the attribute
// enum are C int (int32); CUdeviceptr is unsigned long long (uint64); size_t
// is uint64; CUcontext, CUstream and CUevent are opaque pointers held as
// uintptr (driver memory the Go GC must not trace); host pointers the driver
// reads or writes are unsafe.Pointer.

// cuResult is a CUresult.
type cuResult int32

// CUresult codes the package classifies; see cuda.h. cuGetErrorString gives
// the description of any code at run time.
const (
	cuSuccess                 cuResult = 0
	cuErrInvalidValue         cuResult = 1
	cuErrOutOfMemory          cuResult = 2
	cuErrNotInitialized       cuResult = 3
	cuErrDeinitialized        cuResult = 4
	cuErrStubLibrary          cuResult = 34
	cuErrInsufficientDriver   cuResult = 35
	cuErrDeviceUnavailable    cuResult = 46
	cuErrNoDevice             cuResult = 100
	cuErrInvalidDevice        cuResult = 101
	cuErrInvalidContext       cuResult = 201
	cuErrInvalidHandle        cuResult = 400
	cuErrNotReady             cuResult = 600
	cuErrIllegalAddress       cuResult = 700
	cuErrNotPermitted         cuResult = 800
	cuErrNotSupported         cuResult = 801
	cuErrSystemNotReady       cuResult = 802
	cuErrSystemDriverMismatch cuResult = 803
	cuErrCompatNotSupported   cuResult = 804
	cuErrUnknown              cuResult = 999
)

var cuResultNames = map[cuResult]string{
	cuSuccess:                 "CUDA_SUCCESS",
	cuErrInvalidValue:         "CUDA_ERROR_INVALID_VALUE",
	cuErrOutOfMemory:          "CUDA_ERROR_OUT_OF_MEMORY",
	cuErrNotInitialized:       "CUDA_ERROR_NOT_INITIALIZED",
	cuErrDeinitialized:        "CUDA_ERROR_DEINITIALIZED",
	cuErrStubLibrary:          "CUDA_ERROR_STUB_LIBRARY",
	cuErrInsufficientDriver:   "CUDA_ERROR_INSUFFICIENT_DRIVER",
	cuErrDeviceUnavailable:    "CUDA_ERROR_DEVICE_UNAVAILABLE",
	cuErrNoDevice:             "CUDA_ERROR_NO_DEVICE",
	cuErrInvalidDevice:        "CUDA_ERROR_INVALID_DEVICE",
	cuErrInvalidContext:       "CUDA_ERROR_INVALID_CONTEXT",
	cuErrInvalidHandle:        "CUDA_ERROR_INVALID_HANDLE",
	cuErrNotReady:             "CUDA_ERROR_NOT_READY",
	cuErrIllegalAddress:       "CUDA_ERROR_ILLEGAL_ADDRESS",
	cuErrNotPermitted:         "CUDA_ERROR_NOT_PERMITTED",
	cuErrNotSupported:         "CUDA_ERROR_NOT_SUPPORTED",
	cuErrSystemNotReady:       "CUDA_ERROR_SYSTEM_NOT_READY",
	cuErrSystemDriverMismatch: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	cuErrCompatNotSupported:   "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	cuErrUnknown:              "CUDA_ERROR_UNKNOWN",
}

func (r cuResult) String() string {
	if s, ok := cuResultNames[r]; ok {
		return s
	}
	return fmt.Sprintf("CUresult(%d)", int32(r))
}

// unavailable reports whether a code returned while initialising means
// "no usable GPU here" rather than a bug: the caller then falls back to
// the CPU device.
func (r cuResult) unavailable() bool {
	switch r {
	case cuErrNoDevice, cuErrInvalidDevice, cuErrStubLibrary, cuErrInsufficientDriver,
		cuErrDeviceUnavailable, cuErrNotInitialized, cuErrDeinitialized, cuErrNotPermitted,
		cuErrNotSupported, cuErrSystemNotReady, cuErrSystemDriverMismatch, cuErrCompatNotSupported,
		cuErrUnknown:
		return true
	}
	return false
}

// CUDA device attributes (CUdevice_attribute) read by the package.
const (
	cuAttrPCIBusID    = 33
	cuAttrPCIDeviceID = 34
	cuAttrPCIDomainID = 50
	cuAttrCCMajor     = 75
	cuAttrCCMinor     = 76
)

// Flags.
const (
	// cuStreamNonBlocking: the stream does not synchronise with the legacy
	// default stream, so copies of one lane never wait for another
	// library's work on stream 0.
	cuStreamNonBlocking = 0x1
	// cuEventDefault records timing; staging events need it for
	// cuEventElapsedTime.
	cuEventDefault = 0x0
	// cuMemHostAllocDefault: page-locked, not portable, not mapped, not
	// write-combined. Write-combined memory is slow for the CPU to read, and
	// the device-to-host staging buffers are read by the CPU.
	cuMemHostAllocDefault = 0x0
)

// CUDAError is a failed driver call. errors.Is(err, ErrOutOfMemory) holds
// for CUDA_ERROR_OUT_OF_MEMORY, so callers classify device OOM without
// knowing CUDA.
type CUDAError struct {
	// Op is the driver entry point, e.g. "cuMemAlloc_v2".
	Op string
	// Code is the CUresult.
	Code int
	// Desc is cuGetErrorString's description, empty when unavailable.
	Desc string
}

func (e *CUDAError) Error() string {
	s := fmt.Sprintf("%s: %s", e.Op, cuResult(e.Code))
	if e.Desc != "" {
		s += " (" + e.Desc + ")"
	}
	return s
}

// Is makes CUDA_ERROR_OUT_OF_MEMORY match ErrOutOfMemory.
func (e *CUDAError) Is(target error) bool {
	return target == ErrOutOfMemory && cuResult(e.Code) == cuErrOutOfMemory
}

// driver holds the bound entry points. A nil func field is a symbol the
// loaded library lacks; only optional ones may be nil (see bindDriver).
type driver struct {
	lib string

	init               func(flags uint32) cuResult
	driverGetVersion   func(v *int32) cuResult
	deviceGet          func(dev *int32, ordinal int32) cuResult
	deviceGetCount     func(n *int32) cuResult
	deviceGetName      func(name *byte, n int32, dev int32) cuResult
	deviceTotalMem     func(bytes *uint64, dev int32) cuResult
	deviceGetAttribute func(v *int32, attr int32, dev int32) cuResult
	primaryCtxRetain   func(ctx *uintptr, dev int32) cuResult
	primaryCtxRelease  func(dev int32) cuResult
	ctxSetCurrent      func(ctx uintptr) cuResult
	memAlloc           func(dptr *uint64, n uint64) cuResult
	memFree            func(dptr uint64) cuResult
	memHostAlloc       func(p *unsafe.Pointer, n uint64, flags uint32) cuResult
	memFreeHost        func(p unsafe.Pointer) cuResult
	memcpyHtoDAsync    func(dst uint64, src unsafe.Pointer, n uint64, stream uintptr) cuResult
	memcpyDtoHAsync    func(dst unsafe.Pointer, src uint64, n uint64, stream uintptr) cuResult
	memcpyHtoD         func(dst uint64, src unsafe.Pointer, n uint64) cuResult
	memcpyDtoH         func(dst unsafe.Pointer, src uint64, n uint64) cuResult
	streamCreate       func(s *uintptr, flags uint32) cuResult
	streamDestroy      func(s uintptr) cuResult
	streamSynchronize  func(s uintptr) cuResult
	eventCreate        func(e *uintptr, flags uint32) cuResult
	eventDestroy       func(e uintptr) cuResult
	eventRecord        func(e uintptr, s uintptr) cuResult
	eventSynchronize   func(e uintptr) cuResult
	eventElapsedTime   func(ms *float32, start, end uintptr) cuResult
	memGetInfo         func(free, total *uint64) cuResult
	getErrorString     func(r cuResult, s *unsafe.Pointer) cuResult

	// initErr is cuInit's outcome, run once per loaded library.
	initOnce sync.Once
	initErr  error
}

// driverSymbol names a func field and the symbols that may fill it, newest
// first: cuda.h maps cuMemAlloc to cuMemAlloc_v2 and so on, and a library
// exports every version it supports. Optional symbols may be missing.
type driverSymbol struct {
	fptr     any
	names    []string
	optional bool
}

func (d *driver) symbols() []driverSymbol {
	return []driverSymbol{
		{&d.init, []string{"cuInit"}, false},
		{&d.driverGetVersion, []string{"cuDriverGetVersion"}, true},
		{&d.deviceGet, []string{"cuDeviceGet"}, false},
		{&d.deviceGetCount, []string{"cuDeviceGetCount"}, false},
		{&d.deviceGetName, []string{"cuDeviceGetName"}, false},
		{&d.deviceTotalMem, []string{"cuDeviceTotalMem_v2"}, false},
		{&d.deviceGetAttribute, []string{"cuDeviceGetAttribute"}, false},
		{&d.primaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}, false},
		{&d.primaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, false},
		{&d.ctxSetCurrent, []string{"cuCtxSetCurrent"}, false},
		{&d.memAlloc, []string{"cuMemAlloc_v2"}, false},
		{&d.memFree, []string{"cuMemFree_v2"}, false},
		{&d.memHostAlloc, []string{"cuMemHostAlloc"}, false},
		{&d.memFreeHost, []string{"cuMemFreeHost"}, false},
		{&d.memcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}, false},
		{&d.memcpyDtoHAsync, []string{"cuMemcpyDtoHAsync_v2"}, false},
		{&d.memcpyHtoD, []string{"cuMemcpyHtoD_v2"}, false},
		{&d.memcpyDtoH, []string{"cuMemcpyDtoH_v2"}, false},
		{&d.streamCreate, []string{"cuStreamCreate"}, false},
		{&d.streamDestroy, []string{"cuStreamDestroy_v2", "cuStreamDestroy"}, false},
		{&d.streamSynchronize, []string{"cuStreamSynchronize"}, false},
		{&d.eventCreate, []string{"cuEventCreate"}, false},
		{&d.eventDestroy, []string{"cuEventDestroy_v2", "cuEventDestroy"}, false},
		{&d.eventRecord, []string{"cuEventRecord"}, false},
		{&d.eventSynchronize, []string{"cuEventSynchronize"}, false},
		// CUDA 12.8 added cuEventElapsedTime_v2 and CUDA 13's header maps
		// the plain name to it; same signature.
		{&d.eventElapsedTime, []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}, false},
		{&d.memGetInfo, []string{"cuMemGetInfo_v2"}, false},
		{&d.getErrorString, []string{"cuGetErrorString"}, true},
	}
}

// check turns a CUresult into nil or a *CUDAError.
func (d *driver) check(op string, r cuResult) error {
	if r == cuSuccess {
		return nil
	}
	return &CUDAError{Op: op, Code: int(r), Desc: d.errorString(r)}
}

// errorString returns cuGetErrorString's text for r, or "".
func (d *driver) errorString(r cuResult) string {
	if d.getErrorString == nil {
		return ""
	}
	var p unsafe.Pointer
	if d.getErrorString(r, &p) != cuSuccess || p == nil {
		return ""
	}
	return cString(p, 256)
}

// cString copies a NUL-terminated C string of at most max bytes.
func cString(p unsafe.Pointer, max int) string {
	var b []byte
	for i := range max {
		c := *(*byte)(unsafe.Add(p, i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// initialize runs cuInit(0) once per library. Failures that mean "no usable
// GPU" wrap ErrNoCUDA; CUDA_VISIBLE_DEVICES is applied by the driver here.
func (d *driver) initialize() error {
	d.initOnce.Do(func() {
		r := d.init(0)
		if r == cuSuccess {
			return
		}
		err := d.check("cuInit", r)
		if r.unavailable() {
			d.initErr = fmt.Errorf("%w: %s%w", ErrNoCUDA, visibleDevicesNote(r), err)
			return
		}
		d.initErr = err
	})
	return d.initErr
}

// visibleDevicesNote explains CUDA_ERROR_NO_DEVICE when CUDA_VISIBLE_DEVICES
// hides every GPU: the most common surprise in containers.
func visibleDevicesNote(r cuResult) string {
	v, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	if r != cuErrNoDevice || !set {
		return ""
	}
	return fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q hides every device: ", v)
}

// DefaultCUDALibrary is the driver library opened when CUDAOptions.Library
// is empty: the SONAME the NVIDIA driver installs (and the NVIDIA container
// toolkit mounts). "libcuda.so" without the version is a development
// symlink absent from runtime images.
const DefaultCUDALibrary = "libcuda.so.1"

var (
	// driversMu protects drivers: one bound driver per library path, kept
	// for the life of the process. libcuda is never dlclosed: the driver
	// owns threads and unloading it under them is unsafe.
	driversMu sync.Mutex
	drivers   = map[string]*driver{}
)

// openDriver loads and initialises the driver library at path (empty:
// DefaultCUDALibrary). Every failure wraps ErrNoCUDA unless cuInit failed
// for a reason other than "no usable GPU".
func openDriver(path string) (*driver, error) {
	if path == "" {
		path = DefaultCUDALibrary
	}
	driversMu.Lock()
	d, ok := drivers[path]
	if !ok {
		var err error
		if d, err = loadDriver(path); err != nil {
			driversMu.Unlock()
			return nil, err
		}
		drivers[path] = d
	}
	driversMu.Unlock()
	if err := d.initialize(); err != nil {
		return nil, err
	}
	return d, nil
}

// ErrNoCUDA means the CUDA driver cannot be used on this host: libcuda.so.1
// is missing or lacks an entry point, cuInit failed, or no device is
// visible. The wrapping error says which. It matches ErrUnavailable too,
// so callers that only care about "fall back to the CPU" test that.
var ErrNoCUDA = fmt.Errorf("%w: no usable CUDA driver", ErrUnavailable)
