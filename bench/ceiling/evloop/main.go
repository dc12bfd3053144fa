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
package main

import (
	"bytes"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvsidecar/kvsidecar/frontdoor"
)

const (
	bufSize   = 16 << 10
	maxReq    = 1 << 20 // largest request (head+body) accepted
	maxIdle   = 1024    // idle upstream keep-alive connections kept
	maxEvents = 512

	evIn    = uint32(syscall.EPOLLIN)
	evOut   = uint32(syscall.EPOLLOUT)
	evErr   = uint32(syscall.EPOLLERR)
	evHup   = uint32(syscall.EPOLLHUP)
	evRdHup = uint32(syscall.EPOLLRDHUP)
	evET    = uint32(1) << 31
)

const (
	kListener = iota
	kClient
	kUpstream
	kWake // read end of the shutdown pipe
)

// client states
const (
	stHead    = iota // reading / parsing the request
	stConnect        // waiting for a new upstream connection to complete
	stSend           // writing the request to the upstream
	stResp           // relaying the response to the client
)

// response framing
const (
	frLen = iota
	frChunked
	frClose
)

var (
	resp400 = []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp413 = []byte("HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp431 = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp501 = []byte("HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp502 = []byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	crlf2   = []byte("\r\n\r\n")
)

// chunkDec finds the end of a chunked answer with the sidecar's own
// decoder (frontdoor.Chunked, lenient as for an upstream's answer), its
// data skipped: the yardstick relays the body as it came.
type chunkDec struct{ d frontdoor.Chunked }

// feed consumes bytes of a chunked body. It returns how many bytes belong to
// the body, whether the body ended, and whether the framing was invalid.
func (c *chunkDec) feed(b []byte) (int, bool, bool) {
	c.d.Lenient = true
	n, done, err := c.d.Feed(b, nil, 0, 0)
	return n, done, err != nil
}

type conn struct {
	fd       int
	gen      uint32
	kind     uint8
	readable bool
	writable bool
	rdhup    bool // peer half-closed (EPOLLRDHUP/EPOLLHUP seen)
	buf      []byte
	rlen     int // bytes held in buf

	// client side
	st        uint8
	scan      int // where to resume the "\r\n\r\n" search
	reqLen    int // head+body length of the current request, 0 = head not parsed yet
	bodyAt    int // where the current request's body starts
	sent      int // request bytes written to the upstream
	keepAlive bool
	isHead    bool
	retried   bool
	up        *conn

	// upstream side
	client    *conn
	reused    bool // taken from the idle pool
	status    int  // the response's status (work)
	got       bool // received any byte of the response
	wrote     bool // wrote any byte of the response to the client
	headDone  bool
	done      bool // whole response is in [0, wend)
	noReuse   bool
	respClose bool
	framing   uint8
	wpos      int // next byte to write to the client
	wend      int // end of the bytes that may be written to the client
	hstart    int // start of the response head being parsed
	remain    int64
	chunk     chunkDec
}

// server is one event loop. listen sets addr and wakeW, which are only read
// afterwards; stopOnce is shutdown's; the fields from epfd on belong to the
// goroutine running serve.
type server struct {
	addr     netip.AddrPort // the address listened on (the port resolved)
	wakeW    int            // write end of the shutdown pipe; shutdown closes it
	stopOnce sync.Once

	epfd   int
	lfd    int
	upAddr *syscall.SockaddrInet4
	conns  []*conn // indexed by fd
	free   []*conn
	pool   []*conn // idle upstream connections, LIFO
	gen    uint32

	stats    bool
	nreq     uint64
	mallocs0 uint64

	// work, when set (-work), is the sidecar's per-request work done in
	// the loop (work.go); now is read once per wake-up for it.
	work *work
	now  time.Time
}

func rawRead(fd int, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return -1, e
	}
	return int(r), 0
}

func rawWrite(fd int, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return -1, e
	}
	return int(r), 0
}

func rawClose(fd int) {
	syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(fd), 0, 0)
}

func setNoDelay(fd int) {
	one := int32(1)
	syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, uintptr(fd), syscall.IPPROTO_TCP, syscall.TCP_NODELAY,
		uintptr(unsafe.Pointer(&one)), 4, 0)
}

func (s *server) newConn(fd int, kind uint8) *conn {
	var c *conn
	if n := len(s.free); n > 0 {
		c = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		c = &conn{buf: make([]byte, bufSize)}
	}
	buf := c.buf
	s.gen++
	*c = conn{fd: fd, gen: s.gen, kind: kind, buf: buf}
	for fd >= len(s.conns) {
		s.conns = append(s.conns, make([]*conn, len(s.conns)+64)...)
	}
	s.conns[fd] = c
	ev := syscall.EpollEvent{Events: evIn | evOut | evRdHup | evET, Fd: int32(fd), Pad: int32(c.gen)}
	_, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_CTL, uintptr(s.epfd), syscall.EPOLL_CTL_ADD, uintptr(fd),
		uintptr(unsafe.Pointer(&ev)), 0, 0)
	if e != 0 {
		fmt.Fprintln(os.Stderr, "epoll_ctl:", e)
		s.release(c)
		return nil
	}
	return c
}

// release closes the fd (which also removes it from the epoll set) and
// recycles the conn struct.
func (s *server) release(c *conn) {
	rawClose(c.fd)
	s.conns[c.fd] = nil
	c.fd = -1
	c.up = nil
	c.client = nil
	s.free = append(s.free, c)
}

func (s *server) closeUp(u *conn) {
	if c := u.client; c != nil && c.up == u {
		c.up = nil
	}
	s.release(u)
}

func (s *server) closeClient(c *conn) {
	if u := c.up; u != nil {
		s.closeUp(u)
	}
	s.release(c)
}

// reject writes a canned response (best effort) and closes the client.
func (s *server) reject(c *conn, resp []byte) {
	rawWrite(c.fd, resp)
	s.closeClient(c)
}

// badGateway answers 502 if nothing was sent to the client yet, and closes it.
func (s *server) badGateway(c *conn) {
	if u := c.up; u != nil && u.wrote {
		s.closeClient(c)
		return
	}
	s.reject(c, resp502)
}

func (s *server) dropIdle(u *conn) {
	for i := len(s.pool) - 1; i >= 0; i-- {
		if s.pool[i] == u {
			copy(s.pool[i:], s.pool[i+1:])
			s.pool = s.pool[:len(s.pool)-1]
			break
		}
	}
	s.release(u)
}

func resetResp(u *conn) {
	u.rlen, u.wpos, u.wend, u.hstart, u.scan = 0, 0, 0, 0, 0
	u.got, u.wrote, u.headDone, u.done, u.noReuse, u.respClose = false, false, false, false, false, false
	u.framing = frLen
	u.remain = 0
	u.chunk = chunkDec{}
}

func (s *server) accept() {
	for {
		nfd, _, e := syscall.RawSyscall6(syscall.SYS_ACCEPT4, uintptr(s.lfd), 0, 0,
			syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0, 0)
		if e != 0 {
			switch e {
			case syscall.EAGAIN:
				return
			case syscall.EINTR, syscall.ECONNABORTED:
				continue
			}
			fmt.Fprintln(os.Stderr, "accept4:", e)
			return
		}
		fd := int(nfd)
		setNoDelay(fd)
		c := s.newConn(fd, kClient)
		if c != nil {
			// A fresh socket has send space; readability arrives as an
			// event (EPOLL_CTL_ADD reports data that is already there).
			c.writable = true
		}
	}
}

// connectUp starts a new upstream connection for client c.
func (s *server) connectUp(c *conn) bool {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "socket:", err)
		s.badGateway(c)
		return false
	}
	setNoDelay(fd)
	err = syscall.Connect(fd, s.upAddr)
	if err != nil && err != syscall.EINPROGRESS {
		rawClose(fd)
		s.badGateway(c)
		return false
	}
	u := s.newConn(fd, kUpstream)
	if u == nil {
		s.badGateway(c)
		return false
	}
	u.client = c
	c.up = u
	c.sent = 0
	if err == nil {
		u.writable = true
		c.st = stSend
	} else {
		c.st = stConnect
	}
	return true
}

// dispatch hands the complete request in c.buf[:c.reqLen] to an upstream.
func (s *server) dispatch(c *conn) bool {
	c.sent = 0
	if s.work != nil {
		s.work.before(c.buf[c.bodyAt:c.reqLen], s.now)
	}
	if n := len(s.pool); n > 0 {
		u := s.pool[n-1]
		s.pool = s.pool[:n-1]
		resetResp(u)
		u.client = c
		u.reused = true
		c.up = u
		c.st = stSend
		return true
	}
	return s.connectUp(c)
}

// retry resends the request on a new connection once if a pooled upstream
// connection failed before any response byte arrived.
func (s *server) retry(c *conn) bool {
	u := c.up
	if !u.reused || u.got || c.retried {
		s.badGateway(c)
		return false
	}
	s.closeUp(u)
	c.retried = true
	return s.connectUp(c)
}

// finish completes the current exchange; it returns false if c was closed.
func (s *server) finish(c *conn) bool {
	u := c.up
	c.up = nil
	u.client = nil
	if s.work != nil {
		body := u.buf[:0]
		if u.bodyAt <= u.wend && u.wend <= len(u.buf) {
			body = u.buf[u.bodyAt:u.wend] // the answer's body when it came in one read
		}
		s.work.after(u.status, body, s.now)
	}
	if s.stats {
		s.nreq++
		if s.nreq%50000 == 0 {
			s.printStats()
		}
	}
	closeClient := !c.keepAlive || u.respClose || u.framing == frClose
	if u.noReuse || u.respClose || u.framing == frClose || u.rdhup || len(s.pool) >= maxIdle {
		s.release(u)
	} else {
		s.pool = append(s.pool, u)
	}
	if closeClient {
		s.release(c)
		return false
	}
	left := c.rlen - c.reqLen
	if left > 0 {
		copy(c.buf, c.buf[c.reqLen:c.rlen])
	}
	c.rlen = left
	c.reqLen, c.scan, c.sent = 0, 0, 0
	c.retried = false
	c.st = stHead
	return true
}

func (s *server) printStats() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(os.Stderr, "evloop: %d requests, %d mallocs since last report, %d GCs, %d idle upstream conns\n",
		s.nreq, ms.Mallocs-s.mallocs0, ms.NumGC, len(s.pool))
	s.mallocs0 = ms.Mallocs
}

func asciiLower(b byte) byte {
	if b >= 'A' && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// eqFold compares b with the lower-case ASCII string s case-insensitively.
func eqFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if asciiLower(b[i]) != s[i] {
			return false
		}
	}
	return true
}

// containsFold reports whether b contains the lower-case ASCII string s.
func containsFold(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if eqFold(b[i:i+len(s)], s) {
			return true
		}
	}
	return false
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		v = v*10 + int64(ch-'0')
	}
	return v, true
}

// nextLine splits off one header line (without its line ending).
func nextLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return trimSpace(b), nil
	}
	line = b[:i]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, b[i+1:]
}

// parseRequest looks for a complete request head in c.buf. It returns 0 if
// more bytes are needed, 1 when c.reqLen is set, -1 if c was closed.
func (s *server) parseRequest(c *conn) int {
	start := c.scan
	i := bytes.Index(c.buf[start:c.rlen], crlf2)
	if i < 0 {
		c.scan = c.rlen - 3
		if c.scan < 0 {
			c.scan = 0
		}
		return 0
	}
	hend := start + i + 4
	line, rest := nextLine(c.buf[:hend])
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || len(line) < sp+10 {
		s.reject(c, resp400)
		return -1
	}
	c.isHead = string(line[:sp]) == "HEAD"
	ver := line[len(line)-8:]
	switch string(ver) {
	case "HTTP/1.1":
		c.keepAlive = true
	case "HTTP/1.0":
		c.keepAlive = false
	default:
		s.reject(c, resp400)
		return -1
	}
	var cl int64
	for len(rest) > 0 {
		line, rest = nextLine(rest)
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			s.reject(c, resp400)
			return -1
		}
		name := line[:colon]
		switch len(name) {
		case 14:
			if eqFold(name, "content-length") {
				v, ok := parseDecimal(trimSpace(line[colon+1:]))
				if !ok {
					s.reject(c, resp400)
					return -1
				}
				cl = v
			}
		case 17:
			if eqFold(name, "transfer-encoding") {
				s.reject(c, resp501)
				return -1
			}
		case 10:
			if eqFold(name, "connection") {
				v := line[colon+1:]
				if containsFold(v, "close") {
					c.keepAlive = false
				} else if containsFold(v, "keep-alive") {
					c.keepAlive = true
				}
			}
		}
	}
	total := int64(hend) + cl
	if total > maxReq {
		s.reject(c, resp413)
		return -1
	}
	if int(total) > len(c.buf) {
		nb := make([]byte, (int(total)+bufSize-1)/bufSize*bufSize)
		copy(nb, c.buf[:c.rlen])
		c.buf = nb
	}
	c.reqLen = int(total)
	c.bodyAt = hend
	return 1
}

// parseRespHead parses the response head u.buf[u.hstart:hend]. It returns
// the status code, or -1 if the head is malformed.
func parseRespHead(u *conn, hend int, reqHead bool) int {
	line, rest := nextLine(u.buf[u.hstart:hend])
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' {
		return -1
	}
	status := 0
	for _, ch := range line[9:12] {
		if ch < '0' || ch > '9' {
			return -1
		}
		status = status*10 + int(ch-'0')
	}
	if status >= 100 && status < 200 && status != 101 {
		return status // interim response: no body, another head follows
	}
	u.status = status
	u.respClose = line[7] == '0'
	var cl int64 = -1
	chunked := false
	for len(rest) > 0 {
		line, rest = nextLine(rest)
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			continue
		}
		name := line[:colon]
		switch len(name) {
		case 14:
			if eqFold(name, "content-length") {
				v, ok := parseDecimal(trimSpace(line[colon+1:]))
				if !ok {
					return -1
				}
				cl = v
			}
		case 17:
			if eqFold(name, "transfer-encoding") && containsFold(line[colon+1:], "chunked") {
				chunked = true
			}
		case 10:
			if eqFold(name, "connection") {
				v := line[colon+1:]
				if containsFold(v, "close") {
					u.respClose = true
				} else if containsFold(v, "keep-alive") {
					u.respClose = false
				}
			}
		}
	}
	switch {
	case reqHead || status == 204 || status == 304:
		u.framing, u.remain = frLen, 0
	case status == 101: // no tunnel support: relay until the upstream closes
		u.framing = frClose
	case chunked:
		u.framing = frChunked
	case cl >= 0:
		u.framing, u.remain = frLen, cl
	default:
		u.framing = frClose
	}
	return status
}

// onUpstreamData accounts for newly read bytes u.buf[old rlen:u.rlen]: it
// parses heads and advances u.wend over bytes that belong to the response.
// It returns false if the response is malformed.
func onUpstreamData(u *conn, reqHead bool) bool {
	for !u.headDone {
		i := bytes.Index(u.buf[u.scan:u.rlen], crlf2)
		if i < 0 {
			u.scan = u.rlen - 3
			if u.scan < u.hstart {
				u.scan = u.hstart
			}
			// head larger than the buffer?
			return !(u.rlen == len(u.buf) && u.hstart == 0)
		}
		hend := u.scan + i + 4
		status := parseRespHead(u, hend, reqHead)
		if status < 0 {
			return false
		}
		u.wend, u.hstart, u.scan = hend, hend, hend
		u.bodyAt = hend
		if status >= 100 && status < 200 && status != 101 {
			continue
		}
		u.headDone = true
	}
	switch u.framing {
	case frLen:
		k := int64(u.rlen - u.wend)
		if k >= u.remain {
			k = u.remain
			u.done = true
			if u.wend+int(k) < u.rlen {
				u.noReuse = true // bytes beyond the response
			}
		}
		u.remain -= k
		u.wend += int(k)
	case frChunked:
		k, done, bad := u.chunk.feed(u.buf[u.wend:u.rlen])
		if bad {
			return false
		}
		u.wend += k
		if done {
			u.done = true
			if u.wend < u.rlen {
				u.noReuse = true
			}
		}
	case frClose:
		u.wend = u.rlen
	}
	return true
}

// step advances client c (and its upstream) as far as readiness allows.
func (s *server) step(c *conn) {
	for {
		switch c.st {
		case stHead:
			if c.reqLen == 0 && c.rlen > 0 {
				if s.parseRequest(c) < 0 {
					return
				}
			}
			if c.reqLen > 0 && c.rlen >= c.reqLen {
				if !s.dispatch(c) {
					return
				}
				continue
			}
			if !c.readable {
				return
			}
			if c.rlen == len(c.buf) { // head did not fit
				s.reject(c, resp431)
				return
			}
			want := len(c.buf) - c.rlen
			n, e := rawRead(c.fd, c.buf[c.rlen:])
			if e != 0 {
				if e == syscall.EAGAIN {
					c.readable = false
					return
				}
				if e == syscall.EINTR {
					continue
				}
				s.closeClient(c)
				return
			}
			if n == 0 {
				s.closeClient(c)
				return
			}
			if n < want && !c.rdhup {
				c.readable = false // drained the socket; the next data is a new edge
			}
			c.rlen += n

		case stConnect:
			u := c.up
			if !u.writable {
				return
			}
			soerr, err := syscall.GetsockoptInt(u.fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
			if err != nil || soerr != 0 {
				s.closeUp(u)
				s.badGateway(c)
				return
			}
			c.st = stSend

		case stSend:
			u := c.up
			if !u.writable {
				return
			}
			n, e := rawWrite(u.fd, c.buf[c.sent:c.reqLen])
			if e != 0 {
				if e == syscall.EAGAIN {
					u.writable = false
					return
				}
				if e == syscall.EINTR {
					continue
				}
				if !s.retry(c) {
					return
				}
				continue
			}
			c.sent += n
			if c.sent < c.reqLen {
				u.writable = false
				continue
			}
			c.st = stResp

		case stResp:
			u := c.up
			if u.wpos < u.wend {
				if !c.writable {
					return
				}
				n, e := rawWrite(c.fd, u.buf[u.wpos:u.wend])
				if e != 0 {
					if e == syscall.EAGAIN {
						c.writable = false
						return
					}
					if e == syscall.EINTR {
						continue
					}
					s.closeClient(c)
					return
				}
				u.wpos += n
				u.wrote = true
				if u.wpos < u.wend {
					c.writable = false
					return
				}
				continue
			}
			if u.done {
				if !s.finish(c) {
					return
				}
				continue
			}
			// everything relayed so far was written: make room
			if u.wend > 0 {
				if u.wend < u.rlen {
					copy(u.buf, u.buf[u.wend:u.rlen])
				}
				u.rlen -= u.wend
				u.hstart = max(u.hstart-u.wend, 0)
				u.scan = max(u.scan-u.wend, 0)
				u.wpos, u.wend = 0, 0
			}
			if !u.readable {
				return
			}
			want := len(u.buf) - u.rlen
			if want == 0 { // cannot happen: a full buffer without a complete head is rejected
				s.badGateway(c)
				return
			}
			n, e := rawRead(u.fd, u.buf[u.rlen:])
			if e != 0 {
				if e == syscall.EAGAIN {
					u.readable = false
					return
				}
				if e == syscall.EINTR {
					continue
				}
				if !u.got {
					if !s.retry(c) {
						return
					}
					continue
				}
				s.closeClient(c)
				return
			}
			if n == 0 {
				if !u.got {
					if !s.retry(c) {
						return
					}
					continue
				}
				if u.headDone && u.framing == frClose {
					u.done = true
					continue
				}
				s.badGateway(c) // truncated response
				return
			}
			if n < want && !u.rdhup {
				u.readable = false
			}
			u.got = true
			u.rlen += n
			if !onUpstreamData(u, c.isHead) {
				s.badGateway(c)
				return
			}
		}
	}
}

// loop runs the event loop until the shutdown pipe is closed (nil) or
// epoll_pwait fails.
func (s *server) loop() error {
	events := make([]syscall.EpollEvent, maxEvents)
	for {
		r, _, e := syscall.Syscall6(syscall.SYS_EPOLL_PWAIT, uintptr(s.epfd),
			uintptr(unsafe.Pointer(&events[0])), maxEvents, ^uintptr(0), 0, 0)
		if e != 0 {
			if e == syscall.EINTR {
				continue
			}
			return fmt.Errorf("epoll_pwait: %w", e)
		}
		n := int(r)
		if s.work != nil {
			s.now = time.Now()
		}
		for i := 0; i < n; i++ {
			ev := &events[i]
			fd := int(ev.Fd)
			if fd >= len(s.conns) {
				continue
			}
			c := s.conns[fd]
			if c == nil || c.gen != uint32(ev.Pad) {
				continue // stale event for a closed (and maybe reused) fd
			}
			flags := ev.Events
			switch c.kind {
			case kListener:
				s.accept()
				continue
			case kWake:
				return nil
			}
			if flags&(evIn|evErr|evHup|evRdHup) != 0 {
				c.readable = true
			}
			if flags&(evOut|evErr|evHup) != 0 {
				c.writable = true
			}
			if flags&(evRdHup|evHup|evErr) != 0 {
				c.rdhup = true
			}
			if c.kind == kClient {
				if c.st != stHead && flags&(evErr|evHup) != 0 {
					s.closeClient(c) // client gone mid-exchange
					continue
				}
				s.step(c)
				continue
			}
			// upstream
			if c.client != nil {
				s.step(c.client)
				continue
			}
			// idle pooled connection: the upstream closed it or sent junk
			if flags&(evRdHup|evHup|evErr) != 0 {
				s.dropIdle(c)
				continue
			}
			if c.readable {
				_, e := rawRead(c.fd, c.buf)
				if e == syscall.EAGAIN {
					c.readable = false // spurious edge
				} else {
					s.dropIdle(c)
				}
			}
		}
	}
}

// listen opens the listening socket on la (port 0 picks a free one) and the
// epoll instance; the returned server forwards to ua once serve runs.
func listen(la, ua netip.AddrPort) (*server, error) {
	if !la.Addr().Is4() || !ua.Addr().Is4() {
		return nil, fmt.Errorf("listen %s, upstream %s: want IPv4 ip:port", la, ua)
	}
	s := &server{conns: make([]*conn, 1024), epfd: -1, lfd: -1, wakeW: -1}
	s.upAddr = &syscall.SockaddrInet4{Port: int(ua.Port()), Addr: ua.Addr().As4()}
	ok := false
	defer func() {
		if !ok {
			s.closeAll()
			s.shutdown()
		}
	}()
	var err error
	s.epfd, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	s.wakeW = p[1]
	if s.newConn(p[0], kWake) == nil {
		return nil, fmt.Errorf("epoll_ctl: cannot register the shutdown pipe")
	}
	lfd, err := listenSocket(la)
	if err != nil {
		return nil, err
	}
	if s.newConn(lfd, kListener) == nil {
		return nil, fmt.Errorf("epoll_ctl: cannot register the listener")
	}
	s.lfd = lfd
	sa, err := syscall.Getsockname(lfd)
	if err != nil {
		return nil, fmt.Errorf("getsockname: %w", err)
	}
	sa4, _ := sa.(*syscall.SockaddrInet4)
	if sa4 == nil {
		return nil, fmt.Errorf("getsockname: not an IPv4 address")
	}
	s.addr = netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), uint16(sa4.Port))
	ok = true
	return s, nil
}

// listenSocket returns a non-blocking socket listening on la.
func listenSocket(la netip.AddrPort) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		rawClose(fd)
		return -1, fmt.Errorf("setsockopt SO_REUSEADDR: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		rawClose(fd)
		return -1, fmt.Errorf("bind %s: %w", la, err)
	}
	if err := syscall.Listen(fd, 4096); err != nil {
		rawClose(fd)
		return -1, fmt.Errorf("listen %s: %w", la, err)
	}
	return fd, nil
}

// serve runs the event loop on the calling goroutine, locked to its OS
// thread, until shutdown; then it closes every socket the server holds. It
// must be called once.
func (s *server) serve() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := s.loop()
	s.closeAll()
	return err
}

// shutdown makes serve return; it may be called from any goroutine, more than
// once, and before serve starts.
func (s *server) shutdown() {
	s.stopOnce.Do(func() {
		if s.wakeW >= 0 {
			rawClose(s.wakeW)
		}
	})
}

// closeAll closes every socket still open, the shutdown pipe's read end and
// the epoll instance. The shutdown pipe's write end is shutdown's to close.
func (s *server) closeAll() {
	for fd, c := range s.conns {
		if c != nil {
			rawClose(fd)
			s.conns[fd] = nil
		}
	}
	s.pool, s.free = nil, nil
	if s.epfd >= 0 {
		rawClose(s.epfd)
		s.epfd = -1
	}
}

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
