//go:build linux

package frontdoor

// A client connection of the event loop: its request read through
// Head.Parse and admitted by the Backend, then sent upstream
// (upstream_linux.go), its answer written.

import (
	"strconv"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

// A client connection's states.
const (
	csHead    = iota // reading a request
	csConnect        // waiting for a new upstream connection
	csSend           // writing the request upstream
	csAnswer         // reading the upstream's answer
	csWrite          // writing the answer to the client
)

// client is one client connection of the loop.
type client struct {
	ready
	buf  []byte
	rlen int   // bytes held in buf
	dl   int64 // deadline, the loop's monotonic nanoseconds; 0: none
	st   uint8

	served  int     // requests answered on the connection; -1: close once the answer is written
	reqLen  int     // the current request's head and body; 0: head not read
	req     Request // the current request, as the Backend sees it
	started bool    // the Backend started req: End or Fail is due
	closing bool    // the client asked for Connection: close
	out     []byte  // the upstream request, then the answer
	sent    int
	retried bool
	up      *upstream // the exchange's connection, from csConnect to the answer
}

func (l *Loop) newClient(fd int) *client {
	var c *client
	if n := len(l.freeC); n > 0 {
		c = l.freeC[n-1]
		l.freeC = l.freeC[:n-1]
	} else {
		c = &client{buf: make([]byte, loopBuf)}
	}
	*c = client{ready: ready{fd: fd}, buf: c.buf[:loopBuf], out: c.out[:0], req: Request{Head: c.req.Head}}
	return c
}

// recycleClient keeps c's buffers for the next client; a buffer grown for
// a large request or answer goes.
func (l *Loop) recycleClient(c *client) {
	c.fd, c.up = -1, nil
	c.req = Request{Head: c.req.Head}
	if cap(c.buf) > loopBuf {
		c.buf = make([]byte, loopBuf)
	}
	if cap(c.out) > 64<<10 {
		c.out = nil
	}
	l.freeC = append(l.freeC, c)
}

func (l *Loop) closeClient(c *client) {
	if u := c.up; u != nil {
		l.closeUp(u)
	}
	_ = syscall.Close(c.fd)
	l.forget(c.fd)
	l.recycleClient(c)
}

// step advances client c, and its upstream exchange, as far as readiness
// allows.
func (l *Loop) step(c *client) {
	for {
		var more bool
		switch c.st {
		case csHead:
			more = l.readRequest(c)
		case csConnect:
			more = l.connected(c)
		case csSend:
			more = l.send(c)
		case csAnswer:
			more = l.receive(c)
		case csWrite:
			more = l.write(c)
		}
		if !more {
			return
		}
	}
}

// readRequest reads c's request until it is whole, then serves it; false
// when c waits for its socket, or was closed or handed over.
func (l *Loop) readRequest(c *client) bool {
	if c.rdhup && c.rlen == 0 && !c.readable {
		l.closeClient(c)
		return false
	}
	if c.reqLen == 0 && c.rlen > 0 {
		switch l.admitHead(c) {
		case headWait:
		case headServe:
		case headHandOver:
			l.handOver(c)
			return false
		}
	}
	if c.reqLen > 0 && c.rlen >= c.reqLen {
		return l.serve(c)
	}
	if !c.readable {
		return false
	}
	if c.rlen == len(c.buf) {
		if c.reqLen == 0 { // a head larger than the buffer: the server behind answers it
			l.handOver(c)
			return false
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
		return false
	case e == syscall.EINTR:
		return true
	case e != 0 || n == 0:
		l.closeClient(c)
		return false
	}
	if n < want && !c.rdhup {
		c.readable = false // drained: the next bytes come as a new edge
	}
	if c.rlen == 0 {
		c.dl = l.deadline(l.o.Front.ReadTimeout)
	}
	c.rlen += n
	return true
}

// What admitHead decided.
const (
	headWait     = iota // more bytes needed
	headServe           // c.reqLen is the request's length: the loop reads it whole
	headHandOver        // the server behind serves the connection from here
)

// admitHead reads the request head in c.buf through Parse, the reader of
// every Conn, and decides whether the loop reads the request whole. A head
// Parse refuses is handed over, to be refused there by the same reader.
// The loop itself takes only HTTP/1.1 requests whose body, if any, comes
// with a Content-Length within MaxBody and no 100-continue to answer;
// which of those it serves is the Backend's to say (Eligible). Parse has
// dropped the hop-by-hop fields, and those Connection lists, before the
// Backend reads any.
func (l *Loop) admitHead(c *client) int {
	b := c.buf[:c.rlen]
	r := &c.req
	h := &r.Head
	switch err := h.Parse(b, l.o.Front.Limits); {
	case err == ErrNeedMore:
		return headWait
	case err != nil:
		return headHandOver
	}
	if h.Minor != 1 || h.Framing == FrameChunked || h.Continue || h.Length > l.o.MaxBody {
		return headHandOver
	}
	r.Buf, r.Body, r.Route = b[:h.Len], nil, 0
	if !l.b.Eligible(r) {
		return headHandOver
	}
	c.closing = h.Close
	c.reqLen = h.Len + int(h.Length) // the buffer grows as the body comes, not on the length's word
	return headServe
}

// serve starts the whole request in c.buf[:c.reqLen] upstream, or hands
// the connection over; false when c was closed or handed over, or its
// request ended at once.
func (l *Loop) serve(c *client) bool {
	r := &c.req
	r.Buf = c.buf[:c.reqLen]
	r.Body = r.Buf[r.Head.Len:]
	r.Start = l.now
	r.Send, r.Uncompressed, r.Call = nil, false, nil
	if !l.b.Start(r) {
		l.handOver(c) // the Backend's own path answers it, from its first byte
		return false
	}
	c.started = true
	l.served.Add(1)
	if c.rdhup && l.clientGone(c) {
		return false
	}
	body := r.Send
	if body == nil {
		body = r.Body
	}
	c.out = l.appendUpstreamRequest(c.out[:0], r, body)
	c.retried = false
	return l.toUpstream(c)
}

// appendUpstreamRequest appends the request the upstream gets: the method,
// BasePath before the target, the upstream's Host, the end-to-end fields
// as Parse kept them (Accept-Encoding left out for an Uncompressed one),
// the body's length, the body.
func (l *Loop) appendUpstreamRequest(dst []byte, r *Request, body []byte) []byte {
	b, h := r.Buf, &r.Head
	dst = append(dst, h.Method(b)...)
	dst = append(dst, ' ')
	dst = append(dst, l.o.BasePath...)
	dst = append(dst, h.Target(b)...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, l.o.Host...)
	dst = append(dst, "\r\n"...)
	for i := range h.NumFields() {
		k, v := h.Field(b, i)
		if FoldEq(k, "Host") || r.Uncompressed && FoldEq(k, "Accept-Encoding") {
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

// write writes c's answer; once it is out, the connection waits for the
// next request (a pipelined one may be in c.buf already), or closes.
func (l *Loop) write(c *client) bool {
	if !c.writable {
		return false
	}
	n, e := rawconn.SysWrite(uintptr(c.fd), c.out[c.sent:])
	switch {
	case e == syscall.EAGAIN:
		c.writable = false
		return false
	case e == syscall.EINTR:
		return true
	case e != 0:
		l.closeClient(c)
		return false
	}
	c.sent += n
	if c.sent < len(c.out) {
		c.writable = false
		return false
	}
	if c.served < 0 || c.closing || l.stopping {
		l.closeClient(c)
		return false
	}
	c.served++
	left := c.rlen - c.reqLen
	copy(c.buf, c.buf[c.reqLen:c.rlen])
	c.rlen, c.reqLen, c.sent = left, 0, 0
	c.out = c.out[:0]
	c.st = csHead
	c.dl = l.deadline(l.o.IdleTimeout)
	if left > 0 {
		c.dl = l.deadline(l.o.Front.ReadTimeout)
	}
	return true
}

func (l *Loop) startWrite(c *client) {
	c.sent = 0
	c.st = csWrite
	c.dl = l.deadline(l.o.WriteTimeout)
	l.step(c)
}

// refuse answers e (Front.Reject) and closes the connection once it is
// written: a request not read within the read timeout.
func (l *Loop) refuse(c *client, e *Error) {
	if u := c.up; u != nil {
		l.closeUp(u)
	}
	c.out = l.o.Front.reject(c.out[:0], e)
	c.sent, c.reqLen, c.rlen = 0, 0, 0
	c.served = -1
	l.startWrite(c)
}

// end marks c's request ended: the Backend hears it once, at its End.
func (l *Loop) end(c *client) {
	c.started = false
	c.req.End = l.now
}

// answered ends c's request with the answer its upstream connection read:
// the Backend hears it, the client gets the answer's status, end-to-end
// fields and body with its length, and the connection goes back to the
// pool when it may carry another request.
func (l *Loop) answered(c *client) {
	u := c.up
	c.up, u.client = nil, nil
	out := appendStatusLine(c.out[:0], u.a.status)
	out = appendAnswerFields(out, u.head)
	if u.a.status != 204 && u.a.status != 304 { // bodiless: no length, as fasthttp writes them
		out = append(out, "Content-Length: "...)
		out = strconv.AppendInt(out, int64(len(u.body)), 10)
		out = append(out, "\r\n"...)
	}
	out = l.appendDate(out)
	if l.stopping || c.closing {
		out = append(out, "Connection: close\r\n"...)
	}
	out = append(out, "\r\n"...)
	c.out = append(out, u.body...)
	l.end(c)
	l.b.End(&c.req, u.a.status, u.body)
	l.pooled(u)
	l.startWrite(c)
}

// fail ends c's request with f: the Backend's error answer is written
// (the connection stays open, unless it was to close).
func (l *Loop) fail(c *client, f Failure) {
	if u := c.up; u != nil {
		l.closeUp(u)
	}
	l.end(c)
	status, body := l.b.Fail(&c.req, f)
	out := appendStatusLine(c.out[:0], status)
	out = append(out, "Content-Type: application/json\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(len(body)), 10)
	out = append(out, "\r\n"...)
	out = l.appendDate(out)
	if l.stopping || c.closing {
		out = append(out, "Connection: close\r\n"...)
	}
	out = append(out, "\r\n"...)
	c.out = append(out, body...)
	l.startWrite(c)
}

// clientGone ends c's request when its client went away (EPOLLRDHUP,
// confirmed by a peek): the Backend hears FailClientGone, the connections
// close. It returns true when c is gone.
func (l *Loop) clientGone(c *client) bool {
	var b [1]byte
	n, e := rawconn.Peek(uintptr(c.fd), &b)
	if e == 0 && n > 0 || e == syscall.EAGAIN {
		c.rdhup = e == 0 // a pipelined byte: the peek finds the end later
		return false
	}
	l.end(c)
	l.b.Fail(&c.req, Failure{Kind: FailClientGone})
	l.closeClient(c)
	return true
}

func appendStatusLine(dst []byte, status int) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	dst = append(dst, fasthttp.StatusMessage(status)...)
	return append(dst, "\r\n"...)
}

// httpDate is net/http's TimeFormat.
const httpDate = "Mon, 02 Jan 2006 15:04:05 GMT"

// appendDate appends a Date line, formatted once a second.
func (l *Loop) appendDate(dst []byte) []byte {
	if sec := l.now.Unix(); sec != l.dateSec || l.date == nil {
		l.dateSec = sec
		l.date = append(append(append(l.date[:0], "Date: "...), l.now.UTC().Format(httpDate)...), "\r\n"...)
	}
	return append(dst, l.date...)
}
