//go:build linux

package main

// The event loop: one epoll instance on one locked OS thread, the
// listening socket and its accepts, the shutdown pipe, and the readiness
// each event brings to a connection (step, exchange.go, acts on it).

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"
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

func (s *server) printStats() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(os.Stderr, "evloop: %d requests, %d mallocs since last report, %d GCs, %d idle upstream conns\n",
		s.nreq, ms.Mallocs-s.mallocs0, ms.NumGC, len(s.pool))
	s.mallocs0 = ms.Mallocs
}
