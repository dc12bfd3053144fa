package gpu

import (
	"errors"
	"fmt"
)

// Kind says what kind of memory a Device manages.
type Kind uint8

const (
	// KindCPU is host memory managed by the Go runtime.
	KindCPU Kind = iota + 1
	// KindCUDA is device memory of an NVIDIA GPU reached through the driver API.
	KindCUDA
)

// String returns "cpu" or "cuda".
func (k Kind) String() string {
	switch k {
	case KindCPU:
		return "cpu"
	case KindCUDA:
		return "cuda"
	default:
		return fmt.Sprintf("kind(%d)", uint8(k))
	}
}

// Errors returned by devices. Classify them with errors.Is.
var (
	// ErrOutOfMemory means the device cannot hold another allocation of the
	// requested size.
	ErrOutOfMemory = errors.New("gpu: out of device memory")
	// ErrInvalidBuffer means a Buffer was freed already, belongs to another
	// device, or a copy does not fit it.
	ErrInvalidBuffer = errors.New("gpu: invalid buffer")
	// ErrClosed means the device was closed.
	ErrClosed = errors.New("gpu: device closed")
	// ErrUnavailable means no device of the asked kind exists on this host
	// (for CUDA: libcuda.so.1 missing or no GPU). Callers fall back to the CPU.
	ErrUnavailable = errors.New("gpu: device unavailable")
)

// Buffer is a handle to Size bytes of memory on one Device. The zero Buffer
// is invalid. Buffers are plain values; copying one does not copy memory.
type Buffer struct {
	// Handle identifies the allocation on its device: an allocation id,
	// never reused by that device, so a stale Buffer is caught rather than
	// aliasing a newer allocation at the same address.
	Handle uint64
	// Size is the allocation's length in bytes.
	Size int
}

// MemInfo is a device's memory in bytes.
type MemInfo struct {
	Total uint64 `json:"total"`
	Free  uint64 `json:"free"`
}

// Device allocates memory and copies bytes to and from it. Implementations
// are safe for concurrent use.
type Device interface {
	// Name is a human-readable description, e.g. "cpu" or "NVIDIA H100 80GB".
	Name() string
	// Kind says what memory the device manages.
	Kind() Kind
	// Alloc reserves n bytes (n > 0). It returns ErrOutOfMemory when the
	// device cannot hold them.
	Alloc(n int) (Buffer, error)
	// Free releases b. Freeing an invalid buffer returns ErrInvalidBuffer.
	Free(b Buffer) error
	// CopyIn copies src from host memory to the start of dst.
	CopyIn(dst Buffer, src []byte) error
	// CopyOut copies the first len(dst) bytes of src into host memory.
	CopyOut(dst []byte, src Buffer) error
	// MemInfo reports the device's total and free memory.
	MemInfo() (MemInfo, error)
	// Close frees every buffer still allocated and releases the device.
	// Later calls return ErrClosed.
	Close() error
}
