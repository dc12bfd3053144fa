//go:build linux

// Command evloop is a yardstick, not product code: the cheapest HTTP/1.1
// reverse proxy we know how to write in Go, for `make bench-proxy-ceiling`
// (scripts/bench-proxy-ceiling.sh), which sets the sidecar's CPU per request
// beside it. It runs its own edge-triggered epoll loop on one locked OS
// thread (like one nginx worker) instead of Go's netpoller and goroutines.
//
// Usage: evloop -listen 127.0.0.1:19620 -upstream 127.0.0.1:19500 (IPv4 only).
//
// Design notes:
//   - Every socket is registered once with EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET;
//     there is no epoll_ctl per request.
//   - Per fd we keep readable/writable flags (nginx's rev->ready/wev->ready):
//     set by epoll events, cleared on EAGAIN, on a short read (unless the peer
//     half-closed, EPOLLRDHUP) and on a short write. No read(2) or write(2) is
//     issued on an fd that is known not to be ready.
//   - read/write/accept4/epoll_ctl go through syscall.RawSyscall (no
//     entersyscall, no error boxing); epoll_pwait goes through syscall.Syscall6
//     because it blocks.
//   - Connection structs and their 16 KiB buffers are recycled via a free list;
//     the steady state of keep-alive traffic allocates nothing.
//   - A request is relayed once it is whole (head and Content-Length body, at
//     most 1 MiB); a request with Transfer-Encoding gets 501. Responses are
//     relayed as they arrive, framed by Content-Length, chunked encoding or
//     the upstream's close. An idle upstream connection that fails before the
//     first response byte is retried once on a fresh connection.
//   - Closing the write end of a pipe registered with the loop (shutdown)
//     stops it; serve then closes every socket it holds.
//
// Files: the event loop, its listener and shutdown (loop.go); a
// connection's state, recycling and raw system calls (conn.go); one
// request's exchange, client to upstream and back (exchange.go); the
// HTTP/1.1 it parses and its framing (http.go); the sidecar's per-request
// work under -work (work.go).
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
)

func main() {
	listenAddr := flag.String("listen", "127.0.0.1:19620", "address to listen on (IPv4 ip:port)")
	upstream := flag.String("upstream", "127.0.0.1:19500", "upstream address (IPv4 ip:port)")
	stats := flag.Bool("stats", false, "print allocation counters to stderr every 50000 requests")
	doWork := flag.Bool("work", false, "do the sidecar's per-request work in the loop (work.go)")
	flag.Parse()

	la, err := netip.ParseAddrPort(*listenAddr)
	if err != nil || !la.Addr().Is4() {
		fmt.Fprintln(os.Stderr, "bad -listen (want IPv4 ip:port):", *listenAddr)
		os.Exit(2)
	}
	ua, err := netip.ParseAddrPort(*upstream)
	if err != nil || !ua.Addr().Is4() {
		fmt.Fprintln(os.Stderr, "bad -upstream (want IPv4 ip:port):", *upstream)
		os.Exit(2)
	}
	s, err := listen(la, ua)
	if err != nil {
		fmt.Fprintln(os.Stderr, "evloop:", err)
		os.Exit(1)
	}
	s.stats = *stats
	if *doWork {
		s.work = newWork()
	}
	fmt.Fprintf(os.Stderr, "evloop: listening on %s, upstream %s\n", s.addr, ua)
	if err := s.serve(); err != nil {
		fmt.Fprintln(os.Stderr, "evloop:", err)
		os.Exit(1)
	}
}
