// Package redisserver starts and stops a real redis-server (Debian's
// package, or $REDIS_SERVER) for tests and benchmarks.
//
//   - Find locates the binary: $REDIS_SERVER, else redis-server, then
//     valkey-server on PATH.
//   - Start runs it on a free loopback port with its data in a folder
//     (a temporary one unless Options.Dir is given), AOF on
//     (appendonly yes, appendfsync per Options.AppendFsync, RDB snapshots
//     off), and waits (bounded) until it answers PING, which it does only
//     once the AOF is loaded. Kill sends SIGKILL; Restart starts it again
//     on the same port and folder, so what the AOF held comes back.
//
// Invariants: a Server owns its process and the one goroutine that reaps
// it; Kill, Stop and Close return only after the process is reaped. On
// Linux the child also gets SIGKILL when the thread that started it dies
// (Pdeathsig), so a crashed test leaves no redis-server behind. The process
// itself is run by bench/harness/launch, as llama-server is.
//
// The subpackage redistest holds the test helpers (Require, Start).
package redisserver
