// Package gpu owns devices and the buffers allocated on them.
//
// A Device hands out Buffers of device memory and copies bytes between host
// memory and those buffers. The CPU device, always available, backs buffers
// with ordinary Go memory so that every tier of the KV store runs on a host
// without an accelerator; a CUDA device (a later change, bound at run time
// with purego so CGO_ENABLED=0 builds still run everywhere) implements the
// same interface over the driver API.
//
// Invariants:
//   - A Buffer is a handle, not memory: it is valid from the Alloc that
//     returned it until the Free that releases it, on the Device that
//     allocated it and no other. Using it afterwards returns ErrInvalidBuffer,
//     never corrupts another buffer.
//   - CopyIn and CopyOut are synchronous: when they return, the bytes have
//     arrived. Copies never resize a buffer; a copy longer than the buffer is
//     an error.
//   - MemInfo reports what the device itself can still hand out; byte budgets
//     above it (tiers) are the caller's business.
//   - Every method is safe for concurrent use.
package gpu
