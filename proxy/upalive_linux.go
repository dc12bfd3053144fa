//go:build linux

package proxy

import (
	"crypto/tls"
	"net"
	"syscall"

	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

// connProbe tells whether a pooled upstream connection is still open
// without reading from it: one recvfrom(MSG_PEEK|MSG_DONTWAIT) on its
// socket. EAGAIN means open and quiet; end of file means the upstream
// closed it; bytes waiting mean it sent something no request asked for;
// either way the connection is not used again. (It peeks through the
// poller's Control, not a Read: a read with a deadline already past
// returns without a system call.)
// The zero value, or one on a socket that cannot be peeked, says alive:
// roundTrip's retry on a fresh connection still covers it.
type connProbe struct {
	rc   syscall.RawConn
	peek func(fd uintptr) // made once, so a check allocates nothing
	dead bool
	b    [1]byte
}

func (p *connProbe) init(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	p.rc = rc
	p.peek = func(fd uintptr) {
		switch _, err := rawconn.Peek(fd, &p.b); {
		case err == syscall.EAGAIN || err == syscall.EINTR:
			p.dead = false
		default: // bytes waiting, end of file (0 bytes, no error) or an error
			p.dead = true
		}
	}
}

// alive reports whether the connection may carry a request.
func (p *connProbe) alive() bool {
	if p.rc == nil {
		return true
	}
	if err := p.rc.Control(p.peek); err != nil { // Control: a read deadline that passed does not matter to a peek
		return false
	}
	return !p.dead
}
