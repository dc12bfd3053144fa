//go:build linux

package proxy

// The pass-through on an event loop of its own (Options.EventLoop; design
// in docs/DESIGN.md, "The pass-through on an event loop of its own").
//
// One goroutine, locked to its OS thread, runs an edge-triggered epoll
// loop (nginx's worker, in Go) that owns the listening socket. It reads
// each request head and serves, without a goroutine or a clock reading of
// its own, the requests the forward path would send on unchanged: a
// non-streamed chat or completions POST without a session, whose body
// parseRequest accepts. Any other request — or any doubt about one — hands
// its connection to the fasthttp server for good, with the bytes already
// read, before anything of that request went upstream (handOff). What the
// loop serves, it serves as the forward path does: the same checks, the
// same upstream request (upstreamRequest's target, Host and end-to-end
// headers), the same engine hooks, the same OpenAI-shaped errors and
// metrics; TestEventLoopMatchesFasthttp sends one corpus both ways.
//
// Why: on a small machine the proxy's CPU per request is its latency, and
// Go's poller wakes a goroutine per socket event; a loop of its own keeps
// readiness per socket (no read that finds nothing, no wake-up between
// goroutines) and meets nginx's p99 where the runtime's I/O model cannot
// (make bench-proxy-ceiling, docs/BENCHMARKS.md).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/frontdoor"
	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

const (
	evBufSize   = 16 << 10 // a connection's read buffer; heads must fit
	evMaxEvents = 256
	evTick      = 100 * time.Millisecond // how often deadlines are looked at

	evIn    = uint32(syscall.EPOLLIN)
	evOut   = uint32(syscall.EPOLLOUT)
	evErr   = uint32(syscall.EPOLLERR)
	evHup   = uint32(syscall.EPOLLHUP)
	evRdHup = uint32(syscall.EPOLLRDHUP)
	evET    = uint32(1) << 31
)

// Kinds of the loop's sockets.
const (
	evListener = iota
	evClient
	evUpstream
	evWake
)

// A client connection's states.
const (
	csHead    = iota // reading a request
	csConnect        // waiting for a new upstream connection
	csSend           // writing the request upstream
	csAnswer         // reading the upstream's answer
	csWrite          // writing the response to the client
)

// Framings of an upstream answer's body.
const (
	frLength = iota
	frChunked
	frClose
)

// evConn is one socket of the loop: a client's or an upstream's.
type evConn struct {
	fd       int
	gen      uint32
	kind     uint8
	readable bool
	writable bool
	rdhup    bool // the peer half-closed, or the socket failed
	buf      []byte
	rlen     int   // bytes held in buf
	dl       int64 // deadline, the loop's monotonic nanoseconds; 0: none

	// client
	st      uint8
	served  int // requests answered on the connection
	reqLen  int // the current request's head and body; 0: head not read
	bodyAt  int
	rt      route
	start   time.Time
	req     frontdoor.Head // the request's head as the front door read it
	auth    [2]int         // the Authorization value's start and end in buf
	out     []byte         // the upstream request, then the response
	sent    int
	retried bool
	closing bool // the client asked for Connection: close
	ec      *engineCall
	up      *evConn

	// upstream
	client    *evConn
	reused    bool
	idleSince int64
	got       bool // a byte of the answer came
	headDone  bool
	head      []byte // the answer's head
	status    int
	framing   uint8
	remain    int64
	chunk     frontdoor.Chunked // Lenient: an answer
	body      []byte            // the answer's body, decoded
	noReuse   bool
	closeConn bool // the answer said Connection: close, or HTTP/1.0
}

// evLoop is the loop and what it owns.
type evLoop struct {
	s      *Server
	ln     net.Listener // the listener Serve was given; closed by shutdown
	epfd   int
	lfd    int
	wakeR  int
	wakeW  int
	hand   *handListener
	upAddr syscall.Sockaddr
	upV6   bool
	// target is the upstream request line's start ("POST " + base path),
	// host its Host line.
	target []byte
	host   []byte
	engine bool // the engine connector's hooks run (generic)
	lim    frontdoor.Limits
	front  frontdoor.Options // the handed-over connections'

	conns []*evConn // by fd
	free  []*evConn
	pool  []*evConn // idle upstream connections, the last used last
	gen   uint32
	socks int // client and upstream sockets open

	epoch   time.Time
	now     time.Time
	mono    int64 // now - epoch
	nextDL  int64 // when deadlines are looked at next
	accept  bool  // accept again at the next tick (out of descriptors)
	date    []byte
	dateSec int64

	// Shutdown: stop is closed to begin it (no new connection, idle ones
	// closed), force to close everything; done when the loop returned.
	stopOnce  sync.Once
	forceOnce sync.Once
	stopping  bool
	forcing   bool
	stopFlag  chan struct{}
	forceFlag chan struct{}
	done      chan struct{}

	// served and handed count the requests the loop took and the
	// connections it handed over (tests).
	served, handed atomic.Uint64
}

// handListener is the fasthttp server's listener in loop mode: the
// connections the loop hands over.
type handListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (h *handListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.closed:
		return nil, net.ErrClosed
	}
}

func (h *handListener) Close() error {
	h.once.Do(func() { close(h.closed) })
	return nil
}

func (h *handListener) Addr() net.Addr { return h.addr }

// push gives the fasthttp server a connection; it never blocks the loop.
func (h *handListener) push(c net.Conn) {
	select {
	case h.conns <- c:
	default:
		go func() {
			select {
			case h.conns <- c:
			case <-h.closed:
				_ = c.Close()
			}
		}()
	}
}

// loopEligible says why the loop cannot serve this server's pass-through
// (empty: it can): a plain-HTTP upstream at an IP address, a TCP listener,
// an engine connector whose hooks never block.
func (s *Server) loopEligible(ln net.Listener) string {
	if _, ok := ln.(*net.TCPListener); !ok {
		return "the listener is not TCP"
	}
	if s.base.Scheme != "http" {
		return "the upstream is not plain HTTP"
	}
	host := s.base.Hostname()
	if ip := net.ParseIP(host); ip == nil {
		return "the upstream is named, not an IP address"
	}
	if !s.engine.NeverBlocks() {
		return "the engine connector's hooks may block (it does not say engine.NonBlocking)"
	}
	return ""
}

// startLoop starts the loop on ln when Options.EventLoop asks and the
// server allows; it returns the listener fasthttp serves (ln through the
// front door without the loop) and the loop. Serve calls it with loopMu
// held.
func (s *Server) startLoop(ln net.Listener) (net.Listener, *evLoop) {
	if !s.opts.EventLoop {
		return s.frontListener(ln), nil
	}
	if why := s.loopEligible(ln); why != "" {
		s.log.Warn("event loop off: "+why+"; serving on Go's poller", "upstream", s.opts.Upstream)
		return s.frontListener(ln), nil
	}
	l, err := newEvLoop(s, ln.(*net.TCPListener))
	if err != nil {
		s.log.Warn("event loop off; serving on Go's poller", "err", err)
		return s.frontListener(ln), nil
	}
	s.loop = l
	go l.run()
	return l.hand, l
}

func newEvLoop(s *Server, ln *net.TCPListener) (*evLoop, error) {
	l := &evLoop{s: s, ln: ln, epfd: -1, lfd: -1, wakeR: -1, wakeW: -1,
		conns: make([]*evConn, 256), epoch: time.Now(),
		stopFlag: make(chan struct{}), forceFlag: make(chan struct{}), done: make(chan struct{}),
		engine: s.engine != nil, lim: s.frontLimits(), front: s.frontOptions(),
	}
	l.hand = &handListener{addr: ln.Addr(), conns: make(chan net.Conn, 256), closed: make(chan struct{})}
	port, _ := strconv.Atoi(s.base.Port())
	if port == 0 {
		port = 80
	}
	ip := net.ParseIP(s.base.Hostname())
	if ip4 := ip.To4(); ip4 != nil {
		l.upAddr = &syscall.SockaddrInet4{Port: port, Addr: [4]byte(ip4)}
	} else {
		l.upAddr = &syscall.SockaddrInet6{Port: port, Addr: [16]byte(ip.To16())}
		l.upV6 = true
	}
	l.target = append([]byte("POST "), s.basePath...)
	l.host = []byte("Host: " + s.base.Host + "\r\n")
	ok := false
	defer func() {
		if !ok {
			l.closeFDs()
		}
	}()
	var err error
	if l.epfd, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	l.wakeR, l.wakeW = p[0], p[1]
	if l.add(l.wakeR, evWake) == nil {
		return nil, errors.New("epoll_ctl: the wake pipe")
	}
	f, err := ln.File() // a dup of the listening socket, blocking
	if err != nil {
		return nil, fmt.Errorf("listener: %w", err)
	}
	l.lfd, err = syscall.Dup(int(f.Fd()))
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	syscall.CloseOnExec(l.lfd)
	if err := syscall.SetNonblock(l.lfd, true); err != nil {
		return nil, fmt.Errorf("listener: %w", err)
	}
	if l.add(l.lfd, evListener) == nil {
		return nil, errors.New("epoll_ctl: the listener")
	}
	ok = true
	return l, nil
}

func (l *evLoop) closeFDs() {
	for _, fd := range []int{l.epfd, l.wakeR, l.wakeW, l.lfd} {
		if fd >= 0 {
			_ = syscall.Close(fd)
		}
	}
}

// shutdown stops the loop: no new connection, idle ones closed, requests
// under way answered until ctx ends, then everything closed. It returns
// when the loop has returned.
func (l *evLoop) shutdown(ctx context.Context) {
	l.stopOnce.Do(func() { close(l.stopFlag); l.wake() })
	select {
	case <-l.done:
	case <-ctx.Done():
		l.forceOnce.Do(func() { close(l.forceFlag); l.wake() })
		<-l.done
	}
}

func (l *evLoop) wake() {
	one := [1]byte{1}
	_, _ = syscall.Write(l.wakeW, one[:])
}

// run is the loop's goroutine.
func (l *evLoop) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(l.done)
	err := l.loop()
	if err != nil {
		l.s.log.Error("event loop failed; its connections are closed", "err", err)
	}
	for fd, c := range l.conns {
		if c != nil {
			if c.kind == evClient && c.st != csHead {
				l.endRequest(c, statusClientClosed, nil)
			}
			_ = syscall.Close(fd)
			l.conns[fd] = nil
		}
	}
	l.lfd, l.wakeR = -1, -1 // closed with the conns
	l.closeFDs()
	_ = l.ln.Close()
}

func (l *evLoop) loop() error {
	events := make([]syscall.EpollEvent, evMaxEvents)
	for {
		wait := -1
		if l.live() {
			wait = int(evTick / time.Millisecond)
		}
		n, err := syscall.EpollWait(l.epfd, events, wait)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return fmt.Errorf("epoll_wait: %w", err)
		}
		l.now = time.Now()
		l.mono = int64(l.now.Sub(l.epoch))
		for i := range n {
			ev := &events[i]
			fd := int(ev.Fd)
			if fd >= len(l.conns) {
				continue
			}
			c := l.conns[fd]
			if c == nil || c.gen != uint32(ev.Pad) {
				continue // an event of a closed socket
			}
			flags := ev.Events
			switch c.kind {
			case evListener:
				l.acceptAll()
				continue
			case evWake:
				l.drainWake()
				continue
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
			if c.kind == evClient {
				l.step(c)
				continue
			}
			if c.client != nil {
				l.step(c.client)
				continue
			}
			if c.rdhup || c.readable { // idle: the upstream closed it or sent what none asked for
				l.dropIdle(c)
			}
		}
		if l.mono >= l.nextDL {
			l.nextDL = l.mono + int64(evTick)
			l.expire()
		}
		if l.forcing {
			return nil
		}
		if l.stopping && l.clients() == 0 {
			return nil
		}
	}
}

// live reports whether the loop holds a socket with a deadline or a retry
// to make: then it wakes each tick.
func (l *evLoop) live() bool {
	return l.accept || l.socks > 0
}

func (l *evLoop) clients() int {
	n := 0
	for _, c := range l.conns {
		if c != nil && c.kind == evClient {
			n++
		}
	}
	return n
}

func (l *evLoop) drainWake() {
	var b [64]byte
	for {
		n, err := syscall.Read(l.wakeR, b[:])
		if n <= 0 || err != nil {
			break
		}
	}
	select {
	case <-l.forceFlag:
		l.forcing = true
	default:
	}
	select {
	case <-l.stopFlag:
		if !l.stopping {
			l.stopping = true
			l.stopAccepting()
		}
	default:
	}
}

// stopAccepting closes the listening socket and every idle client and
// upstream connection; the fasthttp server hears no more connections.
func (l *evLoop) stopAccepting() {
	if c := l.conns[l.lfd]; c != nil {
		l.release(c)
	}
	l.accept = false
	for _, c := range l.conns {
		if c != nil && c.kind == evClient && c.st == csHead && c.rlen == 0 {
			l.closeClient(c)
		}
	}
	for len(l.pool) > 0 {
		l.dropIdle(l.pool[len(l.pool)-1])
	}
}

// expire ends what waited past its deadline.
func (l *evLoop) expire() {
	if l.accept {
		l.acceptAll()
	}
	for i := len(l.pool) - 1; i >= 0; i-- {
		if u := l.pool[i]; l.mono-u.idleSince >= int64(l.s.opts.UpstreamIdleTimeout) {
			l.dropIdle(u)
		}
	}
	for _, c := range l.conns {
		if c == nil || c.kind != evClient || c.dl == 0 || l.mono < c.dl {
			continue
		}
		switch c.st {
		case csHead:
			if c.rlen == 0 {
				l.closeClient(c) // idle past IdleTimeout, or nothing sent within ReadTimeout
				continue
			}
			l.s.metrics.countRequest(routeNotFound, fasthttp.StatusRequestTimeout, 0) // as handleParseError
			l.reject(c, fasthttp.StatusRequestTimeout, typeInvalidRequest, "request_timeout", "timed out reading the request")
		case csConnect:
			l.upFailed(c, &dialError{err: os.ErrDeadlineExceeded})
		case csSend, csAnswer:
			if u := c.up; u != nil && u.headDone {
				l.failBody(c, true, nil)
			} else {
				l.upFailed(c, os.ErrDeadlineExceeded)
			}
		case csWrite:
			l.closeClient(c)
		}
	}
}

// add registers a socket.
func (l *evLoop) add(fd int, kind uint8) *evConn {
	var c *evConn
	if n := len(l.free); n > 0 {
		c = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		c = &evConn{buf: make([]byte, evBufSize)}
	}
	l.gen++
	*c = evConn{fd: fd, gen: l.gen, kind: kind, buf: c.buf[:evBufSize:evBufSize], out: c.out[:0], head: c.head[:0], body: c.body[:0], req: c.req}
	for fd >= len(l.conns) {
		l.conns = append(l.conns, make([]*evConn, len(l.conns))...)
	}
	ev := syscall.EpollEvent{Events: evIn | evOut | evRdHup | evET, Fd: int32(fd), Pad: int32(c.gen)}
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		_ = syscall.Close(fd)
		l.free = append(l.free, c)
		return nil
	}
	l.conns[fd] = c
	if kind == evClient || kind == evUpstream {
		l.socks++
	}
	return c
}

// release closes c's socket and keeps its buffers for the next one; a
// buffer grown for a large request or answer goes.
func (l *evLoop) release(c *evConn) {
	_ = syscall.Close(c.fd)
	l.conns[c.fd] = nil
	if c.kind == evClient || c.kind == evUpstream {
		l.socks--
	}
	c.fd, c.up, c.client, c.ec = -1, nil, nil, nil
	if cap(c.buf) > evBufSize {
		c.buf = make([]byte, evBufSize)
	}
	if cap(c.out) > 64<<10 {
		c.out = nil
	}
	if cap(c.body) > 64<<10 {
		c.body = nil
	}
	if cap(c.head) > 16<<10 {
		c.head = nil
	}
	l.free = append(l.free, c)
}

func (l *evLoop) closeUp(u *evConn) {
	if c := u.client; c != nil && c.up == u {
		c.up = nil
	}
	l.release(u)
}

func (l *evLoop) closeClient(c *evConn) {
	if u := c.up; u != nil {
		l.closeUp(u)
	}
	l.release(c)
}

func (l *evLoop) dropIdle(u *evConn) {
	for i := len(l.pool) - 1; i >= 0; i-- {
		if l.pool[i] == u {
			copy(l.pool[i:], l.pool[i+1:])
			l.pool = l.pool[:len(l.pool)-1]
			break
		}
	}
	l.release(u)
}

func (l *evLoop) acceptAll() {
	l.accept = false
	if l.stopping {
		return
	}
	for {
		nfd, _, e := syscall.Syscall6(syscall.SYS_ACCEPT4, uintptr(l.lfd), 0, 0,
			syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0, 0)
		switch e {
		case 0:
		case syscall.EAGAIN:
			return
		case syscall.EINTR, syscall.ECONNABORTED:
			continue
		default: // out of descriptors, or memory: again at the next tick
			l.s.log.Warn("event loop: accept failed; trying again", "err", e)
			l.accept = true
			return
		}
		fd := int(nfd)
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if c := l.add(fd, evClient); c != nil {
			c.writable = true // a new socket has room; readability comes as an event
			c.dl = l.mono + int64(l.s.opts.ReadTimeout)
		}
	}
}

// reject answers an OpenAI-shaped error and closes the connection once it
// is written.
func (l *evLoop) reject(c *evConn, status int, typ, code, msg string) {
	if u := c.up; u != nil {
		l.closeUp(u)
	}
	c.out = l.errorResponse(c.out[:0], status, typ, code, msg, true)
	c.sent, c.reqLen, c.rlen = 0, 0, 0
	c.st = csWrite
	c.served = -1 // closes once written
	c.dl = l.mono + int64(l.s.opts.WriteTimeout)
	l.step(c)
}

// step advances client c, and its upstream, as far as readiness allows.
func (l *evLoop) step(c *evConn) {
	for {
		switch c.st {
		case csHead:
			if c.rdhup && c.rlen == 0 && !c.readable {
				l.closeClient(c)
				return
			}
			if c.reqLen == 0 && c.rlen > 0 {
				switch l.readHead(c) {
				case headWait:
				case headServe:
				case headHandOff:
					l.handOff(c)
					return
				}
			}
			if c.reqLen > 0 && c.rlen >= c.reqLen {
				if !l.serve(c) {
					return
				}
				continue
			}
			if !c.readable {
				return
			}
			if c.rlen == len(c.buf) {
				if c.reqLen == 0 { // a head larger than the buffer: fasthttp's to answer
					l.handOff(c)
					return
				}
				nb := make([]byte, min(max(2*len(c.buf), 64<<10), c.reqLen))
				copy(nb, c.buf[:c.rlen])
				c.buf = nb
			}
			want := len(c.buf) - c.rlen
			n, e := rawconn.SysRead(uintptr(c.fd), c.buf[c.rlen:])
			switch {
			case e == syscall.EAGAIN:
				c.readable = false
				return
			case e == syscall.EINTR:
				continue
			case e != 0 || n == 0:
				l.closeClient(c)
				return
			}
			if n < want && !c.rdhup {
				c.readable = false // drained: the next bytes come as a new edge
			}
			if c.rlen == 0 {
				c.dl = l.mono + int64(l.s.opts.ReadTimeout)
			}
			c.rlen += n

		case csConnect:
			u := c.up
			if !u.writable {
				return
			}
			soerr, err := syscall.GetsockoptInt(u.fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
			if err == nil && soerr != 0 {
				err = syscall.Errno(soerr)
			}
			if err != nil {
				l.upFailed(c, &dialError{err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", err)}})
				return
			}
			c.st = csSend
			c.dl = l.mono + int64(l.s.opts.UpstreamTimeout)

		case csSend:
			if c.rdhup && l.clientGone(c) {
				return
			}
			u := c.up
			if !u.writable {
				return
			}
			n, e := rawconn.SysWrite(uintptr(u.fd), c.out[c.sent:])
			switch {
			case e == syscall.EAGAIN:
				u.writable = false
				return
			case e == syscall.EINTR:
				continue
			case e != 0:
				l.upFailed(c, &noResponseError{err: os.NewSyscallError("write", e)})
				return
			}
			c.sent += n
			if c.sent < len(c.out) {
				u.writable = false
				continue
			}
			c.st = csAnswer

		case csAnswer:
			if c.rdhup && l.clientGone(c) {
				return
			}
			u := c.up
			if !u.readable {
				return
			}
			if u.rlen == len(u.buf) { // a head that does not fit yet
				if len(u.buf) >= maxHeadBytes {
					l.upFailed(c, &badResponseError{err: errHeadTooLarge, tooLarge: true})
					return
				}
				nb := make([]byte, min(2*len(u.buf), maxHeadBytes))
				copy(nb, u.buf[:u.rlen])
				u.buf = nb
			}
			want := len(u.buf) - u.rlen
			n, e := rawconn.SysRead(uintptr(u.fd), u.buf[u.rlen:])
			switch {
			case e == syscall.EAGAIN:
				u.readable = false
				return
			case e == syscall.EINTR:
				continue
			case e != 0 || n == 0:
				l.upEnded(c, e)
				return
			}
			if n < want && !u.rdhup {
				u.readable = false
			}
			u.got = true
			u.rlen += n
			if !l.onAnswer(c) {
				return
			}

		case csWrite:
			if !c.writable {
				return
			}
			n, e := rawconn.SysWrite(uintptr(c.fd), c.out[c.sent:])
			switch {
			case e == syscall.EAGAIN:
				c.writable = false
				return
			case e == syscall.EINTR:
				continue
			case e != 0:
				l.closeClient(c)
				return
			}
			c.sent += n
			if c.sent < len(c.out) {
				c.writable = false
				return
			}
			if c.served < 0 || c.closing || l.stopping {
				l.closeClient(c)
				return
			}
			c.served++
			left := c.rlen - c.reqLen
			copy(c.buf, c.buf[c.reqLen:c.rlen])
			c.rlen, c.reqLen, c.sent = left, 0, 0
			c.out = c.out[:0]
			c.st = csHead
			c.dl = l.mono + int64(l.s.opts.IdleTimeout)
			if left > 0 {
				c.dl = l.mono + int64(l.s.opts.ReadTimeout)
			}
		}
	}
}

// What readHead decided.
const (
	headWait    = iota // more bytes needed
	headServe          // c.reqLen is the request's length: the loop serves it
	headHandOff        // the fasthttp server serves the connection from here
)

// readHead reads the request head in c.buf through the front door's reader
// (frontdoor.Head.Parse, the one the fasthttp server's connections are read
// through) and decides who serves the request. A head the reader refuses
// is handed over, to be refused there with the same reader. The loop
// serves only HTTP/1.1 POSTs to /v1/chat/completions or /v1/completions as
// written, with a Content-Length within MaxBodyBytes, a Content-Type, no
// Expect and no X-Session-ID: what the forward path would send on
// unchanged. The hop-by-hop fields and those Connection lists are gone
// from c.head before the Authorization is read.
func (l *evLoop) readHead(c *evConn) int {
	b := c.buf[:c.rlen]
	h := &c.req
	switch err := h.Parse(b, l.lim); {
	case err == frontdoor.ErrNeedMore:
		return headWait
	case err != nil:
		return headHandOff
	}
	if h.Minor != 1 || h.Framing != frontdoor.FrameLength || h.Continue || string(h.Method(b)) != "POST" ||
		h.Length > int64(l.s.opts.MaxBodyBytes) {
		return headHandOff
	}
	var r route
	switch string(h.Target(b)) {
	case "/v1/chat/completions":
		r = routeChat
	case "/v1/completions":
		r = routeCompletions
	default:
		return headHandOff
	}
	if ct, ok := h.Get(b, "Content-Type"); !ok || len(ct) == 0 {
		return headHandOff
	}
	if _, ok := h.Get(b, "X-Session-ID"); ok {
		return headHandOff
	}
	c.auth = [2]int{}
	if at, end, ok := h.Lookup(b, "Authorization"); ok {
		c.auth = [2]int{at, end}
	}
	c.closing = h.Close
	c.bodyAt = h.Len
	c.reqLen = c.bodyAt + int(h.Length) // the buffer grows as the body comes (step), not on the length's word
	c.rt = r
	return headServe
}

// headerToken reports whether k is an HTTP token (RFC 9110 §5.6.2).
func headerToken(k []byte) bool {
	if len(k) == 0 {
		return false
	}
	for _, ch := range k {
		if ch <= ' ' || ch >= 0x7f || bytes.IndexByte([]byte(`"(),/:;<=>?@[\]{}`), ch) >= 0 {
			return false
		}
	}
	return true
}

// headerValue reports whether v holds no control character but tab.
func headerValue(v []byte) bool {
	for _, ch := range v {
		if ch < ' ' && ch != '\t' || ch == 0x7f {
			return false
		}
	}
	return true
}

// handOff gives c, with the bytes it read, to the fasthttp server.
func (l *evLoop) handOff(c *evConn) {
	l.handed.Add(1)
	pre := append([]byte(nil), c.buf[:c.rlen]...)
	fd := c.fd
	_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, fd, nil)
	l.conns[fd] = nil
	l.socks--
	c.fd = -1
	l.free = append(l.free, c)
	f := os.NewFile(uintptr(fd), "")
	nc, err := net.FileConn(f) // a dup in Go's poller
	_ = f.Close()
	if err != nil {
		l.s.log.Warn("event loop: handing a connection over failed", "err", err)
		return
	}
	l.hand.push(frontdoor.Resume(rawconn.Server(nc), &l.front, pre))
}

// serve starts the request in c.buf[:c.reqLen] upstream, or hands the
// connection over; false when c was closed or handed over.
func (l *evLoop) serve(c *evConn) bool {
	s := l.s
	body := c.buf[c.bodyAt:c.reqLen]
	ep := epChat
	if c.rt == routeCompletions {
		ep = epCompletions
	}
	info, err := parseRequest(ep, body)
	if err != nil || info.Stream || info.PromptCacheKey != "" {
		l.handOff(c) // its 400, its stream, its session: the forward path's
		return false
	}
	l.served.Add(1)
	c.start = l.now
	s.metrics.inFlight.Add(1)
	s.metrics.bytesIn.Add(uint64(len(body)))
	if c.rdhup && l.clientGone(c) {
		return false
	}
	if l.engine {
		auth := c.buf[c.auth[0]:c.auth[1]]
		c.ec = &engineCall{req: engine.Request{Tenant: tenantOf(auth), Model: info.Model, Body: body, Start: c.start}}
		nb, err := s.engine.Before(context.Background(), &c.ec.req)
		if err != nil {
			s.log.Warn("engine connector before-hook failed; forwarding anyway", "engine", s.opts.Engine.Name(), "err", err)
		}
		if len(nb) > 0 {
			body = nb
		}
	}
	c.out = l.upstreamRequest(c.out[:0], c, body)
	c.retried = false
	return l.dispatch(c)
}

// upstreamRequest appends the upstream request upstreamRequest and
// copyRequestHeaders build: the base path before the path, the upstream's
// Host, the end-to-end headers as the front door kept them (Accept-Encoding
// dropped while the engine reads answers), the body's length.
func (l *evLoop) upstreamRequest(dst []byte, c *evConn, body []byte) []byte {
	b := c.buf[:c.bodyAt]
	dst = append(dst, l.target...)
	dst = append(dst, c.req.Target(b)...)
	dst = append(dst, " HTTP/1.1\r\n"...)
	dst = append(dst, l.host...)
	for i := range c.req.NumFields() {
		k, v := c.req.Field(b, i)
		if foldEq(k, "Host") || l.engine && foldEq(k, "Accept-Encoding") {
			continue
		}
		dst = append(dst, k...)
		dst = append(dst, ": "...)
		dst = append(dst, v...)
		dst = append(dst, "\r\n"...)
	}
	dst = append(dst, "Content-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n\r\n"...)
	return append(dst, body...)
}

// dispatch sends c's request on a pooled upstream connection, or a new one.
func (l *evLoop) dispatch(c *evConn) bool {
	c.sent = 0
	c.dl = l.mono + int64(l.s.opts.UpstreamTimeout)
	for n := len(l.pool); n > 0; n = len(l.pool) {
		u := l.pool[n-1]
		l.pool = l.pool[:n-1]
		if u.rdhup || l.mono-u.idleSince >= int64(l.s.opts.UpstreamIdleTimeout) {
			l.release(u)
			continue
		}
		l.attach(c, u, true)
		c.st = csSend
		return true
	}
	return l.connect(c)
}

func (l *evLoop) attach(c, u *evConn, reused bool) {
	u.client, c.up = c, u
	u.reused = reused
	u.rlen, u.got, u.headDone, u.noReuse, u.closeConn = 0, false, false, false, false
	u.status, u.framing, u.remain, u.chunk = 0, frLength, 0, frontdoor.Chunked{Lenient: true}
	u.head, u.body = u.head[:0], u.body[:0]
}

// connect starts a new upstream connection for c.
func (l *evLoop) connect(c *evConn) bool {
	dom := syscall.AF_INET
	if l.upV6 {
		dom = syscall.AF_INET6
	}
	fd, err := syscall.Socket(dom, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		l.upFailed(c, &dialError{err: os.NewSyscallError("socket", err)})
		return false
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	err = syscall.Connect(fd, l.upAddr)
	if err != nil && !errors.Is(err, syscall.EINPROGRESS) {
		_ = syscall.Close(fd)
		l.upFailed(c, &dialError{err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", err)}})
		return false
	}
	u := l.add(fd, evUpstream)
	if u == nil {
		l.upFailed(c, &dialError{err: errors.New("epoll_ctl failed")})
		return false
	}
	l.attach(c, u, false)
	c.sent = 0
	c.dl = l.mono + int64(l.s.opts.DialTimeout)
	c.st = csConnect
	if err == nil {
		u.writable = true
	}
	return true
}

// upEnded handles the upstream closing (e: the error, 0 for EOF) while c
// waits for its answer.
func (l *evLoop) upEnded(c *evConn, e syscall.Errno) {
	u := c.up
	var err error = io.EOF
	if e != 0 {
		err = os.NewSyscallError("read", e)
	}
	switch {
	case !u.got:
		l.upFailed(c, &noResponseError{err: err})
	case !u.headDone:
		l.upFailed(c, &cutResponseError{err: err})
	case u.framing == frClose && e == 0:
		u.noReuse = true
		l.answered(c)
	default:
		l.failBody(c, false, err)
	}
}

// upFailed ends c's round trip that failed before an answer's head: sent
// once more on a fresh connection when a reused one failed before any
// byte of an answer (the rest of the pool goes too), else answered as
// unanswered answers it.
func (l *evLoop) upFailed(c *evConn, err error) {
	s := l.s
	u := c.up
	var nothing *noResponseError
	if u != nil && u.reused && !u.got && !c.retried && errors.As(err, &nothing) {
		l.closeUp(u)
		for len(l.pool) > 0 {
			l.dropIdle(l.pool[len(l.pool)-1])
		}
		c.retried = true
		s.up.retries.Add(1)
		if l.connect(c) {
			l.step(c)
		}
		return
	}
	if u != nil {
		l.closeUp(u)
	}
	status, code, kind := classifyUpstreamError(err)
	s.metrics.countUpstreamError(kind)
	s.log.Warn("upstream request failed", "route", c.rt.String(), "kind", kind, "err", err)
	msg := upstreamMessage(err)
	if status == fasthttp.StatusGatewayTimeout {
		msg = fmt.Sprintf("upstream did not answer within %s", s.opts.UpstreamTimeout)
	}
	l.answerError(c, status, typeUpstream, code, msg)
}

// failBody ends c's round trip whose answer broke after its head, as
// buffer does.
func (l *evLoop) failBody(c *evConn, timedOut bool, err error) {
	s := l.s
	if u := c.up; u != nil {
		l.closeUp(u)
	}
	if err == nil {
		err = os.ErrDeadlineExceeded
	}
	status, code, kind := classifyBodyError(err, timedOut)
	s.metrics.countUpstreamError(kind)
	s.log.Warn("upstream body failed", "route", c.rt.String(), "kind", kind, "err", err)
	l.answerError(c, status, typeUpstream, code, "upstream response broken: "+kind)
}

// clientGone ends c's request when its client went away (EPOLLRDHUP, as
// goneWatch's peek finds it): 499 counted, the upstream connection closed.
// It returns true when c is gone.
func (l *evLoop) clientGone(c *evConn) bool {
	var b [1]byte
	n, e := rawconn.Peek(uintptr(c.fd), &b)
	if e == 0 && n > 0 || e == syscall.EAGAIN {
		c.rdhup = e == 0 // a pipelined byte: the peek finds the end later
		return false
	}
	l.s.metrics.disconnects.Add(1)
	l.s.log.Info("client went away before the upstream answered", "route", c.rt.String())
	l.endRequest(c, statusClientClosed, errorJSON(typeInvalidRequest, "client_closed", "client closed the request"))
	l.closeClient(c)
	return true
}

// onAnswer takes in the bytes read into c.up's buffer: the head once whole,
// then the body. False when c's request ended.
func (l *evLoop) onAnswer(c *evConn) bool {
	u := c.up
	for !u.headDone {
		if n := min(u.rlen, len("HTTP/1.")); !bytes.Equal(u.buf[:n], []byte("HTTP/1.")[:n]) {
			l.upFailed(c, &badResponseError{err: errors.New("not an HTTP/1.x response")})
			return false
		}
		if line, rest := cutLine(u.buf[:u.rlen]); rest != nil && statusOf(line) < 0 {
			l.upFailed(c, &badResponseError{err: errors.New("malformed status line")})
			return false
		}
		end := headEnd(u.buf[:u.rlen])
		if end < 0 {
			return true
		}
		head := u.buf[:end]
		st, ok := parseAnswerHead(u, head)
		if !ok {
			if fixed := repairFraming(head); !bytes.Equal(fixed, head) {
				st, ok = parseAnswerHead(u, fixed)
				head = fixed
			}
		}
		if !ok {
			l.upFailed(c, &badResponseError{err: errors.New("malformed response head")})
			return false
		}
		if st >= 100 && st < 200 {
			if st == 101 {
				l.upFailed(c, &badResponseError{err: errors.New("101 Switching Protocols to a POST")})
				return false
			}
			copy(u.buf, u.buf[end:u.rlen]) // an interim answer: the final head follows
			u.rlen -= end
			continue
		}
		u.head = append(u.head[:0], head...)
		u.headDone = true
		copy(u.buf, u.buf[end:u.rlen])
		u.rlen -= end
		c.dl = l.mono + int64(l.s.opts.StreamIdleTimeout)
		if u.framing == frLength && u.remain > l.s.opts.MaxResponseBytes {
			l.tooLarge(c)
			return false
		}
	}
	data := u.buf[:u.rlen]
	u.rlen = 0
	if len(u.buf) > evBufSize {
		u.buf = u.buf[:evBufSize:evBufSize] // a large head is in u.head now
	}
	done := false
	switch u.framing {
	case frLength:
		k := int64(len(data))
		if k >= u.remain {
			if k > u.remain {
				u.noReuse = true // bytes past the answer
			}
			k, done = u.remain, true
		}
		u.body = append(u.body, data[:k]...)
		u.remain -= k
	case frChunked:
		n, end, err := u.chunk.Feed(data, &u.body, 0, 0)
		if err != nil {
			l.failBody(c, false, errors.New("malformed chunked body")) // broken, as fasthttp's body reader says
			return false
		}
		if end && n < len(data) {
			u.noReuse = true
		}
		done = end
	case frClose:
		u.body = append(u.body, data...)
	}
	if int64(len(u.body)) > l.s.opts.MaxResponseBytes {
		l.tooLarge(c)
		return false
	}
	c.dl = l.mono + int64(l.s.opts.StreamIdleTimeout)
	if done {
		l.answered(c)
		return false
	}
	return true
}

func (l *evLoop) tooLarge(c *evConn) {
	s := l.s
	if u := c.up; u != nil {
		l.closeUp(u)
	}
	s.metrics.countUpstreamError(upErrTooLarge)
	l.answerError(c, fasthttp.StatusBadGateway, typeUpstream, "upstream_response_too_large",
		fmt.Sprintf("upstream response exceeds the limit of %d bytes", s.opts.MaxResponseBytes))
}

// headEnd returns the length of the head at b's start (through its empty
// line, CRLF or bare LF), -1 while it is not whole.
func headEnd(b []byte) int {
	i := 0
	for {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		line := b[i : i+j]
		i += j + 1
		if i > j+1 && (len(line) == 0 || len(line) == 1 && line[0] == '\r') {
			return i
		}
	}
}

// parseAnswerHead reads an answer's status line and framing into u; false
// for a head fasthttp would refuse (then repairFraming is tried).
func parseAnswerHead(u *evConn, head []byte) (int, bool) {
	line, rest := cutLine(head)
	status := statusOf(line)
	if status < 0 {
		return 0, false
	}
	u.status = status
	u.closeConn = line[7] == '0'
	cl, chunked, tes := int64(-1), false, 0
	for len(rest) > 0 {
		var hl []byte
		hl, rest = cutLine(rest)
		if len(hl) == 0 {
			break
		}
		k, v, ok := bytes.Cut(hl, []byte(":"))
		if !ok || !headerToken(k) || !headerValue(v) {
			return 0, false
		}
		v = bytes.Trim(v, " \t")
		switch {
		case foldEq(k, "Content-Length"):
			n, err := strconv.ParseInt(string(v), 10, 64)
			if cl >= 0 || err != nil || n < 0 || len(v) == 0 || v[0] == '+' {
				return 0, false
			}
			cl = n
		case foldEq(k, "Transfer-Encoding"):
			tes++
			chunked = foldEq(v, "chunked")
			if !chunked && !foldEq(v, "identity") {
				return 0, false
			}
		case foldEq(k, "Connection"):
			if listedIn(v, []byte("close")) {
				u.closeConn = true
			}
		}
	}
	if tes > 1 || chunked && cl >= 0 || tes == 1 && !chunked {
		return 0, false
	}
	switch {
	case status == 204 || status == 304 || status < 200:
		u.framing, u.remain = frLength, 0
	case chunked:
		u.framing = frChunked
	case cl >= 0:
		u.framing, u.remain = frLength, cl
	default:
		u.framing = frClose
	}
	return status, true
}

// statusOf returns the status of an HTTP/1.x status line, -1 when it is
// not one.
func statusOf(line []byte) int {
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ' ||
		len(line) > 12 && line[12] != ' ' {
		return -1
	}
	status := 0
	for _, ch := range line[9:12] {
		if ch < '0' || ch > '9' {
			return -1
		}
		status = status*10 + int(ch-'0')
	}
	if status < 100 {
		return -1
	}
	return status
}

// cutLine cuts b after its first line, without the line's end.
func cutLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return b, nil
	}
	line, rest = b[:i], b[i+1:]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, rest
}

// answered is the end of a whole answer: the engine hears it, the client's
// response is the answer's status, its end-to-end headers
// (copyResponseHeaders) and body with its length; the connection goes
// back to the pool when it may carry another.
func (l *evLoop) answered(c *evConn) {
	s := l.s
	u := c.up
	c.up, u.client = nil, nil
	out := l.statusLine(c.out[:0], u.status)
	_, rest := cutLine(u.head)
	var conn []byte
	for r := rest; len(r) > 0; {
		var hl []byte
		hl, r = cutLine(r)
		if k, v, ok := bytes.Cut(hl, []byte(":")); ok && foldEq(k, "Connection") {
			conn = bytes.Trim(v, " \t")
		}
	}
	for len(rest) > 0 {
		var hl []byte
		hl, rest = cutLine(rest)
		k, v, ok := bytes.Cut(hl, []byte(":"))
		if !ok || hopHeader(k) || listedIn(conn, k) || foldEq(k, "Content-Length") || foldEq(k, "Date") {
			continue
		}
		out = appendHeaderKey(out, k)
		out = append(out, ": "...)
		out = append(out, bytes.Trim(v, " \t")...)
		out = append(out, "\r\n"...)
	}
	if u.status != 204 && u.status != 304 { // bodiless: no length, as fasthttp writes them
		out = append(out, "Content-Length: "...)
		out = strconv.AppendInt(out, int64(len(u.body)), 10)
		out = append(out, "\r\n"...)
	}
	out = l.appendDate(out)
	if l.stopping || c.closing {
		out = append(out, "Connection: close\r\n"...)
	}
	out = append(out, "\r\n"...)
	out = append(out, u.body...)
	c.out = out
	s.metrics.ttfb[c.rt].observe(l.now.Sub(c.start))
	s.metrics.bytesOut.Add(uint64(len(u.body)))
	l.endRequest(c, u.status, u.body)
	if u.noReuse || u.closeConn || u.framing == frClose || u.rdhup || l.stopping || len(l.pool) >= s.opts.MaxIdleConnsPerHost {
		l.release(u)
	} else {
		u.idleSince = l.mono
		u.head, u.body = u.head[:0], u.body[:0]
		l.pool = append(l.pool, u)
	}
	l.startWrite(c)
}

// answerError answers c's request with an OpenAI-shaped error; the
// connection stays open.
func (l *evLoop) answerError(c *evConn, status int, typ, code, msg string) {
	c.out = l.errorResponse(c.out[:0], status, typ, code, msg, l.stopping || c.closing)
	_, body, _ := bytes.Cut(c.out, []byte("\r\n\r\n"))
	l.endRequest(c, status, body)
	l.startWrite(c)
}

// endRequest is a served request's end: the engine hears the answer, the
// metrics count it.
func (l *evLoop) endRequest(c *evConn, status int, body []byte) {
	s := l.s
	if ec := c.ec; ec != nil {
		c.ec = nil
		ec.resp = engine.Response{Status: status, Body: body}
		s.engine.After(context.Background(), &ec.req, &ec.resp)
	}
	s.metrics.inFlight.Add(-1)
	s.metrics.countRequest(c.rt, status, l.now.Sub(c.start))
	s.quiet.poke()
}

func (l *evLoop) startWrite(c *evConn) {
	c.sent = 0
	c.st = csWrite
	c.dl = l.mono + int64(l.s.opts.WriteTimeout)
	l.step(c)
}

func (l *evLoop) statusLine(dst []byte, status int) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	dst = append(dst, fasthttp.StatusMessage(status)...)
	return append(dst, "\r\n"...)
}

// errorResponse appends a whole error response as writeError writes it.
func (l *evLoop) errorResponse(dst []byte, status int, typ, code, msg string, closing bool) []byte {
	body := errorJSON(typ, code, msg)
	dst = l.statusLine(dst, status)
	dst = append(dst, "Content-Type: application/json\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n"...)
	dst = l.appendDate(dst)
	if closing {
		dst = append(dst, "Connection: close\r\n"...)
	}
	dst = append(dst, "\r\n"...)
	return append(dst, body...)
}

// appendDate appends a Date line, formatted once a second.
func (l *evLoop) appendDate(dst []byte) []byte {
	if sec := l.now.Unix(); sec != l.dateSec || l.date == nil {
		l.dateSec = sec
		l.date = append(append(append(l.date[:0], "Date: "...), l.now.UTC().Format(http.TimeFormat)...), "\r\n"...)
	}
	return append(dst, l.date...)
}

// appendHeaderKey appends k as fasthttp normalises a header name: a
// capital at the start and after each '-', the rest lower case.
func appendHeaderKey(dst, k []byte) []byte {
	up := true
	for _, ch := range k {
		switch {
		case up && 'a' <= ch && ch <= 'z':
			ch -= 'a' - 'A'
		case !up && 'A' <= ch && ch <= 'Z':
			ch += 'a' - 'A'
		}
		up = ch == '-'
		dst = append(dst, ch)
	}
	return dst
}
