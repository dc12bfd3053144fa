// Package gpu owns devices and the buffers allocated on them.
//
// A Device hands out Buffers of device memory and copies bytes between host
// memory and those buffers. Two implement it:
//
//   - CPU, always available, backs buffers with ordinary Go memory so that
//     every tier of the KV store runs on a host without an accelerator.
//   - CUDA keeps buffers in an NVIDIA GPU's memory through the driver API,
//     loaded at run time from libcuda.so.1 with purego: CGO_ENABLED=0
//     builds run everywhere, and a host without the driver gets ErrNoCUDA
//     (which matches ErrUnavailable) instead of a link failure. Device
//     memory comes from a slab pool, copies from pageable Go memory are
//     double-buffered through pinned staging buffers on a few streams, and
//     copies from AllocHost memory are a single DMA. CUDA_VISIBLE_DEVICES is
//     applied by the driver; CUDAOptions.Ordinal counts visible GPUs.
//
// Open picks one by name ("cpu", "cuda", "auto"); "auto" falls back to the
// CPU and logs why once. Package gpu/hosttensor views float32 bytes as a
// gorgonia.org/tensor Dense for CPU-side maths.
//
// Invariants:
//   - A Buffer is a handle, not memory: it is valid from the Alloc that
//     returned it until the Free that releases it, on the Device that
//     allocated it and no other. Handles are never reused, so using one
//     afterwards returns ErrInvalidBuffer, never corrupts another buffer.
//   - CopyIn and CopyOut are synchronous: when they return, the bytes have
//     arrived. Copies never resize a buffer; a copy longer than the buffer is
//     an error.
//   - Alloc fails with an error matching ErrOutOfMemory when the device is
//     full (for CUDA, CUDA_ERROR_OUT_OF_MEMORY or the pool's MaxBytes); the
//     Focus tier then keeps the block in host memory.
//   - MemInfo reports what the device itself can still hand out; byte budgets
//     above it (tiers) are the caller's business.
//   - Every method is safe for concurrent use. CUDA calls lock their
//     goroutine to its OS thread and make the device's context current on
//     it for the duration of the call.
package gpu
