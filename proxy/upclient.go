package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/frontdoor"
	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

// upClient is the pooled HTTP/1.1 client to the one upstream. It is built on
// fasthttp's request writer and response parser but owns its connections, so
// a request can be cancelled at any point by closing its connection (a
// client that went away must not keep the LLM generating), and every body
// read gets its own idle deadline. net/http does the same with two
// goroutines per connection; this costs none (see BenchmarkProxyChat).
//
// Upstreams close idle keep-alive connections (llama-server and uvicorn,
// so vLLM and SGLang, after 5 s) and engines restart at any time, so a
// pooled connection may be dead when it is taken. Three things keep that
// from failing a request the upstream never saw: connections idle for
// idleFor are closed (a timer, below the upstreams' own bounds); a pooled
// connection is checked on checkout with one non-blocking peek at its
// socket (upalive_linux.go), and a dead one empties the whole pool (its
// neighbours died with it); and a request that fails on a reused
// connection before any response byte came is sent again once, on a
// freshly dialed connection. A fresh connection that fails is never
// retried.
type upClient struct {
	addr        string // host:port
	tls         *tls.Config
	dialTimeout time.Duration
	maxIdle     int
	idleFor     time.Duration
	now         func() time.Time // time.Now; tests step it
	// retries counts requests sent again on a fresh connection.
	retries atomic.Int64

	// mu protects the fields below.
	mu     sync.Mutex
	idle   []*upConn // oldest first, most recently used last
	closed bool
	// reaper closes connections idle for idleFor; armed while idle is not
	// empty.
	reaper      *time.Timer
	reaperArmed bool
}

// upConn is one upstream connection with its buffers.
type upConn struct {
	c        net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	lastUsed time.Time
	probe    connProbe
	// readDL and writeDL are the deadlines set on c (arm).
	readDL, writeDL time.Time
}

// arm sets c's read deadline (write: its write deadline) to now+timeout
// unless the one set already lies in the last eighth below it: a bound
// kept to within an eighth of its value (a 5-minute idle bound is at
// least 4m22s), for one timer update every so many requests or reads
// instead of one each (make bench-proxy: three of five per request gone).
func (uc *upConn) arm(write bool, now time.Time, timeout time.Duration) {
	dl := &uc.readDL
	if write {
		dl = &uc.writeDL
	}
	want := now.Add(timeout)
	if keepDeadline(*dl, want, timeout) {
		return
	}
	*dl = want
	if write {
		_ = uc.c.SetWriteDeadline(want)
	} else {
		_ = uc.c.SetReadDeadline(want)
	}
}

// keepDeadline reports whether a deadline set is close enough to want,
// the bound now+timeout: not later, and less than an eighth of timeout
// earlier (arm, and the relay's client write deadline).
func keepDeadline(set, want time.Time, timeout time.Duration) bool {
	return !set.IsZero() && !set.After(want) && set.After(want.Add(-timeout/8))
}

// lazyDeadliner is a connection that sets a deadline on its socket only
// when the one set there would fire later (rawconn.Conn).
type lazyDeadliner interface{ LazyDeadline() }

// onReadSender is a connection that can send a request in the read that
// waits for its answer (rawconn.Conn).
type onReadSender interface{ SendOnRead() }

// dialError is a failure to connect (or to complete a TLS handshake): the
// upstream never saw the request.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// noResponseError: the request could not be written, or the connection
// ended (EOF, reset) before the first byte of a response. On a reused
// connection that is a connection the upstream closed while it was idle,
// so the request is sent again on a fresh one.
type noResponseError struct{ err error }

func (e *noResponseError) Error() string {
	return "upstream closed the connection before answering: " + e.err.Error()
}
func (e *noResponseError) Unwrap() error { return e.err }

// cutResponseError: the connection ended in the middle of a response head.
// The upstream read the request: it is never sent again.
type cutResponseError struct{ err error }

func (e *cutResponseError) Error() string {
	return "upstream response head cut short: " + e.err.Error()
}
func (e *cutResponseError) Unwrap() error { return e.err }

// badResponseError: the upstream's response head is not HTTP/1.1 that even
// a lenient reading accepts. err, fasthttp's, quotes the upstream's bytes:
// for logs only.
type badResponseError struct {
	err      error
	tooLarge bool // the head exceeds maxHeadBytes
}

func (e *badResponseError) Error() string { return "upstream response malformed: " + e.err.Error() }
func (e *badResponseError) Unwrap() error { return e.err }

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
		return nil, &dialError{err}
	}
	c = rawconn.New(c)
	if rc, ok := c.(lazyDeadliner); ok {
		rc.LazyDeadline() // arm's read deadlines alternate between two bounds
	}
	uc := &upConn{c: c, br: bufio.NewReaderSize(c, 32<<10), bw: bufio.NewWriterSize(c, 32<<10)}
	uc.probe.init(c)
	return uc, nil
}

// get returns a live idle connection (reused true) or a new one. Pooled
// connections are taken newest first; one found dead (or idle too long at
// now) takes the whole pool with it.
func (u *upClient) get(now time.Time) (uc *upConn, reused bool, err error) {
	u.mu.Lock()
	if n := len(u.idle); n > 0 {
		uc = u.idle[n-1]
		u.idle[n-1] = nil
		u.idle = u.idle[:n-1]
		if now.Sub(uc.lastUsed) < u.idleFor {
			u.mu.Unlock()
			if uc.br.Buffered() == 0 && uc.probe.alive() {
				return uc, true, nil
			}
			u.mu.Lock()
		}
		dead := append(u.takeIdleLocked(), uc)
		u.mu.Unlock()
		closeConns(dead)
	} else {
		u.mu.Unlock()
	}
	uc, err = u.dial()
	return uc, false, err
}

// put returns a connection whose response was read to its end.
func (u *upClient) put(uc *upConn) {
	uc.lastUsed = u.now()
	// A deadline that may pass while the connection waits in the pool
	// would fail the check on checkout: cleared. Others stay (arm).
	if soon := uc.lastUsed.Add(u.idleFor); !uc.readDL.IsZero() && uc.readDL.Before(soon) || !uc.writeDL.IsZero() && uc.writeDL.Before(soon) {
		_ = uc.c.SetDeadline(time.Time{})
		uc.readDL, uc.writeDL = time.Time{}, time.Time{}
	}
	u.mu.Lock()
	if u.closed || len(u.idle) >= u.maxIdle {
		u.mu.Unlock()
		_ = uc.c.Close()
		return
	}
	u.idle = append(u.idle, uc)
	if !u.reaperArmed {
		u.reaperArmed = true
		if u.reaper == nil {
			u.reaper = time.AfterFunc(u.idleFor, u.reap)
		} else {
			u.reaper.Reset(u.idleFor)
		}
	}
	u.mu.Unlock()
}

// reap closes the connections idle for idleFor and re-arms itself for the
// oldest one left.
func (u *upClient) reap() {
	now := u.now()
	u.mu.Lock()
	n := 0
	for n < len(u.idle) && now.Sub(u.idle[n].lastUsed) >= u.idleFor {
		n++
	}
	expired := append([]*upConn(nil), u.idle[:n]...)
	k := copy(u.idle, u.idle[n:])
	clear(u.idle[k:])
	u.idle = u.idle[:k]
	if k == 0 || u.closed {
		u.reaperArmed = false
	} else {
		u.reaper.Reset(u.idle[0].lastUsed.Add(u.idleFor).Sub(now))
	}
	u.mu.Unlock()
	closeConns(expired)
}

// takeIdleLocked empties the pool and returns what it held; u.mu is held.
func (u *upClient) takeIdleLocked() []*upConn {
	idle := u.idle
	u.idle = nil
	return idle
}

func closeConns(ucs []*upConn) {
	for _, uc := range ucs {
		_ = uc.c.Close()
	}
}

// closeIdle closes pooled connections; with final, later puts close too.
func (u *upClient) closeIdle(final bool) {
	u.mu.Lock()
	u.closed = u.closed || final
	idle := u.takeIdleLocked()
	if final && u.reaper != nil {
		u.reaper.Stop()
		u.reaperArmed = false
	}
	u.mu.Unlock()
	closeConns(idle)
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

// exchange is what one upstream round trip holds beyond the handler's
// frame when its answer is streamed: the cancel slot, the client-gone watch
// and the upstream body. Pooled, a request allocates none of them
// (BenchmarkProxyChatEngine: 13 allocations a request before, 5 after).
// send takes one for the upstream step; buffer, or the relay's Close,
// gives it back (finish) once the body is closed and the watch stopped,
// when nothing else holds a pointer into it.
type exchange struct {
	slot  cancelSlot
	body  upBody
	watch goneWatch
	// reuse is false once the watch's timer fired: its run may still
	// read the watch, so the exchange is left to the collector.
	reuse bool
}

var exchanges = sync.Pool{New: func() any { return new(exchange) }}

// acquireExchange takes an exchange for one round trip and starts its
// client-gone watch on conn (the client's connection; gone counts the
// clients it sees go).
func acquireExchange(conn net.Conn, gone counter) *exchange {
	x := exchanges.Get().(*exchange)
	x.slot.conn, x.slot.cancelled = nil, false
	x.watch.start(conn, &x.slot, gone)
	return x
}

// stopWatch stops the client-gone watch, once.
func (x *exchange) stopWatch() { x.reuse = x.watch.stop() }

// finish ends the round trip once its answer was read or given up: the
// client-gone watch stopped, the body closed (its connection back to the
// pool when it was read to its end and nothing cancelled it; closed, and
// cancelled first when abandon is set, otherwise), then x given back.
// Nothing of x may be used after it.
func (x *exchange) finish(abandon bool) {
	x.stopWatch()
	if abandon && !x.body.eof {
		x.body.slot.cancel()
	}
	_ = x.body.Close()
	x.release()
}

// release gives x back after stopWatch and the body's Close; nothing of
// x may be used after it.
func (x *exchange) release() {
	if !x.reuse {
		return
	}
	x.slot.conn = nil
	x.body = upBody{}
	exchanges.Put(x)
}

// errCancelled reports a request aborted through its cancelSlot.
var errCancelled = errors.New("proxy: upstream request cancelled")

// send is a client request's round trip: the exchange it returns holds
// the client-gone watch on client (its count: gone) and the answer, its
// head read into x.body.resp, its body to read through x.body (idle bounds
// each read's wait). On an error nothing is held.
func (u *upClient) send(client net.Conn, gone counter, req *fasthttp.Request, headerTimeout, writeTimeout, idle time.Duration) (*exchange, error) {
	x := acquireExchange(client, gone)
	resp := fasthttp.AcquireResponse()
	resp.Header.SetNoDefaultContentType(true) // none the upstream did not send
	uc, err := u.roundTrip(req, resp, headerTimeout, writeTimeout, &x.slot)
	if err != nil {
		x.stopWatch()
		x.release()
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	x.body = upBody{u: u, uc: uc, r: resp.BodyStream(), idle: idle, slot: &x.slot, resp: resp, reuse: !resp.ConnectionClose()}
	return x, nil
}

// roundTrip writes req and reads the response head into resp, whose body is
// then resp.BodyStream(), read through upBody. A request that fails on a
// reused connection before any response byte came is sent again, once, on
// a freshly dialed connection, and the rest of the pool is dropped: the
// upstream closed them or restarted. Such a request was most likely never
// read (an idle connection closed as it arrived); if the upstream did read
// it and died, sending it again is what the OpenAI SDKs do on a connection
// error too, and a model call changes nothing beyond its answer.
func (u *upClient) roundTrip(req *fasthttp.Request, resp *fasthttp.Response, headerTimeout, writeTimeout time.Duration, slot *cancelSlot) (*upConn, error) {
	now := u.now() // one clock reading for the pool's check and the deadlines
	uc, reused, err := u.get(now)
	if !reused {
		now = u.now() // after the dial
	}
	for {
		if err != nil {
			return nil, err
		}
		if !slot.attach(uc.c) {
			return nil, errCancelled
		}
		err = u.exchange(uc, now, req, resp, headerTimeout, writeTimeout)
		if err == nil {
			return uc, nil
		}
		_ = uc.c.Close()
		if slot.isCancelled() {
			return nil, errCancelled
		}
		var nothing *noResponseError
		if !reused || !errors.As(err, &nothing) {
			return nil, err
		}
		u.retries.Add(1)
		u.closeIdle(false)
		uc, err = u.dial()
		reused, now = false, u.now()
	}
}

func (u *upClient) exchange(uc *upConn, now time.Time, req *fasthttp.Request, resp *fasthttp.Response, headerTimeout, writeTimeout time.Duration) error {
	if writeTimeout > 0 {
		uc.arm(true, now, writeTimeout)
	}
	if s, ok := uc.c.(onReadSender); ok {
		s.SendOnRead() // the request leaves in the Peek below
	}
	if err := req.Write(uc.bw); err != nil {
		return &noResponseError{err}
	}
	if err := uc.bw.Flush(); err != nil {
		return &noResponseError{err}
	}
	if headerTimeout > 0 {
		uc.arm(false, now, headerTimeout)
	}
	// The first byte tells a connection that was dead before the upstream
	// read the request from a response that went wrong.
	if _, err := uc.br.Peek(1); err != nil {
		if isTimeout(err) {
			return err
		}
		return &noResponseError{err}
	}
	resp.StreamBody = true
	skip := req.Header.IsHead() // a HEAD answer has no body, whatever its Content-Length
	resp.SkipBody = skip
	err := resp.Read(uc.br)
	if err == nil || isTimeout(err) {
		return err
	}
	var small *fasthttp.ErrSmallBuffer
	if !errors.As(err, &small) && connBroken(err) {
		return &cutResponseError{err}
	}
	// A head fasthttp refuses for its size or its framing headers is read
	// again, whole, with its framing repaired the way lenient clients read
	// it (see frontdoor.RepairFraming). Any other is refused now: its bytes may
	// never reach an end of head to wait for.
	buffered, _ := uc.br.Peek(uc.br.Buffered())
	if !errors.As(err, &small) && !errors.Is(err, fasthttp.ErrDuplicateContentLength) && !hasHeaderLine(buffered, "Transfer-Encoding") {
		return &badResponseError{err: err}
	}
	err2 := rereadHead(uc, resp, skip)
	switch {
	case err2 == nil:
		return nil
	case isTimeout(err2):
		return err2
	case errors.Is(err2, errHeadTooLarge):
		return &badResponseError{err: err2, tooLarge: true}
	case connBroken(err2):
		return &cutResponseError{err2}
	}
	return &badResponseError{err: err}
}

// rereadHead reads the response head at the front of uc.br itself (up to
// maxHeadBytes, more than the connection's buffer holds), repairs its
// framing and parses it again. The response is read through a reader of
// its own that then continues on the connection, which is never reused.
func rereadHead(uc *upConn, resp *fasthttp.Response, skipBody bool) error {
	head, err := readHead(uc.br, maxHeadBytes)
	if err != nil {
		return err
	}
	head = frontdoor.RepairFraming(head)
	br := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(head), uc.br), len(head)+4096)
	resp.StreamBody = true
	resp.SkipBody = skipBody
	if err := resp.Read(br); err != nil {
		return err
	}
	resp.SetConnectionClose()
	return nil
}

// isTimeout reports a deadline that passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &ne) && ne.Timeout()
}

// connBroken reports errors of the connection itself (closed, reset), not
// of the bytes on it.
func connBroken(err error) bool {
	var op *net.OpError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.As(err, &op)
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
		b.uc.arm(false, time.Now(), b.idle)
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

// ready reports whether the next Read returns at once, its bytes already in
// the connection's buffer, after a Read that returned n bytes into a buffer
// of size max. It may say false of a Read that would not wait, never true
// of one that would. A chunked body is read a chunk at a time (fasthttp
// reads the chunk's CRLF with its last byte): a Read that stopped short of
// max while bytes stayed buffered ended its chunk, so the buffer starts at
// the next chunk's size line, and the next Read waits for nothing when that
// whole chunk is there.
func (b *upBody) ready(n, max int) bool {
	if b.eof || b.done || b.r == nil {
		return false
	}
	buffered := b.uc.br.Buffered()
	switch {
	case buffered == 0:
		return false
	case b.resp.Header.ContentLength() != -1:
		return true // a length or the connection's end frames it: the buffer answers
	case n == 0 || n >= max:
		return false // mid-chunk, or nothing read: where the buffer starts is unknown
	}
	p, _ := b.uc.br.Peek(buffered)
	_, _, whole := frontdoor.PeekChunk(p)
	return whole
}

// whole reports whether the rest of the body lies in the connection's
// buffer, so reading it to its end waits for nothing: its length, or, for
// a chunked body, every chunk up to the last one (without trailers). Only
// before the first Read: the buffer then starts where the body does.
func (b *upBody) whole() bool {
	if b.eof || b.done || b.r == nil {
		return false
	}
	p, _ := b.uc.br.Peek(b.uc.br.Buffered())
	if cl := b.resp.Header.ContentLength(); cl != -1 {
		return cl >= 0 && len(p) >= cl
	}
	return frontdoor.WholeChunks(p)
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
