package frontdoor

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

// Options configure the connections of a Listener (or made by NewConn).
// Every zero value is a documented default; nothing is refused. NewListener
// applies EnsureDefaults; a Conn made by NewConn or Resume reads o as
// given, its zero fields taking the same defaults.
type Options struct {
	// Limits bound each request (Parse's).
	Limits Limits
	// ReadTimeout bounds reading a request's head, and a chunked body,
	// from its first byte (408 past it). Zero: none.
	ReadTimeout time.Duration
	// Reject renders the whole HTTP response to a refused request,
	// appended to dst; it must say Connection: close and must not quote
	// the request. Nil: a plain JSON error (PlainReject).
	Reject func(dst []byte, e *Error) []byte
	// Linger bounds how long a refused connection's unread bytes are read
	// and dropped before it closes, so that its close is not a reset that
	// destroys the answer before the client reads it (nginx's lingering
	// close). Zero: DefaultLinger; negative: no lingering.
	Linger time.Duration
}

// DefaultLinger is Options.Linger's default.
const DefaultLinger = 2 * time.Second

// EnsureDefaults fills every zero field with its documented default and
// returns o. NewListener calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	o.Limits.EnsureDefaults()
	if o.Linger == 0 {
		o.Linger = DefaultLinger
	}
	return o
}

// reject renders the answer to e (Reject, else PlainReject).
func (o *Options) reject(dst []byte, e *Error) []byte {
	if o.Reject == nil {
		return PlainReject(dst, e)
	}
	return o.Reject(dst, e)
}

// PlainReject renders e as a JSON error with Connection: close.
func PlainReject(dst []byte, e *Error) []byte {
	body := `{"error":{"message":` + strconv.Quote(e.Msg) + `,"type":"invalid_request_error","param":null,"code":` + strconv.Quote(e.Code) + `}}`
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(e.Status), 10)
	dst = append(dst, ' ')
	dst = append(dst, StatusText(e.Status)...)
	dst = append(dst, "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n\r\n"...)
	return append(dst, body...)
}

// StatusText is the reason phrase of the statuses the front door answers.
func StatusText(status int) string {
	switch status {
	case 400:
		return "Bad Request"
	case 408:
		return "Request Timeout"
	case 413:
		return "Request Entity Too Large"
	case 414:
		return "Request-URI Too Long"
	case 431:
		return "Request Header Fields Too Large"
	}
	return "Error"
}

// Listener is a net.Listener whose connections are Conns over raw system
// calls (rawconn.Server: a TCP connection's reads and writes skip the
// runtime's system-call entry, its deadlines are lazy).
type Listener struct {
	net.Listener
	opts Options
}

// NewListener wraps ln: every connection it accepts goes through the front
// door.
func NewListener(ln net.Listener, opts Options) *Listener {
	opts.EnsureDefaults()
	return &Listener{Listener: ln, opts: opts}
}

// Accept returns the next connection as a Conn.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return NewConn(rawconn.Server(c), &l.opts), nil
}

// Conn is a client connection read through the front door: its Read
// returns the requests the client sent, one at a time, each in canonical
// form — "METHOD target HTTP/1.x", the end-to-end field lines as sent (one
// space after the colon, values trimmed), "Connection: close" or
// "keep-alive" where it applies, the body's "Content-Length" (a chunked body
// arrives decoded, its trailer dropped), an empty line, the body — so the
// HTTP server reading it has nothing to decide that the front door did not
// decide first. A Read never returns bytes of two requests, and the next
// request is read from the client only once the one before it was read
// whole: a server that flushes its answers when its read buffer is empty
// (fasthttp) writes each answer before it waits on the next request.
//
// A request the front door refuses is answered on the connection itself
// (Options.Reject) and ends it: Read returns io.EOF. So does a client that
// sends nothing more, or leaves within a request; a request not read
// within Options.ReadTimeout of its first byte is answered 408.
//
// Writes, deadlines and Close are the connection's own. One Read at a time.
type Conn struct {
	net.Conn
	o *Options

	buf  []byte // bytes read from the client; buf[r:w] not yet taken
	r, w int

	head  Head
	out   []byte // the canonical head, then a decoded chunked body
	outAt int
	body  int64 // bytes of a Content-Length body still to pass
	chunk Chunked
	dec   []byte // a chunked body, decoded
	inReq bool   // a request's first byte was read, not its last
	err   error  // sticky: after a refusal
}

// NewConn reads c through the front door.
func NewConn(c net.Conn, o *Options) *Conn {
	return &Conn{Conn: c, o: o}
}

// Resume reads c through the front door when read holds bytes already read
// from it (the event loop's hand-over): they are the start of what Read
// parses. Resume keeps read.
func Resume(c net.Conn, o *Options, read []byte) *Conn {
	return &Conn{Conn: c, o: o, buf: read, w: len(read)}
}

// Unwrap returns the client connection.
func (c *Conn) Unwrap() net.Conn { return c.Conn }

// SyscallConn is the client connection's, when it has one.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// CloseWrite half-closes the client connection, when it can.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

const initialBuf = 4 << 10

// Read returns the bytes of the current request, or reads the next one.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.outAt < len(c.out) {
		n := copy(p, c.out[c.outAt:])
		c.outAt += n
		return n, nil
	}
	if c.body > 0 {
		p = p[:min(int64(len(p)), c.body)]
		if c.w > c.r {
			n := copy(p, c.buf[c.r:c.w])
			c.r += n
			c.body -= int64(n)
			return n, nil
		}
		n, err := c.Conn.Read(p)
		c.body -= int64(n)
		return n, err
	}
	if c.err != nil {
		return 0, c.err
	}
	if err := c.next(); err != nil {
		return 0, err
	}
	n := copy(p, c.out)
	c.outAt = n
	return n, nil
}

// next reads the next request into out (its head, and a chunked body
// decoded) and body (a length to pass).
func (c *Conn) next() error {
	c.out, c.outAt = c.out[:0], 0
	lim := c.o.Limits
	lim.EnsureDefaults()
	c.inReq = false
	if c.w > c.r { // a pipelined request's first bytes came with the last one's
		c.startRequest()
	}
	for {
		if c.w > c.r {
			err := c.head.Parse(c.buf[c.r:c.w], lim)
			if err == nil {
				break
			}
			if err != ErrNeedMore {
				return c.refuse(err)
			}
		}
		if err := c.fill(lim.MaxHead + lim.MaxLine); err != nil {
			return err
		}
	}
	h := &c.head
	b := c.buf[c.r:c.w]
	c.out = appendCanonical(c.out, h, b)
	c.r += h.Len
	if h.Continue && (h.Framing == FrameChunked || int64(c.w-c.r) < h.Length) {
		if _, err := c.Conn.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
			c.err = io.EOF
			return c.err
		}
	}
	switch h.Framing {
	case FrameLength:
		c.out = appendLength(c.out, h.Length)
		c.body = h.Length
	case FrameChunked:
		c.chunk.Reset()
		c.dec = c.dec[:0]
		for {
			n, done, err := c.chunk.Feed(c.buf[c.r:c.w], &c.dec, lim.MaxBody, lim.MaxLine)
			c.r += n
			if err != nil {
				return c.refuse(err)
			}
			if done {
				break
			}
			if err := c.fill(initialBuf); err != nil {
				return err
			}
		}
		c.out = appendLength(c.out, int64(len(c.dec)))
		c.out = append(c.out, c.dec...)
		if cap(c.dec) > 64<<10 {
			c.dec = nil
		}
	default:
		c.out = append(c.out, "\r\n"...)
	}
	c.inReq = false
	return nil
}

// startRequest marks a request's first byte: the read timeout runs from
// here.
func (c *Conn) startRequest() {
	c.inReq = true
	if c.o.ReadTimeout > 0 {
		_ = c.Conn.SetReadDeadline(time.Now().Add(c.o.ReadTimeout))
	}
}

// fill reads more of the client's bytes into buf, which grows up to max.
// Within a request it is answered 408 past the read timeout; before a
// request's first byte, and when the client leaves, fill returns io.EOF.
func (c *Conn) fill(limit int) error {
	if c.r > 0 {
		c.w = copy(c.buf, c.buf[c.r:c.w])
		c.r = 0
	}
	if c.w == len(c.buf) {
		n := max(2*len(c.buf), initialBuf)
		if n > limit {
			n = len(c.buf) + initialBuf // Parse and Feed refuse before this goes far
		}
		nb := make([]byte, n)
		copy(nb, c.buf[:c.w])
		c.buf = nb
	}
	n, err := c.Conn.Read(c.buf[c.w:])
	if n > 0 {
		if !c.inReq {
			c.startRequest()
		}
		c.w += n
		return nil
	}
	if err == nil {
		return nil
	}
	if c.inReq && isTimeout(err) {
		return c.refuse(ErrTimeout)
	}
	c.err = io.EOF
	return c.err
}

// refuse answers e and ends the connection.
func (c *Conn) refuse(e error) error {
	fe, ok := e.(*Error)
	if !ok {
		fe = errBadRequest("the request could not be read")
	}
	c.err = io.EOF
	c.out, c.outAt, c.body = c.out[:0], 0, 0
	if _, err := c.Conn.Write(c.o.reject(nil, fe)); err != nil {
		return c.err
	}
	c.linger()
	return c.err
}

// linger half-closes the connection and reads what the client still sends,
// for at most Options.Linger, so that the close that follows does not
// reset the connection under the answer.
func (c *Conn) linger() {
	d := c.o.Linger
	if d < 0 {
		return
	}
	if d == 0 {
		d = DefaultLinger
	}
	if c.CloseWrite() != nil {
		return
	}
	_ = c.Conn.SetReadDeadline(time.Now().Add(d))
	b := c.buf[:cap(c.buf)]
	if len(b) == 0 {
		b = make([]byte, initialBuf)
	}
	for total := 0; total < 1<<20; {
		n, err := c.Conn.Read(b)
		total += n
		if err != nil {
			return
		}
	}
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &te) && te.Timeout()
}

// appendCanonical appends the request line and end-to-end field lines of
// h, and the Connection field the server must honour.
func appendCanonical(dst []byte, h *Head, b []byte) []byte {
	dst = append(dst, h.Method(b)...)
	dst = append(dst, ' ')
	dst = append(dst, h.Target(b)...)
	if h.Minor == 1 {
		dst = append(dst, " HTTP/1.1\r\n"...)
	} else {
		dst = append(dst, " HTTP/1.0\r\n"...)
	}
	for i := range h.NumFields() {
		k, v := h.Field(b, i)
		dst = append(dst, k...)
		dst = append(dst, ": "...)
		if bytes.IndexByte(v, '%') >= 0 && FoldEq(k, "Host") {
			// nginx lets "%" by in a Host; fasthttp unescapes the host
			// and refuses a bad escape: it reads this one back as sent.
			dst = append(dst, bytes.ReplaceAll(v, []byte("%"), []byte("%25"))...)
		} else {
			dst = append(dst, v...)
		}
		dst = append(dst, "\r\n"...)
	}
	switch {
	case h.Close && h.Minor == 1:
		dst = append(dst, "Connection: close\r\n"...)
	case !h.Close && h.Minor == 0:
		dst = append(dst, "Connection: keep-alive\r\n"...)
	}
	return dst
}

// appendLength appends the Content-Length line and the head's end.
func appendLength(dst []byte, n int64) []byte {
	dst = append(dst, "Content-Length: "...)
	dst = strconv.AppendInt(dst, n, 10)
	return append(dst, "\r\n\r\n"...)
}
