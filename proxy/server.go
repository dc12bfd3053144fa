package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/frontdoor"
)

// Server is the sidecar's HTTP front. Make one with New, serve with Serve,
// stop with Shutdown. Its methods are safe for concurrent use.
type Server struct {
	opts    Options
	base    *url.URL
	log     *slog.Logger
	metrics *Metrics
	srv     *fasthttp.Server
	// engine is the hooks of Options.Engine; nil without one.
	engine *engine.Hooks

	// basePath is the upstream URL's path as escaped on the wire, without
	// a trailing "/" or "/v1"; every upstream request path starts with it.
	basePath string

	ready atomic.Pointer[readyState]
	// probeMu serialises /readyz probes; callers that find it held reuse the
	// last result.
	probeMu sync.Mutex
	up      *upClient
	mem     memMetrics
	snap    snapMetrics // context snapshots (snapshot.go)
	// limits is the engine's context per model (ctxlimit.go); nil
	// without memory, which alone adds to requests.
	limits *ctxLimits
	// bg runs reply recording and engine after-hooks once responses are
	// out; Shutdown waits for it.
	bg bgTasks
	// quiet is poked when a request finishes or a bg task ends.
	quiet quietSignal
	// anonWarned is set once the first anonymous session request was logged.
	anonWarned atomic.Bool
	// poolStreams counts the open pool event streams (poolevents.go).
	poolStreams atomic.Int64
	// stopping is cancelled when Shutdown begins; memory work on the
	// request path stops with it. (A *fasthttp.RequestCtx carries the same
	// signal, but a context derived from it reads the server's state from a
	// goroutine that may outlive the handler, racing Shutdown.)
	stopping context.Context
	stop     context.CancelFunc

	// lister is Options.Memory as GET /v1/sessions sees it; nil when it
	// cannot list.
	lister SessionLister

	// loop serves the pass-through on the front door's event loop
	// (Options.EventLoop, loop.go); nil without one. Serve sets it,
	// unless Shutdown began; Shutdown stops it.
	loopMu sync.Mutex
	loop   *frontdoor.Loop
	served []net.Listener // what Serve serves; Shutdown closes them
}

type readyState struct {
	at  time.Time
	err error
}

// New validates opts and builds a Server; nothing listens yet.
func New(opts Options) (*Server, error) {
	opts.EnsureDefaults()
	base, err := opts.upstreamURL() // Validate's checks, and the URL
	if err != nil {
		return nil, err
	}
	s := &Server{
		opts:    opts,
		base:    base,
		log:     opts.Logger,
		metrics: newMetrics(opts.Metrics),
		up:      newUpClient(base, &opts),
	}
	s.basePath = base.EscapedPath()
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.quiet.cond.L = &s.quiet.mu
	s.bg.quiet = &s.quiet
	s.lister, _ = opts.Memory.(SessionLister)
	if opts.Memory != nil {
		s.limits = newCtxLimits(base, opts.Memory.CountTokensContext, s.stopping, s.log)
		s.limits.noProbe = opts.NoContextProbe
		s.mem.export(s.metrics.reg, opts.Memory.Stats)
		if _, ok := opts.Memory.(SnapshotMemory); ok {
			s.snap.export(s.metrics.reg)
		}
	}
	if opts.KV != nil {
		exportKVMetrics(s.metrics.reg, opts.KV)
	}
	if s.engine = engine.Wrap(opts.Engine); s.engine != nil {
		s.engine.ExportMetrics(s.metrics.reg)
	}
	if opts.MCP != nil {
		exportMCPMetrics(s.metrics.reg, opts.MCP)
	}
	s.srv = &fasthttp.Server{
		Handler:               s.handle,
		ErrorHandler:          s.HandleParseError,
		NoDefaultServerHeader: true, // the upstream's Server header passes through
		NoDefaultContentType:  true,
		MaxRequestBodySize:    max(opts.MaxBodyBytes, opts.MaxKVBytes, opts.MaxSnapshotBytes),
		// The front door hands over heads of up to frontdoor's MaxHead,
		// rewritten with CRLF line ends: a bare-LF head grows by a byte a
		// line, and its last line, the body's length, may be new.
		ReadBufferSize:  2 * frontdoor.DefaultMaxHead,
		ReadTimeout:     opts.ReadTimeout,
		WriteTimeout:    opts.WriteTimeout,
		IdleTimeout:     opts.IdleTimeout,
		CloseOnShutdown: true,
		Logger:          fasthttpLogger{opts.Logger},
	}
	return s, nil
}

// Metrics returns the server's metrics registry.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Serve accepts connections on ln until Shutdown; it returns nil after a
// clean shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if s.limits != nil && s.stopping.Err() == nil {
		s.limits.start()
	}
	s.loopMu.Lock()
	if s.stopping.Err() != nil {
		s.loopMu.Unlock()
		_ = ln.Close()
		return nil // shut down before it served
	}
	fl, loop := s.startLoop(ln)
	s.served = append(s.served, fl)
	s.loopMu.Unlock()
	err := s.srv.Serve(fl)
	if loop != nil {
		<-loop.Done() // Shutdown stopped it: Serve returned
	}
	if err != nil && s.stopping.Err() != nil {
		err = nil // the listener Shutdown closed
	}
	return err
}

// Shutdown stops accepting, lets in-flight requests and streams finish until
// ctx ends, then closes what is left and the upstream pool.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	s.loopMu.Lock() // after stop: no Serve starts from here
	loop, served := s.loop, s.served
	s.loopMu.Unlock()
	if loop != nil {
		loop.Shutdown(ctx)
	}
	err := s.srv.ShutdownWithContext(ctx)
	for _, ln := range served {
		_ = ln.Close() // one fasthttp had not taken yet
	}
	if s.limits != nil {
		s.limits.close()
	}
	s.up.closeIdle(true)
	s.bg.closeAndWait() // replies still being recorded
	return err
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
}

// frontOptions are the front door's: every connection the fasthttp server
// reads, handed over by the event loop or not, is read through it, so one
// strict reader decides each request's framing and header lines before
// any handler acts (package frontdoor).
func (s *Server) frontOptions() frontdoor.Options {
	return frontdoor.Options{
		Limits:      s.frontLimits(),
		ReadTimeout: s.opts.ReadTimeout,
		Reject:      s.frontReject,
	}
}

// FrontListener serves ln's connections through the front door, with the
// proxy's limits and refusals: the main listener's (Serve) and the admin
// listener's (package admin), which the sidecar wires to it.
func (s *Server) FrontListener(ln net.Listener) net.Listener {
	return frontdoor.NewListener(ln, s.frontOptions())
}

func (s *Server) frontLimits() frontdoor.Limits {
	return frontdoor.Limits{MaxBody: int64(max(s.opts.MaxBodyBytes, s.opts.MaxKVBytes, s.opts.MaxSnapshotBytes))}
}

// frontReject renders the answer to a request the front door refused: the
// OpenAI-shaped error every other refusal gets, and a close. It is counted
// as HandleParseError counts.
func (s *Server) frontReject(dst []byte, e *frontdoor.Error) []byte {
	s.metrics.countRequest(routeNotFound, e.Status, 0)
	body := errorJSON(typeInvalidRequest, e.Code, e.Msg)
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(e.Status), 10)
	dst = append(dst, ' ')
	dst = append(dst, fasthttp.StatusMessage(e.Status)...)
	dst = append(dst, "\r\nDate: "...)
	dst = append(dst, time.Now().UTC().Format(http.TimeFormat)...)
	dst = append(dst, "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n\r\n"...)
	return append(dst, body...)
}

// HandleParseError answers requests fasthttp could not read: behind the
// front door, only a body that passes the limit or does not come in time.
// Its message never quotes the request (fasthttp's errors do). The admin
// listener answers its own with it.
func (s *Server) HandleParseError(ctx *fasthttp.RequestCtx, err error) {
	status, code, msg := fasthttp.StatusBadRequest, "bad_request", "could not read the request"
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, code = fasthttp.StatusRequestEntityTooLarge, "body_too_large"
		msg = fmt.Sprintf("request body exceeds the limit of %d bytes", max(s.opts.MaxBodyBytes, s.opts.MaxKVBytes, s.opts.MaxSnapshotBytes))
	case errors.As(err, &te) && te.Timeout():
		status, code, msg = fasthttp.StatusRequestTimeout, "request_timeout", "timed out reading the request"
	}
	writeError(ctx, status, typeInvalidRequest, code, msg)
	ctx.SetConnectionClose()
	s.metrics.countRequest(routeNotFound, status, 0)
}

// CountRequest counts a request of the admin listener (package admin) in
// flight; done counts it as ended under the route named route ("healthz",
// "readyz", "metrics", "console", "admin" or "not_found") with its
// status, as the main listener counts its own.
func (s *Server) CountRequest() (done func(route string, status int)) {
	start := time.Now()
	s.metrics.inFlight.Add(1)
	return func(name string, status int) {
		r := routeNotFound
		for i, n := range routeNames {
			if n == name {
				r = route(i)
				break
			}
		}
		s.finish(r, status, start)
	}
}

// HandleHealth answers /healthz: the process is up.
func (s *Server) HandleHealth(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"status":"ok"}`)
}

// finish counts a request that ended.
func (s *Server) finish(r route, status int, start time.Time) {
	s.metrics.inFlight.Add(-1)
	s.metrics.countRequest(r, status, time.Since(start))
	s.quiet.poke()
}

// HandleReady answers /readyz: 200 when the upstream answered a probe
// recently, 503 otherwise. Results are reused for ReadyCacheTTL.
func (s *Server) HandleReady(ctx *fasthttp.RequestCtx) {
	st := s.ready.Load()
	if st == nil || time.Since(st.at) > s.opts.ReadyCacheTTL {
		if s.probeMu.TryLock() {
			st = &readyState{at: time.Now(), err: s.probe()}
			s.ready.Store(st)
			s.probeMu.Unlock()
		} else if st == nil {
			s.probeMu.Lock() // another probe runs: wait for its answer
			st = s.ready.Load()
			s.probeMu.Unlock()
		}
	}
	ctx.SetContentType("application/json")
	if st.err != nil {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBody(errorJSON(typeUpstream, "upstream_not_ready", st.err.Error()))
		return
	}
	ctx.SetBodyString(`{"status":"ready"}`)
}

// probe asks the upstream for its model list; any answer below 500 means
// the upstream is up.
func (s *Server) probe() error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.SetRequestURI(s.basePath + "/v1/models")
	req.Header.SetHost(s.base.Host)
	resp := fasthttp.AcquireResponse()
	timeout := min(s.opts.DialTimeout+2*time.Second, 10*time.Second)
	uc, err := s.up.roundTrip(req, resp, timeout, timeout, new(cancelSlot))
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		s.log.Debug("readiness probe failed", "err", err)
		return errors.New(upstreamMessage(err)) // never the upstream's bytes
	}
	ub := &upBody{u: s.up, uc: uc, r: resp.BodyStream(), idle: timeout, slot: new(cancelSlot), resp: resp, reuse: !resp.ConnectionClose()}
	_, _ = readAllLimit(ub, 1<<20)
	status := resp.StatusCode()
	_ = ub.Close()
	if status >= 500 {
		return fmt.Errorf("upstream answered %d to GET /v1/models", status)
	}
	return nil
}
