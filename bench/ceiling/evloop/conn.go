//go:build linux

package main

// A connection, client or upstream: its state, its recycling through the
// free list and the idle pool, its closing, and the raw system calls that
// read and write it.

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// client states
const (
	stHead    = iota // reading / parsing the request
	stConnect        // waiting for a new upstream connection to complete
	stSend           // writing the request to the upstream
	stResp           // relaying the response to the client
)

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
