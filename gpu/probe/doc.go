// Package probe measures a gpu.Device the way the Focus tier uses it:
// host↔device bandwidth of the device's copies (CopyIn, CopyOut) from
// pinned and pageable host memory, each beside the plainest copy of the
// same bytes in the same run (cuMemcpyHtoD_v2 / cuMemcpyDtoH_v2 on a GPU,
// copy() between host slices on the CPU device), and, through a hook the
// caller passes, the latency of each block size. It is `sidecar gpu`'s
// probe and the core of `sidecar bench gpu`, whose Focus put/get latency
// (package tiers) stays in the benchmark harness.
//
// It imports only package gpu, so the serving binary carries it without
// any benchmark code. Run owns the device only when it opened it; every
// buffer and pinned allocation it makes is freed before it returns.
package probe
