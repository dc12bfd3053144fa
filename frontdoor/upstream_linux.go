//go:build linux

package frontdoor

// An upstream connection of the event loop: the pool, the exchange of one
// client's request, and its answer read as the forward path's client reads
// it (answer.go): the head (RepairFraming where that client would), the
// body whole (chunked decoded, Lenient) within MaxAnswer.

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

// upstream is one upstream connection of the loop: pooled while idle,
// else serving one client's exchange.
type upstream struct {
	ready
	buf  []byte
	rlen int // bytes held in buf

	client    *client // whose exchange it carries; nil while idle
	reused    bool    // it came from the pool
	idleSince int64

	got      bool // a byte of the answer came
	headDone bool
	head     []byte     // the answer's head
	a        answerHead // what the head says
	remain   int64      // frLength: body bytes still to come
	chunk    Chunked    // frChunked: Lenient
	body     []byte     // the answer's body, decoded
	noReuse  bool       // bytes past the answer, or a close to come
}

func (l *Loop) newUpstream(fd int) *upstream {
	var u *upstream
	if n := len(l.freeU); n > 0 {
		u = l.freeU[n-1]
		l.freeU = l.freeU[:n-1]
	} else {
		u = &upstream{buf: make([]byte, loopBuf)}
	}
	*u = upstream{ready: ready{fd: fd}, buf: u.buf[:loopBuf:loopBuf], head: u.head[:0], body: u.body[:0]}
	return u
}

// releaseUp closes u's socket and keeps its buffers for the next one; a
// buffer grown for a large answer goes.
func (l *Loop) releaseUp(u *upstream) {
	_ = syscall.Close(u.fd)
	l.forget(u.fd)
	u.fd, u.client = -1, nil
	if cap(u.buf) > loopBuf { // grown for a large head
		u.buf = make([]byte, loopBuf)
	}
	if cap(u.body) > 64<<10 {
		u.body = nil
	}
	if cap(u.head) > 16<<10 {
		u.head = nil
	}
	l.freeU = append(l.freeU, u)
}

// closeUp closes the connection of an exchange.
func (l *Loop) closeUp(u *upstream) {
	if c := u.client; c != nil && c.up == u {
		c.up = nil
	}
	l.releaseUp(u)
}

// dropIdle closes a pooled connection.
func (l *Loop) dropIdle(u *upstream) {
	for i := len(l.pool) - 1; i >= 0; i-- {
		if l.pool[i] == u {
			copy(l.pool[i:], l.pool[i+1:])
			l.pool = l.pool[:len(l.pool)-1]
			break
		}
	}
	l.releaseUp(u)
}

// pooled keeps u for the next exchange when it may carry one, else closes
// it.
func (l *Loop) pooled(u *upstream) {
	if u.noReuse || u.a.close || u.a.framing == frClose || u.rdhup || l.stopping || len(l.pool) >= l.o.MaxIdleUpstream {
		l.releaseUp(u)
		return
	}
	u.idleSince = l.mono
	u.head, u.body = u.head[:0], u.body[:0]
	l.pool = append(l.pool, u)
}

// toUpstream sends c's request on a pooled connection, or a new one;
// false when the request ended at once.
func (l *Loop) toUpstream(c *client) bool {
	c.sent = 0
	c.dl = l.deadline(l.o.UpstreamTimeout)
	for n := len(l.pool); n > 0; n = len(l.pool) {
		u := l.pool[n-1]
		l.pool = l.pool[:n-1]
		if u.rdhup || l.mono-u.idleSince >= int64(l.o.UpstreamIdleTimeout) {
			l.releaseUp(u)
			continue
		}
		l.attach(c, u, true)
		c.st = csSend
		return true
	}
	return l.connect(c)
}

func (l *Loop) attach(c *client, u *upstream, reused bool) {
	u.client, c.up = c, u
	u.reused = reused
	u.rlen, u.got, u.headDone, u.noReuse = 0, false, false, false
	u.a, u.remain, u.chunk = answerHead{}, 0, Chunked{Lenient: true}
	u.head, u.body = u.head[:0], u.body[:0]
}

// connect starts a new upstream connection for c; false when it failed at
// once (the request ended).
func (l *Loop) connect(c *client) bool {
	dom := syscall.AF_INET
	if l.upV6 {
		dom = syscall.AF_INET6
	}
	fd, err := syscall.Socket(dom, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		l.upFailed(c, Failure{Kind: FailDial, Err: os.NewSyscallError("socket", err)})
		return false
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	err = syscall.Connect(fd, l.upAddr)
	if err != nil && !errors.Is(err, syscall.EINPROGRESS) {
		_ = syscall.Close(fd)
		l.upFailed(c, Failure{Kind: FailDial, Err: dialError(err)})
		return false
	}
	u := l.newUpstream(fd)
	if !l.register(fd, sock{kind: sockUpstream, u: u}) {
		l.freeU = append(l.freeU, u)
		l.upFailed(c, Failure{Kind: FailDial, Err: errors.New("epoll_ctl failed")})
		return false
	}
	l.attach(c, u, false)
	c.sent = 0
	c.dl = l.deadline(l.o.DialTimeout)
	c.st = csConnect
	if err == nil {
		u.writable = true
	}
	return true
}

func dialError(err error) error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", err)}
}

// connected moves c on once its new connection is up (writable), or fails
// its request.
func (l *Loop) connected(c *client) bool {
	u := c.up
	if !u.writable {
		return false
	}
	soerr, err := syscall.GetsockoptInt(u.fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
	if err == nil && soerr != 0 {
		err = syscall.Errno(soerr)
	}
	if err != nil {
		l.upFailed(c, Failure{Kind: FailDial, Err: dialError(err)})
		return false
	}
	c.st = csSend
	c.dl = l.deadline(l.o.UpstreamTimeout)
	return true
}

// send writes c's request upstream.
func (l *Loop) send(c *client) bool {
	if c.rdhup && l.clientGone(c) {
		return false
	}
	u := c.up
	if !u.writable {
		return false
	}
	n, e := rawconn.SysWrite(uintptr(u.fd), c.out[c.sent:])
	switch {
	case e == syscall.EAGAIN:
		u.writable = false
		return false
	case e == syscall.EINTR:
		return true
	case e != 0:
		l.upFailed(c, Failure{Kind: FailNoAnswer, Err: os.NewSyscallError("write", e)})
		return false
	}
	c.sent += n
	if c.sent < len(c.out) {
		u.writable = false
		return true
	}
	c.st = csAnswer
	return true
}

// receive reads the answer to c's request.
func (l *Loop) receive(c *client) bool {
	if c.rdhup && l.clientGone(c) {
		return false
	}
	u := c.up
	if !u.readable {
		return false
	}
	if u.rlen == len(u.buf) { // a head that does not fit yet
		if len(u.buf) >= MaxAnswerHead {
			l.upFailed(c, Failure{Kind: FailHeadTooLarge})
			return false
		}
		nb := make([]byte, min(2*len(u.buf), MaxAnswerHead))
		copy(nb, u.buf[:u.rlen])
		u.buf = nb
	}
	want := len(u.buf) - u.rlen
	n, e := rawconn.SysRead(uintptr(u.fd), u.buf[u.rlen:])
	switch {
	case e == syscall.EAGAIN:
		u.readable = false
		return false
	case e == syscall.EINTR:
		return true
	case e != 0 || n == 0:
		l.upEnded(c, e)
		return false
	}
	if n < want && !u.rdhup {
		u.readable = false
	}
	u.got = true
	u.rlen += n
	return l.onAnswer(c)
}

// onAnswer takes in the bytes read into c.up's buffer: the head once
// whole, then the body. False when c's request ended.
func (l *Loop) onAnswer(c *client) bool {
	u := c.up
	for !u.headDone {
		if n := min(u.rlen, len("HTTP/1.")); !bytes.Equal(u.buf[:n], []byte("HTTP/1.")[:n]) {
			l.upFailed(c, Failure{Kind: FailBadHead, Err: errors.New("not an HTTP/1.x response")})
			return false
		}
		if line, rest := cutAnswerLine(u.buf[:u.rlen]); rest != nil && statusOf(line) < 0 {
			l.upFailed(c, Failure{Kind: FailBadHead, Err: errors.New("malformed status line")})
			return false
		}
		end := answerHeadEnd(u.buf[:u.rlen])
		if end < 0 {
			return true
		}
		head := u.buf[:end]
		a, ok := readAnswerHead(head)
		if !ok {
			if fixed := RepairFraming(head); !bytes.Equal(fixed, head) {
				a, ok = readAnswerHead(fixed)
				head = fixed
			}
		}
		if !ok {
			l.upFailed(c, Failure{Kind: FailBadHead, Err: errors.New("malformed response head")})
			return false
		}
		if a.status >= 100 && a.status < 200 {
			if a.status == 101 {
				l.upFailed(c, Failure{Kind: FailBadHead, Err: errors.New("101 Switching Protocols to a request the loop serves")})
				return false
			}
			copy(u.buf, u.buf[end:u.rlen]) // an interim answer: the final head follows
			u.rlen -= end
			continue
		}
		u.head = append(u.head[:0], head...)
		u.a, u.remain = a, a.length
		u.headDone = true
		copy(u.buf, u.buf[end:u.rlen])
		u.rlen -= end
		c.dl = l.deadline(l.o.StreamIdleTimeout)
		if u.a.framing == frLength && u.remain > l.o.MaxAnswer {
			l.fail(c, Failure{Kind: FailTooLarge})
			return false
		}
	}
	data := u.buf[:u.rlen]
	u.rlen = 0
	if len(u.buf) > loopBuf {
		u.buf = u.buf[:loopBuf:loopBuf] // a large head is in u.head now
	}
	done := false
	switch u.a.framing {
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
			l.fail(c, Failure{Kind: FailBody, Err: errors.New("malformed chunked body")}) // broken, as fasthttp's body reader says
			return false
		}
		if end && n < len(data) {
			u.noReuse = true
		}
		done = end
	case frClose:
		u.body = append(u.body, data...)
	}
	if int64(len(u.body)) > l.o.MaxAnswer {
		l.fail(c, Failure{Kind: FailTooLarge})
		return false
	}
	c.dl = l.deadline(l.o.StreamIdleTimeout)
	if done {
		l.answered(c)
		return false
	}
	return true
}

// upEnded handles the upstream closing (e: the error, 0 for EOF) while c
// waits for its answer.
func (l *Loop) upEnded(c *client, e syscall.Errno) {
	u := c.up
	var err error = io.EOF
	if e != 0 {
		err = os.NewSyscallError("read", e)
	}
	switch {
	case !u.got:
		l.upFailed(c, Failure{Kind: FailNoAnswer, Err: err})
	case !u.headDone:
		l.upFailed(c, Failure{Kind: FailCutHead, Err: err})
	case u.a.framing == frClose && e == 0:
		u.noReuse = true
		l.answered(c)
	default:
		l.fail(c, Failure{Kind: FailBody, Err: err})
	}
}

// upFailed ends c's exchange that failed before an answer's head: sent
// once more on a fresh connection when a reused one failed before any
// byte of an answer (the rest of the pool goes too: its neighbours died
// with it), else failed.
func (l *Loop) upFailed(c *client, f Failure) {
	u := c.up
	if u != nil && u.reused && !u.got && !c.retried && f.Kind == FailNoAnswer {
		l.closeUp(u)
		for len(l.pool) > 0 {
			l.dropIdle(l.pool[len(l.pool)-1])
		}
		c.retried = true
		l.b.Retried()
		if l.connect(c) {
			l.step(c)
		}
		return
	}
	l.fail(c, f)
}
