// Package rawconn owns the sidecar's raw socket calls: read(2), write(2)
// and a one-byte peek as raw system calls (SysRead, SysWrite, Peek), and
// Conn, a TCP connection read and written with them through Go's poller.
//
// Why: on a proxy's two cores the runtime's entry into a system call,
// around each read and write of a socket that never blocks, is what costs
// (Conn's comment says how). The front door's client connections and its
// event loop (package frontdoor) and the proxy's upstream connections
// (package proxy) all use these calls; one package holds them, and the
// race detector's build of them.
//
// Invariants:
//   - A Conn behaves as the net.TCPConn it wraps: bytes, end of stream,
//     deadlines (a lazy deadline never fires late), Close from another
//     goroutine, a reset (TestRawConnBehavesAsTCPConn).
//   - A Read and a Write allocate nothing.
//   - Built with the race detector (-race), SysRead and SysWrite are
//     syscall's, so the detector sees the memory they touch.
//   - Elsewhere than on Linux, New and Server return the connection as it
//     is.
package rawconn
