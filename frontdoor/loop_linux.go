//go:build linux

package frontdoor

// The event loop: one goroutine, locked to its OS thread, runs an
// edge-triggered epoll loop (nginx's worker, in Go) that owns the
// listening socket. It reads each request through Head.Parse and serves,
// without a goroutine or a clock reading of its own, the requests its
// Backend admits: the exchange with the upstream, the answer to the client.
// Any other request, or any doubt, hands its connection over for good
// (handOver), with the bytes already read, before anything of that
// request went upstream: the connection resumes in a Conn that the server
// behind the door accepts from the Loop (a net.Listener).
//
// This file holds the loop itself (its sockets, wake-ups, deadlines,
// shutdown and hand-over); client_linux.go a client connection's side
// (its request, its answer), upstream_linux.go an upstream connection's
// (the pool, the exchange, the answer read).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

const (
	loopBuf       = 16 << 10 // a connection's read buffer; a client's head must fit
	loopMaxEvents = 256
	loopTick      = 100 * time.Millisecond // how often deadlines are looked at

	evIn    = uint32(syscall.EPOLLIN)
	evOut   = uint32(syscall.EPOLLOUT)
	evErr   = uint32(syscall.EPOLLERR)
	evHup   = uint32(syscall.EPOLLHUP)
	evRdHup = uint32(syscall.EPOLLRDHUP)
	evET    = uint32(1) << 31
)

// Kinds of the loop's sockets.
const (
	sockFree = iota
	sockListener
	sockWake
	sockClient
	sockUpstream
)

// sock is what the loop keeps of one file descriptor: its kind, the
// generation of its registration (so an event of a closed socket whose
// descriptor came back is told apart), and the client or upstream
// connection it is.
type sock struct {
	gen  uint32
	kind uint8
	c    *client
	u    *upstream
}

// ready is a socket's readiness as its edge-triggered events left it
// (nginx's ready flags): set by an event, cleared by EAGAIN, a short read
// (unless the peer half-closed) or a short write. No read or write is
// made on a socket known not to be ready.
type ready struct {
	fd       int
	readable bool
	writable bool
	rdhup    bool // the peer half-closed, or the socket failed
}

func (r *ready) note(flags uint32) {
	if flags&(evIn|evErr|evHup|evRdHup) != 0 {
		r.readable = true
	}
	if flags&(evOut|evErr|evHup) != 0 {
		r.writable = true
	}
	if flags&(evRdHup|evHup|evErr) != 0 {
		r.rdhup = true
	}
}

// Loop is the front door's event loop on one listener. StartLoop starts
// it; Shutdown stops it. A Loop is also the net.Listener of the
// connections it hands over, each a *Conn: serve the server behind the
// door on it (its Close stops the hand-overs, not the loop).
type Loop struct {
	o      LoopOptions
	b      Backend
	ln     *net.TCPListener // the listener StartLoop was given; closed when the loop ends
	epfd   int
	lfd    int
	wakeR  int
	wakeW  int
	upAddr syscall.Sockaddr
	upV6   bool

	socks   []sock // by file descriptor
	freeC   []*client
	freeU   []*upstream
	pool    []*upstream // idle upstream connections, the last used last
	gen     uint32
	open    int // client and upstream sockets open
	clients int // client sockets open

	epoch   time.Time
	now     time.Time
	mono    int64 // now - epoch
	nextDL  int64 // when deadlines are looked at next
	accept  bool  // accept again at the next tick (out of descriptors)
	date    []byte
	dateSec int64

	// Shutdown: stopFlag is closed to begin it (no new connection, idle
	// ones closed), forceFlag to close everything; done when the loop
	// returned.
	stopOnce  sync.Once
	forceOnce sync.Once
	stopping  bool
	forcing   bool
	stopFlag  chan struct{}
	forceFlag chan struct{}
	done      chan struct{}

	// The hand-over: queue holds the connections handed over until the
	// server behind accepts them; closed ends Accept.
	queue     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once

	// served and handed count the requests the loop served and the
	// connections it handed over (Counts).
	served, handed atomic.Uint64
}

// StartLoop starts the event loop on ln: from here the loop accepts ln's
// connections and b decides which requests it serves. The server behind
// serves the rest on the returned Loop (a net.Listener).
func StartLoop(ln *net.TCPListener, o LoopOptions, b Backend) (*Loop, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	l := &Loop{o: o, b: b, ln: ln, epfd: -1, lfd: -1, wakeR: -1, wakeW: -1,
		socks: make([]sock, 256), epoch: time.Now(),
		stopFlag: make(chan struct{}), forceFlag: make(chan struct{}), done: make(chan struct{}),
		queue: make(chan net.Conn, 256), closed: make(chan struct{}),
	}
	up := o.Upstream.Addr().Unmap()
	if up.Is4() {
		l.upAddr = &syscall.SockaddrInet4{Port: int(o.Upstream.Port()), Addr: up.As4()}
	} else {
		l.upAddr = &syscall.SockaddrInet6{Port: int(o.Upstream.Port()), Addr: up.As16()}
		l.upV6 = true
	}
	if err := l.setup(); err != nil {
		l.closeFDs()
		return nil, err
	}
	go l.run()
	return l, nil
}

// setup makes the loop's descriptors: epoll, the wake pipe, a non-blocking
// dup of the listening socket.
func (l *Loop) setup() error {
	var err error
	if l.epfd, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("frontdoor: epoll_create1: %w", err)
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		return fmt.Errorf("frontdoor: pipe2: %w", err)
	}
	l.wakeR, l.wakeW = p[0], p[1]
	if !l.register(l.wakeR, sock{kind: sockWake}) {
		return errors.New("frontdoor: epoll_ctl: the wake pipe")
	}
	f, err := l.ln.File() // a dup of the listening socket, blocking
	if err != nil {
		return fmt.Errorf("frontdoor: listener: %w", err)
	}
	l.lfd, err = syscall.Dup(int(f.Fd()))
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("frontdoor: dup: %w", err)
	}
	syscall.CloseOnExec(l.lfd)
	if err := syscall.SetNonblock(l.lfd, true); err != nil {
		return fmt.Errorf("frontdoor: listener: %w", err)
	}
	if !l.register(l.lfd, sock{kind: sockListener}) {
		return errors.New("frontdoor: epoll_ctl: the listener")
	}
	return nil
}

func (l *Loop) closeFDs() {
	for _, fd := range []int{l.epfd, l.wakeR, l.wakeW, l.lfd} {
		if fd >= 0 {
			_ = syscall.Close(fd)
		}
	}
}

// Shutdown stops the loop: no new connection, idle ones closed, requests
// under way answered until ctx ends, then everything closed. It returns
// when the loop has returned.
func (l *Loop) Shutdown(ctx context.Context) {
	l.stopOnce.Do(func() { close(l.stopFlag); l.wake() })
	select {
	case <-l.done:
	case <-ctx.Done():
		l.forceOnce.Do(func() { close(l.forceFlag); l.wake() })
		<-l.done
	}
}

// Done is closed when the loop has returned.
func (l *Loop) Done() <-chan struct{} { return l.done }

// Counts returns how many requests the loop served and how many
// connections it handed over.
func (l *Loop) Counts() (served, handed uint64) { return l.served.Load(), l.handed.Load() }

// Accept returns the next connection the loop handed over.
func (l *Loop) Accept() (net.Conn, error) {
	select {
	case c := <-l.queue:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close ends Accept; the loop goes on until Shutdown.
func (l *Loop) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

// Addr is the listener's address.
func (l *Loop) Addr() net.Addr { return l.ln.Addr() }

func (l *Loop) wake() {
	one := [1]byte{1}
	_, _ = syscall.Write(l.wakeW, one[:])
}

// run is the loop's goroutine.
func (l *Loop) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(l.done)
	if err := l.loop(); err != nil {
		l.o.Logger.Error("event loop failed; its connections are closed", "err", err)
	}
	for fd := range l.socks {
		s := l.socks[fd]
		if s.kind == sockFree {
			continue
		}
		if s.kind == sockClient && s.c.started {
			l.end(s.c)
			l.b.Fail(&s.c.req, Failure{Kind: FailShutdown})
		}
		_ = syscall.Close(fd)
		l.socks[fd] = sock{}
	}
	l.lfd, l.wakeR = -1, -1 // closed with the sockets
	l.closeFDs()
	_ = l.ln.Close()
}

func (l *Loop) loop() error {
	events := make([]syscall.EpollEvent, loopMaxEvents)
	for {
		wait := -1 // no socket with a deadline: sleep until an event
		if l.accept || l.open > 0 {
			wait = int(loopTick / time.Millisecond)
		}
		n, err := syscall.EpollWait(l.epfd, events, wait)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return fmt.Errorf("frontdoor: epoll_wait: %w", err)
		}
		l.now = time.Now() // the one clock reading of this wake-up
		l.mono = int64(l.now.Sub(l.epoch))
		for i := range n {
			ev := &events[i]
			fd := int(ev.Fd)
			if fd >= len(l.socks) {
				continue
			}
			s := l.socks[fd]
			if s.kind == sockFree || s.gen != uint32(ev.Pad) {
				continue // an event of a closed socket
			}
			switch s.kind {
			case sockListener:
				l.acceptAll()
			case sockWake:
				l.drainWake()
			case sockClient:
				s.c.note(ev.Events)
				l.step(s.c)
			case sockUpstream:
				u := s.u
				u.note(ev.Events)
				switch {
				case u.client != nil:
					l.step(u.client)
				case u.rdhup || u.readable: // idle: the upstream closed it or sent what none asked for
					l.dropIdle(u)
				}
			}
		}
		if l.mono >= l.nextDL {
			l.nextDL = l.mono + int64(loopTick)
			l.expire()
		}
		if l.forcing || l.stopping && l.clients == 0 {
			return nil
		}
	}
}

// deadline is the loop's clock d from now; 0 (none) for d zero.
func (l *Loop) deadline(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return l.mono + int64(d)
}

func (l *Loop) drainWake() {
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
// upstream connection; the server behind hears of no more connections.
func (l *Loop) stopAccepting() {
	if l.lfd >= 0 && l.socks[l.lfd].kind == sockListener {
		_ = syscall.Close(l.lfd)
		l.socks[l.lfd] = sock{}
		l.lfd = -1
	}
	l.accept = false
	for _, s := range l.socks {
		if s.kind == sockClient && s.c.st == csHead && s.c.rlen == 0 {
			l.closeClient(s.c)
		}
	}
	for len(l.pool) > 0 {
		l.dropIdle(l.pool[len(l.pool)-1])
	}
}

// expire ends what waited past its deadline.
func (l *Loop) expire() {
	if l.accept {
		l.acceptAll()
	}
	for i := len(l.pool) - 1; i >= 0; i-- {
		if u := l.pool[i]; l.mono-u.idleSince >= int64(l.o.UpstreamIdleTimeout) {
			l.dropIdle(u)
		}
	}
	for i := range l.socks {
		s := l.socks[i]
		if s.kind != sockClient || s.c.dl == 0 || l.mono < s.c.dl {
			continue
		}
		c := s.c
		switch c.st {
		case csHead:
			if c.rlen == 0 {
				l.closeClient(c) // idle past IdleTimeout, or nothing sent within ReadTimeout
				continue
			}
			l.refuse(c, ErrTimeout)
		case csConnect:
			l.upFailed(c, Failure{Kind: FailDial, Err: os.ErrDeadlineExceeded})
		case csSend, csAnswer:
			if u := c.up; u != nil && u.headDone {
				l.fail(c, Failure{Kind: FailBodyTimeout, Err: os.ErrDeadlineExceeded})
			} else {
				l.upFailed(c, Failure{Kind: FailTimeout, Err: os.ErrDeadlineExceeded})
			}
		case csWrite:
			l.closeClient(c)
		}
	}
}

// register adds fd to the epoll set as s, with a new generation; false
// (fd closed) when epoll refuses it.
func (l *Loop) register(fd int, s sock) bool {
	l.gen++
	s.gen = l.gen
	for fd >= len(l.socks) {
		l.socks = append(l.socks, make([]sock, len(l.socks))...)
	}
	ev := syscall.EpollEvent{Events: evIn | evOut | evRdHup | evET, Fd: int32(fd), Pad: int32(s.gen)}
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		_ = syscall.Close(fd)
		return false
	}
	l.socks[fd] = s
	switch s.kind {
	case sockClient:
		l.open++
		l.clients++
	case sockUpstream:
		l.open++
	}
	return true
}

// forget takes fd out of the loop's table (and epoll's, with its close or
// EPOLL_CTL_DEL).
func (l *Loop) forget(fd int) {
	switch l.socks[fd].kind {
	case sockClient:
		l.open--
		l.clients--
	case sockUpstream:
		l.open--
	}
	l.socks[fd] = sock{}
}

func (l *Loop) acceptAll() {
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
			l.o.Logger.Warn("event loop: accept failed; trying again", "err", e)
			l.accept = true
			return
		}
		fd := int(nfd)
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		c := l.newClient(fd)
		if !l.register(fd, sock{kind: sockClient, c: c}) {
			l.recycleClient(c)
			continue
		}
		c.writable = true // a new socket has room; readability comes as an event
		c.dl = l.deadline(l.o.Front.ReadTimeout)
	}
}

// handOver gives c, with the bytes it read, to the server behind: its
// socket leaves the loop (EPOLL_CTL_DEL) and resumes in a Conn on Go's
// poller (net.FileConn's dup), which Accept returns.
func (l *Loop) handOver(c *client) {
	l.handed.Add(1)
	read := append([]byte(nil), c.buf[:c.rlen]...)
	fd := c.fd
	_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, fd, nil)
	l.forget(fd)
	l.recycleClient(c)
	f := os.NewFile(uintptr(fd), "")
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		l.o.Logger.Warn("event loop: handing a connection over failed", "err", err)
		return
	}
	c2 := Resume(rawconn.Server(nc), &l.o.Front, read)
	select { // never blocks the loop
	case l.queue <- c2:
	default:
		go func() {
			select {
			case l.queue <- c2:
			case <-l.closed:
				_ = c2.Close()
			}
		}()
	}
}
