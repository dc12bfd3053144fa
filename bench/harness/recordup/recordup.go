// Package recordup is a recording reverse proxy for tests and benchmarks:
// put it between a client (or the sidecar) and a real upstream such as
// llama-server, and it keeps every request it forwards — method, path,
// headers, body, the status answered — so a test can read exactly what
// reached the engine, the sidecar's own background calls included.
//
// It also behaves as the servers users run do, where the sidecar's
// benchmarks used to be kinder:
//
//   - it closes a client's keep-alive connection once it was idle for
//     Options.IdleTimeout (llama-server and uvicorn, under vLLM and SGLang,
//     do so after 5 s);
//   - while the upstream cannot be reached, or when it dies in the middle
//     of an answer, the client's connection is closed without a response or
//     cut in the middle of it, as the upstream's own death would (never a
//     502 of its own that a dead server could not send); DropConns closes
//     every client connection at once, as a kill -9 of the upstream does;
//   - FailNext answers one chosen request with an error status instead of
//     forwarding it (an upstream that refuses a turn with 429).
//
// Each request to the upstream is sent on a fresh connection, so a restart
// of the upstream never leaves the proxy itself with stale ones.
//
// Invariants: a Proxy owns its listener, its connections and the goroutine
// that serves them; Close stops them all. Requests are recorded in arrival
// order, each once, before anything is forwarded.
package recordup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// Options configure Start. Upstream is required; every zero value is a
// documented default.
type Options struct {
	// Upstream is the base URL requests are forwarded to; a request's path
	// is appended to the URL's own path. Required.
	Upstream string
	// Addr is the loopback address to listen on. Empty: 127.0.0.1:0 (a
	// free port).
	Addr string
	// IdleTimeout closes a client's keep-alive connection that was idle
	// this long. Zero: 1 s (below the 5 s of llama-server and uvicorn, so
	// tests meet it quickly); negative: never.
	IdleTimeout time.Duration
	// MaxBodyBytes bounds a request body; a larger one is answered 413 and
	// recorded without its body. Zero: 64 MiB.
	MaxBodyBytes int64
	// DialTimeout bounds each connection to the upstream. Zero: 5 s.
	DialTimeout time.Duration
}

func (o *Options) validate() (*url.URL, error) {
	u, err := url.Parse(o.Upstream)
	switch {
	case o.Upstream == "":
		return nil, errors.New("recordup: no Upstream")
	case err != nil:
		return nil, fmt.Errorf("recordup: upstream: %w", err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return nil, fmt.Errorf("recordup: upstream %q is not an http(s) URL", o.Upstream)
	case o.MaxBodyBytes < 0 || o.DialTimeout < 0:
		return nil, errors.New("recordup: negative option")
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = time.Second
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 64 << 20
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	return u, nil
}

// Request is one request the proxy received.
type Request struct {
	// Seq numbers the requests from 0 in arrival order.
	Seq int
	// Start is when the body had been read, End when the answer ended (zero
	// while it runs).
	Start, End time.Time
	Method     string
	// Path is the request's path and query, as the client sent them.
	Path   string
	Header http.Header
	Body   []byte
	// Status is the status answered: the upstream's, or a FailNext rule's
	// (Injected), or 413 for a body over MaxBodyBytes; 0 when the
	// connection was closed without a response (the upstream unreachable).
	Status   int
	Injected bool
	// Aborted marks an answer cut after its headers (the upstream died or
	// the client went away).
	Aborted bool
}

// rule is one pending FailNext.
type rule struct {
	match  func(Request) bool
	status int
	body   []byte
}

// Proxy is a running recording proxy. Make one with Start and Close it.
// Safe for concurrent use.
type Proxy struct {
	opts Options
	ln   net.Listener
	srv  *http.Server
	rp   *httputil.ReverseProxy
	done chan struct{} // closed when Serve returned

	// mu protects the fields below.
	mu    sync.Mutex
	reqs  []Request
	rules []rule
	conns map[net.Conn]struct{}
}

// Start listens on Options.Addr and serves until Close.
func Start(o Options) (*Proxy, error) {
	up, err := o.validate()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("recordup: listen: %w", err)
	}
	p := &Proxy{opts: o, ln: ln, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	dialer := &net.Dialer{Timeout: o.DialTimeout}
	quiet := log.New(io.Discard, "", 0) // aborted answers are the point here, not news
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.Out.Header["X-Forwarded-For"] = nil // send no header the client did not
		},
		// A fresh connection per request: an upstream restart leaves
		// nothing stale here (what the clients see of it is the point).
		Transport: &http.Transport{
			DialContext:        dialer.DialContext,
			DisableKeepAlives:  true,
			DisableCompression: true,
		},
		FlushInterval: -1, // relay every write at once (SSE)
		ErrorLog:      quiet,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// No response at all, as from a server that died: the
			// server closes the client's connection.
			panic(http.ErrAbortHandler)
		},
	}
	idle := max(o.IdleTimeout, 0) // net/http: 0 and no ReadTimeout is never
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(p.serve),
		IdleTimeout:       idle,
		ReadHeaderTimeout: 30 * time.Second,
		ConnState:         p.connState,
		ErrorLog:          quiet,
	}
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// URL is the proxy's base URL, http://127.0.0.1:PORT.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Requests returns a copy of every request received so far, in arrival
// order (bodies and headers are shared with the proxy and must not be
// changed).
func (p *Proxy) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.reqs...)
}

// Len is the number of requests received so far.
func (p *Proxy) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reqs)
}

// FailNext answers the first request from now on that match accepts with
// status and body (Content-Type application/json) instead of forwarding
// it; later requests are forwarded again. Rules are tried in the order
// they were added; each fires once. match sees the request as recorded
// (Status not yet set).
func (p *Proxy) FailNext(match func(Request) bool, status int, body []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, rule{match: match, status: status, body: body})
}

// DropConns closes every client connection, idle or in the middle of a
// request, as the death of the upstream process would. The proxy goes on
// accepting new ones.
func (p *Proxy) DropConns() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Close stops listening, closes every connection and waits for the server
// goroutine.
func (p *Proxy) Close() error {
	err := p.srv.Close()
	<-p.done
	return err
}

func (p *Proxy) connState(c net.Conn, st http.ConnState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch st {
	case http.StateNew:
		p.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(p.conns, c)
	}
}

// record appends r and returns its index, taking the first rule that
// matches it (nil when none does).
func (p *Proxy) record(r Request) (int, *rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r.Seq = len(p.reqs)
	p.reqs = append(p.reqs, r)
	for i, ru := range p.rules {
		if ru.match(r) {
			p.rules = append(p.rules[:i:i], p.rules[i+1:]...)
			return r.Seq, &ru
		}
	}
	return r.Seq, nil
}

func (p *Proxy) finish(i, status int, injected, aborted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs[i].End = time.Now()
	p.reqs[i].Status = status
	p.reqs[i].Injected = injected
	p.reqs[i].Aborted = aborted
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.opts.MaxBodyBytes))
	rec := Request{Start: time.Now(), Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header.Clone()}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		i, _ := p.record(rec)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = io.WriteString(w, `{"error":{"message":"request body too large for the recording proxy","type":"invalid_request_error","code":"body_too_large"}}`)
		p.finish(i, http.StatusRequestEntityTooLarge, true, false)
		return
	case err != nil: // the client went away mid-body
		return
	}
	rec.Body = body
	i, ru := p.record(rec)
	if ru != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(ru.status)
		_, _ = w.Write(ru.body)
		p.finish(i, ru.status, true, false)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	sw := &statusWriter{ResponseWriter: w}
	ended := false
	defer func() {
		if !ended { // ReverseProxy panicked with ErrAbortHandler
			p.finish(i, sw.status, false, sw.status != 0)
		}
	}()
	p.rp.ServeHTTP(sw, r) // a client that goes away cancels the upstream request
	ended = true
	p.finish(i, sw.status, false, false)
}

// statusWriter remembers the status written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (and ReverseProxy's flushes) reach
// the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
