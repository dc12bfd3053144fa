//go:build linux

package rawconn

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Conn reads and writes a TCP connection with raw system calls through
// its poller (syscall.RawConn): the same non-blocking read or write, the
// same wait for readiness, deadlines and Close as net.TCPConn, without
// the runtime's entry into a system call around each one. That entry is
// what costs on a proxy's two cores (make bench-proxy-wrk, docs/
// BENCHMARKS.md): when every P was idle, the first one wakes the runtime's
// monitor thread (a futex wake), which then polls every 20 µs for a
// millisecond (a nanosleep each), taking CPU from the proxy, its client
// and its upstream. A socket that never blocks (EAGAIN goes to the poller)
// gains nothing from that entry: the call returns in microseconds.
//
// One Read and one Write may run at a time (each keeps its state in the
// connection); every other method is net.TCPConn's. Built with the race
// detector, the calls are syscall's again (sys_race_linux.go), so it
// sees what they read and write and the order the socket gives.
type Conn struct {
	net.Conn
	tc *net.TCPConn
	rc syscall.RawConn
	r  rawOp
	w  rawOp

	// held are the bytes of writes held back (HoldWrites); the first
	// write after ReleaseHeld sends them with its own, in one call.
	held    []byte
	heldBuf *[]byte // held's pooled buffer
	holding bool
	// readSends: the next Read sends what was held, then waits for the
	// answer (SendOnRead); send is what that Read's first call has left
	// to write.
	readSends bool
	send      []byte
	sendErr   syscall.Errno

	// lazyDL: deadlines are kept as asked (rdl, wdl) and set on the socket
	// only when the one set there would fire late (LazyDeadline).
	lazyDL bool
	dlMu   sync.Mutex // rdl, rset, wdl, wset: a deadline may be set from another goroutine
	rdl    time.Time  // the read deadline asked for
	rset   time.Time  // the read deadline set on the socket
	wdl    time.Time
	wset   time.Time
}

// heldBufs are the buffers of held writes, pooled: a connection keeps one
// only while it holds bytes.
var heldBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// holdMax bounds what HoldWrites keeps back: a write that would pass it
// goes out at once, with what was held.
const holdMax = 64 << 10

// HoldWrites holds the writes that follow in the connection until the
// first one after ReleaseHeld, which carries them all in one system call.
// The proxy's relay holds a stream's last bytes this way: fasthttp writes the last
// chunk, then its terminator, then the final CRLF, each flushed on its
// own, and each would wake the client. fasthttp flushes that CRLF as soon
// as the response is written, unless the client pipelined its next request
// (then with that one's first write, as it did the CRLF before: the
// proxy's TestPipelinedStreamsStayWhole).
func (c *Conn) HoldWrites() { c.holding = true }

// ReleaseHeld lets the next write send what was held, before its own bytes.
func (c *Conn) ReleaseHeld() { c.holding = false }

// SendOnRead holds the writes that follow until the next Read, which
// sends them and then waits for the socket to be readable without first
// trying a read that would find nothing: the upstream's answer cannot be
// there before its request was sent. That saves one read(2), EAGAIN, per
// exchange (make bench-proxy-wrk). The send happens inside the Read's
// poller call, after the poller forgot older readiness, so an answer
// arriving at any point after it wakes the Read. Only for a peer that
// speaks when spoken to, on a connection whose earlier answers were read
// to their end (a pooled upstream connection, checked by its peek): bytes
// already waiting would not be read until more came; and no Write may run
// beside that Read, which writes. Writes go on as they came when they pass
// holdMax, or the send finds the socket's buffer full.
func (c *Conn) SendOnRead() { c.holding, c.readSends = true, true }

// rawOp is one Read's or Write's state, and the function the poller calls
// with the socket, made once per connection so a call allocates nothing.
type rawOp struct {
	p   []byte
	n   int
	err syscall.Errno
	fn  func(fd uintptr) bool
}

// New returns c with raw reads and writes when it is a TCP
// connection, else c.
func New(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	x := &Conn{Conn: c, tc: tc, rc: rc}
	x.r.fn = func(fd uintptr) bool {
		if x.send != nil {
			for len(x.send) > 0 {
				n, e := SysWrite(fd, x.send)
				switch e {
				case 0:
					x.send = x.send[n:]
				case syscall.EINTR:
				case syscall.EAGAIN:
					return true // Read sends the rest as Write would
				default:
					x.sendErr = e
					return true
				}
			}
			x.send = nil
			return false // the poller waits for the answer
		}
		for {
			n, e := SysRead(fd, x.r.p)
			switch e {
			case 0:
				x.r.n = n
				return true
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // the poller waits for the socket to be readable
			}
			x.r.err = e
			return true
		}
	}
	x.w.fn = func(fd uintptr) bool {
		for x.w.n < len(x.w.p) {
			rest := x.w.p[x.w.n:]
			n, e := SysWrite(fd, rest)
			switch e {
			case 0:
				x.w.n += n
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // the poller waits for room in the socket's buffer
			default:
				x.w.err = e
				return true
			}
		}
		return true
	}
	return x
}

func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.readSends {
		if n, err := c.sendThenRead(p); n > 0 || err != nil {
			return n, err
		}
	}
	c.r.p, c.r.n, c.r.err = p, 0, 0
	err := c.rc.Read(c.r.fn)
	for err != nil && c.rearm(err, false) {
		err = c.rc.Read(c.r.fn)
	}
	n, errno := c.r.n, c.r.err
	c.r.p = nil
	switch {
	case err != nil: // the poller's: a deadline, or the connection closed
		return 0, err
	case errno != 0:
		return 0, c.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// sendThenRead is Read after SendOnRead: the held bytes are sent in the
// poller call of the read that waits for their answer. It returns 0, nil
// when nothing was held, or the send stopped short and the rest went out
// as Write sends it: Read reads as usual then.
func (c *Conn) sendThenRead(p []byte) (int, error) {
	c.readSends, c.holding = false, false
	if len(c.held) == 0 {
		return 0, nil
	}
	c.send, c.sendErr = c.held, 0
	c.r.p, c.r.n, c.r.err = p, 0, 0
	err := c.rc.Read(c.r.fn)
	for err != nil && c.sendErr == 0 && c.rearm(err, false) {
		err = c.rc.Read(c.r.fn)
	}
	n, errno, rest, werr := c.r.n, c.r.err, c.send, c.sendErr
	c.r.p, c.send, c.sendErr = nil, nil, 0
	switch {
	case werr != 0:
		err = c.opError("write", werr)
	case len(rest) > 0 && err == nil:
		_, err = c.write(rest)
	}
	c.putHeld()
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, c.opError("read", errno)
	case n == 0 && len(rest) == 0:
		return 0, io.EOF
	}
	return n, nil
}

// putHeld returns the buffer of held writes to its pool.
func (c *Conn) putHeld() {
	if cap(c.held) <= 2*holdMax {
		*c.heldBuf = c.held[:0]
		heldBufs.Put(c.heldBuf)
	}
	c.held, c.heldBuf = nil, nil
}

func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.holding || len(c.held) > 0 {
		if c.held == nil {
			c.heldBuf = heldBufs.Get().(*[]byte)
			c.held = (*c.heldBuf)[:0]
		}
		if c.holding && len(c.held)+len(p) <= holdMax {
			c.held = append(c.held, p...)
			return len(p), nil
		}
		c.holding, c.readSends = false, false
		held := len(c.held)
		c.held = append(c.held, p...)
		n, err := c.write(c.held)
		c.putHeld()
		return max(n-held, 0), err
	}
	return c.write(p)
}

func (c *Conn) write(p []byte) (int, error) {
	c.w.p, c.w.n, c.w.err = p, 0, 0
	err := c.rc.Write(c.w.fn)
	for err != nil && c.rearm(err, true) {
		err = c.rc.Write(c.w.fn)
	}
	n, errno := c.w.n, c.w.err
	c.w.p = nil
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, c.opError("write", errno)
	}
	return n, nil
}

// lazyDeadline: a server connection's deadlines move on with each request
// (fasthttp sets the read deadline twice and the write deadline once per
// request, each a timer update in the runtime: 2% of the pass-through
// path's CPU, make bench-proxy-wrk). A lazy connection sets a deadline on
// its socket only when the one set there would fire after it; one that
// fires before the deadline asked for wakes the waiting Read or Write,
// which sets the deadline asked for and waits again (rearm). So a deadline
// never fires late, and a connection serving one request after another
// sets each deadline about once per timeout instead of once per request.
func (c *Conn) LazyDeadline() { c.lazyDL = true }

func (c *Conn) SetDeadline(t time.Time) error {
	if !c.lazyDL {
		return c.Conn.SetDeadline(t)
	}
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	if !c.lazyDL {
		return c.Conn.SetReadDeadline(t)
	}
	return c.setDeadline(&c.rdl, &c.rset, t, c.Conn.SetReadDeadline)
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	if !c.lazyDL {
		return c.Conn.SetWriteDeadline(t)
	}
	return c.setDeadline(&c.wdl, &c.wset, t, c.Conn.SetWriteDeadline)
}

// setDeadline records t as the deadline asked for and sets it on the
// socket unless the one set there fires no later (a zero t is always set,
// as is any deadline when none is set).
func (c *Conn) setDeadline(asked, set *time.Time, t time.Time, apply func(time.Time) error) error {
	c.dlMu.Lock()
	*asked = t
	if !t.IsZero() && !set.IsZero() && !set.After(t) {
		c.dlMu.Unlock()
		return nil
	}
	if set.Equal(t) { // both zero
		c.dlMu.Unlock()
		return nil
	}
	*set = t
	err := apply(t)
	c.dlMu.Unlock()
	return err
}

// rearm reports whether a Read (write: a Write) that failed with err must
// wait again: the deadline set on the socket passed before the one asked
// for, which is then set.
func (c *Conn) rearm(err error, write bool) bool {
	if !c.lazyDL || !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	asked, set, apply := &c.rdl, &c.rset, c.Conn.SetReadDeadline
	if write {
		asked, set, apply = &c.wdl, &c.wset, c.Conn.SetWriteDeadline
	}
	c.dlMu.Lock()
	defer c.dlMu.Unlock()
	t := *asked
	if !t.IsZero() && !time.Now().Before(t) || set.Equal(t) {
		return false // the deadline asked for passed
	}
	*set = t
	return apply(t) == nil
}

// opError is the error net.TCPConn returns for a failed call.
func (c *Conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}

// SyscallConn is the connection's own: a peek at its socket (the proxy's
// client-gone watch, its pooled connections' check) works as on any TCP
// connection.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// CloseWrite half-closes, as net.TCPConn's.
func (c *Conn) CloseWrite() error { return c.tc.CloseWrite() }

// Server is New(c) with lazy deadlines (LazyDeadline): a server's
// connection, whose deadlines move on with each request.
func Server(c net.Conn) net.Conn {
	c = New(c)
	if rc, ok := c.(*Conn); ok {
		rc.LazyDeadline()
	}
	return c
}

// Peek is recvfrom(MSG_PEEK|MSG_DONTWAIT) of one byte as a raw system
// call (see Conn): 1 when a byte waits, 0 at the end of the stream,
// errno EAGAIN when the socket is open and quiet.
func Peek(fd uintptr, b *[1]byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return int(n), e
}
