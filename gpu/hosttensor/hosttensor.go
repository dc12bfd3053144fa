// Package hosttensor views float32 bytes (host memory, or what a gpu.Device
// copied out) as a gorgonia.org/tensor Dense for CPU-side maths. It is
// kept out of package gpu so the serving binary does not link gorgonia.
package hosttensor

import (
	"fmt"
	"unsafe"

	"gorgonia.org/tensor"
)

// HostTensor returns a float32 *tensor.Dense of the given shape viewing
// buf: no copy, so writes through the tensor change buf and the reverse.
// It is how CPU-side maths (the reference KV computer, checks in tests)
// works on bytes the CPU device or a CopyOut produced. buf must hold
// exactly the shape's elements, 4 bytes each in host byte order, and
// start 4-byte aligned (Go allocations and slices of them at multiples of
// 4 do). The view is valid as long as buf is; for memory from
// CUDA.AllocHost that means until FreeHost.
//
// gorgonia.org/tensor v0.9.24 imports go4.org/unsafe/assume-no-moving-gc,
// which panics at start on Go releases it does not know unless upgraded;
// go.mod pins a version that accepts Go 1.26 (TestHostTensor starting at
// all checks it).
func HostTensor(buf []byte, shape ...int) (*tensor.Dense, error) {
	if len(shape) == 0 {
		return nil, fmt.Errorf("hosttensor: empty shape")
	}
	n := 1
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("hosttensor: shape %v has a non-positive dimension", shape)
		}
		n *= d
	}
	if len(buf) != 4*n {
		return nil, fmt.Errorf("hosttensor: shape %v needs %d bytes, buffer has %d", shape, 4*n, len(buf))
	}
	p := unsafe.Pointer(unsafe.SliceData(buf))
	if uintptr(p)%4 != 0 {
		return nil, fmt.Errorf("hosttensor: buffer at %p is not 4-byte aligned", p)
	}
	f := unsafe.Slice((*float32)(p), n)
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f)), nil
}
