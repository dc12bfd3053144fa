// Package llamaserver starts and stops a real llama.cpp server
// (llama-server) for tests and benchmarks, and generates the tiny
// random-weight models it serves.
//
//   - Find locates the tools: $LLAMA_SERVER (else shared/llama/bin/llama-server
//     found by walking up from the working directory and from the
//     executable's directory), tiny_gguf.py ($LLAMA_TINY_GGUF, else next to
//     bin/) and python3 on PATH. The repository's contract is a `shared`
//     folder beside the clone (../shared of the repo root).
//   - TinyModel runs `python3 tiny_gguf.py OUT [dims...]` once per set of
//     arguments and script version, caching the file; other arguments (or
//     another seed) give another model.
//   - Start runs llama-server on a free loopback port with a slot save path,
//     waits (bounded) for GET /health to answer 200 and appends its output
//     to a log file. Kill sends SIGKILL, Stop SIGTERM; Restart starts it
//     again on the same port, slot folder and model (RestartWithModel with
//     another model).
//
// Invariants: a Server owns its process and the one goroutine that waits
// for it; Kill, Stop and Close return only after the process is reaped. On
// Linux the child also gets SIGKILL when the thread that started it dies
// (Pdeathsig), so a crashed test or benchmark leaves no llama-server behind.
// The process itself is run by bench/harness/launch, as redis-server is.
//
// The subpackage llamatest holds the test helpers (Require, Start).
package llamaserver
