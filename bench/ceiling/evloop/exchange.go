//go:build linux

package main

// One request's exchange: step moves a client (and its upstream) through
// its states as far as readiness allows; dispatch, connectUp and retry
// give the request an upstream connection; finish ends the exchange.

import (
	"fmt"
	"os"
	"syscall"
)

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
