package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// upClient is the pooled HTTP/1.1 client to the one upstream. It is built on
// fasthttp's request writer and response parser but owns its connections, so
// a request can be cancelled at any point by closing its connection (a
// client that went away must not keep the LLM generating), and every body
// read gets its own idle deadline. net/http does the same with two
// goroutines per connection; this costs none (see BenchmarkProxyChat).
type upClient struct {
	addr        string // host:port
	tls         *tls.Config
	dialTimeout time.Duration
	maxIdle     int
	idleFor     time.Duration

	// mu protects the fields below.
	mu     sync.Mutex
	idle   []*upConn // most recently used last
	closed bool
}

// upConn is one upstream connection with its buffers.
type upConn struct {
	c        net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	lastUsed time.Time
}

func (u *upClient) dial() (*upConn, error) {
	d := net.Dialer{Timeout: u.dialTimeout, KeepAlive: 30 * time.Second}
	var c net.Conn
	var err error
	if u.tls != nil {
		c, err = (&tls.Dialer{NetDialer: &d, Config: u.tls}).Dial("tcp", u.addr)
	} else {
		c, err = d.Dial("tcp", u.addr)
	}
	if err != nil {
		return nil, err
	}
	return &upConn{c: c, br: bufio.NewReaderSize(c, 32<<10), bw: bufio.NewWriterSize(c, 32<<10)}, nil
}

// get returns an idle connection (reused true) or a new one.
func (u *upClient) get() (uc *upConn, reused bool, err error) {
	now := time.Now()
	u.mu.Lock()
	for len(u.idle) > 0 {
		uc = u.idle[len(u.idle)-1]
		u.idle = u.idle[:len(u.idle)-1]
		if now.Sub(uc.lastUsed) < u.idleFor {
			u.mu.Unlock()
			return uc, true, nil
		}
		_ = uc.c.Close()
	}
	u.mu.Unlock()
	uc, err = u.dial()
	return uc, false, err
}

// put returns a connection whose response was read to its end.
func (u *upClient) put(uc *upConn) {
	uc.lastUsed = time.Now()
	_ = uc.c.SetDeadline(time.Time{})
	u.mu.Lock()
	if u.closed || len(u.idle) >= u.maxIdle {
		u.mu.Unlock()
		_ = uc.c.Close()
		return
	}
	u.idle = append(u.idle, uc)
	u.mu.Unlock()
}

// closeIdle closes pooled connections; with final, later puts close too.
func (u *upClient) closeIdle(final bool) {
	u.mu.Lock()
	idle := u.idle
	u.idle = nil
	u.closed = u.closed || final
	u.mu.Unlock()
	for _, uc := range idle {
		_ = uc.c.Close()
	}
}

// cancelSlot lets another goroutine abort a request at any time by closing
// the connection it runs on. The zero value is ready.
type cancelSlot struct {
	// mu protects the fields below.
	mu        sync.Mutex
	conn      net.Conn
	cancelled bool
}

// attach makes c the connection to close on cancel; false if already
// cancelled (c is closed then).
func (s *cancelSlot) attach(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancelled {
		_ = c.Close()
		return false
	}
	s.conn = c
	return true
}

func (s *cancelSlot) cancel() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelled = true
	if s.conn != nil {
		_ = s.conn.Close()
	}
}

func (s *cancelSlot) isCancelled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancelled
}

// errCancelled reports a request aborted through its cancelSlot.
var errCancelled = errors.New("proxy: upstream request cancelled")

// roundTrip writes req and reads the response head into resp, whose body is
// then resp.BodyStream(), read through upBody. A stale pooled connection (the
// upstream closed it while idle) is retried once on a fresh one.
func (u *upClient) roundTrip(req *fasthttp.Request, resp *fasthttp.Response, headerTimeout, writeTimeout time.Duration, slot *cancelSlot) (*upConn, error) {
	for attempt := 0; ; attempt++ {
		uc, reused, err := u.get()
		if err != nil {
			return nil, err
		}
		if !slot.attach(uc.c) {
			return nil, errCancelled
		}
		err = u.exchange(uc, req, resp, headerTimeout, writeTimeout)
		if err == nil {
			return uc, nil
		}
		_ = uc.c.Close()
		if slot.isCancelled() {
			return nil, errCancelled
		}
		if !reused || attempt > 0 || !staleConnError(err) {
			return nil, err
		}
	}
}

func (u *upClient) exchange(uc *upConn, req *fasthttp.Request, resp *fasthttp.Response, headerTimeout, writeTimeout time.Duration) error {
	now := time.Now()
	if writeTimeout > 0 {
		_ = uc.c.SetWriteDeadline(now.Add(writeTimeout))
	}
	if err := req.Write(uc.bw); err != nil {
		return err
	}
	if err := uc.bw.Flush(); err != nil {
		return err
	}
	if headerTimeout > 0 {
		_ = uc.c.SetReadDeadline(time.Now().Add(headerTimeout))
	}
	resp.StreamBody = true
	resp.SkipBody = req.Header.IsHead() // a HEAD answer has no body, whatever its Content-Length
	return resp.Read(uc.br)
}

// staleConnError reports errors that mean a pooled connection was already
// closed by the upstream before it read the request.
func staleConnError(err error) bool {
	var nothing fasthttp.ErrNothingRead
	return errors.As(err, &nothing) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// upBody reads an upstream response body with an idle deadline per read and
// returns the connection to the pool once the body was read to its end.
type upBody struct {
	u      *upClient
	uc     *upConn
	r      io.Reader
	idle   time.Duration
	eof    bool
	done   bool
	slot   *cancelSlot
	resp   *fasthttp.Response
	reuse  bool // the response allows keep-alive
	timedO bool // a read hit the idle deadline
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.eof || b.r == nil { // nil: a response without a body (HEAD)
		b.eof = true
		return 0, io.EOF
	}
	if b.idle > 0 {
		_ = b.uc.c.SetReadDeadline(time.Now().Add(b.idle))
	}
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
		return n, io.EOF
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			b.timedO = true
		}
		if b.slot.isCancelled() {
			err = errCancelled
		}
	}
	return n, err
}

// Close releases the body: the connection goes back to the pool only after
// a clean end of body, else it is closed. Safe to call more than once.
func (b *upBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	clean := b.eof && b.reuse && !b.slot.isCancelled()
	if !clean {
		_ = b.uc.c.Close()
	}
	_ = b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	if clean {
		b.u.put(b.uc)
	}
	return nil
}
