package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

// Server is the sidecar's HTTP front. Make one with New, serve with Serve,
// stop with Shutdown. Its methods are safe for concurrent use.
type Server struct {
	opts    Options
	base    *url.URL
	log     *slog.Logger
	metrics *Metrics
	srv     *fasthttp.Server

	ready atomic.Pointer[readyState]
	// probeMu serialises /readyz probes; callers that find it held reuse the
	// last result.
	probeMu sync.Mutex
	up      *upClient
	mem     memMetrics
	// bg runs reply recording and engine after-hooks once responses are
	// out; Shutdown waits for it.
	bg bgTasks
	// anonWarned is set once the first anonymous session request was logged.
	anonWarned atomic.Bool
	// stopping is cancelled when Shutdown begins; memory work on the
	// request path stops with it. (A *fasthttp.RequestCtx carries the same
	// signal, but a context derived from it reads the server's state from a
	// goroutine that may outlive the handler, racing Shutdown.)
	stopping context.Context
	stop     context.CancelFunc

	// The console (Options.AdminToken): the token's hash, the KV time
	// series and its sampler (started by Serve, waited for by Shutdown),
	// and the last window of recent sessions.
	adminHash [32]byte
	// admin is Options.Memory as the console's API sees it; nil without
	// memory.
	admin       AdminMemory
	series      *kvSeries
	windows     *windowCache
	samplerOnce sync.Once
	sampler     sync.WaitGroup
}

type readyState struct {
	at  time.Time
	err error
}

// New validates opts and builds a Server; nothing listens yet.
func New(opts Options) (*Server, error) {
	opts.setDefaults()
	base, err := opts.validate()
	if err != nil {
		return nil, err
	}
	s := &Server{
		opts:    opts,
		base:    base,
		log:     opts.Logger,
		metrics: newMetrics(),
		up:      newUpClient(base, &opts),
	}
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.series = newKVSeries(0)
	if s.consoleOn() {
		s.adminHash = sha256.Sum256([]byte(opts.AdminToken))
		s.series = newKVSeries(opts.ConsoleSamples)
		s.windows = newWindowCache(consoleWindows)
	}
	s.admin, _ = opts.Memory.(AdminMemory)
	if opts.Memory != nil {
		s.metrics.AddCollector(func(w io.Writer) { s.mem.write(w, opts.Memory.Stats()) })
	}
	if opts.KV != nil {
		s.metrics.AddCollector(func(w io.Writer) { writeKVMetrics(w, opts.KV) })
	}
	if opts.Engine != nil {
		s.metrics.AddCollector(func(w io.Writer) { writeEngineMetrics(w, opts.Engine) })
	}
	s.srv = &fasthttp.Server{
		Handler:               s.handle,
		ErrorHandler:          s.handleParseError,
		NoDefaultServerHeader: true, // the upstream's Server header passes through
		NoDefaultContentType:  true,
		MaxRequestBodySize:    max(opts.MaxBodyBytes, opts.MaxKVBytes),
		ReadTimeout:           opts.ReadTimeout,
		WriteTimeout:          opts.WriteTimeout,
		IdleTimeout:           opts.IdleTimeout,
		CloseOnShutdown:       true,
		Logger:                fasthttpLogger{opts.Logger},
	}
	return s, nil
}

// Metrics returns the server's metrics registry.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Serve accepts connections on ln until Shutdown; it returns nil after a
// clean shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if s.consoleOn() {
		s.samplerOnce.Do(func() {
			if s.stopping.Err() != nil {
				return // shut down before it served
			}
			s.sampler.Add(1)
			go func() {
				defer s.sampler.Done()
				s.runSampler(s.stopping, s.opts.ConsoleSampleEvery)
			}()
		})
	}
	return s.srv.Serve(ln)
}

// Shutdown stops accepting, lets in-flight requests and streams finish until
// ctx ends, then closes what is left and the upstream pool.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	s.samplerOnce.Do(func() {}) // none starts after this
	s.sampler.Wait()
	err := s.srv.ShutdownWithContext(ctx)
	s.up.closeIdle(true)
	s.bg.closeAndWait() // replies still being recorded
	return err
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
}

// handleParseError answers requests fasthttp could not read.
func (s *Server) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	status, code, msg := fasthttp.StatusBadRequest, "bad_request", "could not read the request: "+err.Error()
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, code = fasthttp.StatusRequestEntityTooLarge, "body_too_large"
		msg = fmt.Sprintf("request body exceeds the limit of %d bytes", max(s.opts.MaxBodyBytes, s.opts.MaxKVBytes))
	case errors.As(err, &te) && te.Timeout():
		status, code, msg = fasthttp.StatusRequestTimeout, "request_timeout", "timed out reading the request"
	}
	writeError(ctx, status, typeInvalidRequest, code, msg)
	ctx.SetConnectionClose()
	s.metrics.countRequest(routeNotFound, status, 0)
}

// classify names the /v1 route of a raw path that is not the sidecar's
// own, segment by segment after decoding (routing and the upstream read
// "/v1/chat/c%6Fmpletions" alike).
func classify(raw []byte) route {
	_, rest, _ := nextSegment(raw) // "v1", checked by the caller
	a, rest, ok := nextSegment(rest)
	if !ok {
		return routePassthrough
	}
	b, rest, ok := nextSegment(rest)
	switch {
	case rest != nil:
	case !ok && segmentIs(a, "completions"):
		return routeCompletions
	case !ok && segmentIs(a, "embeddings"):
		return routeEmbeddings
	case !ok && segmentIs(a, "models"):
		return routeModels
	case ok && segmentIs(a, "chat") && segmentIs(b, "completions"):
		return routeChat
	}
	return routePassthrough
}

func endpointOf(r route) endpoint {
	switch r {
	case routeChat:
		return epChat
	case routeCompletions:
		return epCompletions
	case routeEmbeddings:
		return epEmbeddings
	}
	return epOther
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	s.metrics.inFlight.Add(1)
	// One reading of the path for routing and handling: the path as sent.
	raw := ctx.URI().PathOriginal()
	switch string(raw) {
	case "/healthz":
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
		s.finish(routeHealthz, ctx.Response.StatusCode(), start)
		return
	case "/readyz":
		s.handleReady(ctx)
		s.finish(routeReadyz, ctx.Response.StatusCode(), start)
		return
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
		s.metrics.WritePrometheus(ctx)
		s.finish(routeMetrics, ctx.Response.StatusCode(), start)
		return
	}
	if string(raw) == "/ui" || bytes.HasPrefix(raw, []byte("/ui/")) {
		s.handleConsole(ctx, raw)
		s.finish(routeConsole, ctx.Response.StatusCode(), start)
		return
	}
	if string(raw) == "/admin/v1" || bytes.HasPrefix(raw, []byte("/admin/v1/")) {
		if !s.tooLarge(ctx, min(s.opts.MaxBodyBytes, maxAdminBody)) {
			s.handleAdmin(ctx, raw[len("/admin/v1"):])
		}
		s.finish(routeAdmin, ctx.Response.StatusCode(), start)
		return
	}
	if r, tail, ok := ownedRoute(raw); ok {
		limit := s.opts.MaxBodyBytes
		if r == routeKV {
			limit = s.opts.MaxKVBytes
		}
		if !s.tooLarge(ctx, limit) {
			switch r {
			case routeSessions:
				s.handleSessions(ctx, tail)
			case routePool:
				s.handlePool(ctx, tail)
			default:
				s.handleKV(ctx, tail)
			}
		}
		s.finish(r, ctx.Response.StatusCode(), start)
		return
	}
	if seg0, rest, _ := nextSegment(raw); !segmentIs(seg0, "v1") || len(rest) == 0 {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "not_found",
			fmt.Sprintf("no route for %s %s", ctx.Method(), raw))
		s.finish(routeNotFound, fasthttp.StatusNotFound, start)
		return
	}
	if !forwardable(raw, ctx.Path()) {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_path",
			"the path holds dot segments or escapes that servers read differently; send it normalised")
		s.finish(routePassthrough, fasthttp.StatusBadRequest, start)
		return
	}
	r := classify(raw)
	if s.tooLarge(ctx, s.opts.MaxBodyBytes) {
		s.finish(r, ctx.Response.StatusCode(), start)
		return
	}
	if !s.forward(ctx, r, start) {
		s.finish(r, ctx.Response.StatusCode(), start)
	}
}

// tooLarge answers 413 when the body exceeds limit; the server reads up to
// the largest limit of any route.
func (s *Server) tooLarge(ctx *fasthttp.RequestCtx, limit int) bool {
	if n := len(ctx.Request.Body()); n > limit {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, typeInvalidRequest, "body_too_large",
			fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", n, limit))
		ctx.SetConnectionClose()
		return true
	}
	return false
}

// finish counts a request that ended.
func (s *Server) finish(r route, status int, start time.Time) {
	s.metrics.inFlight.Add(-1)
	s.metrics.countRequest(r, status, time.Since(start))
}

// forward proxies one /v1 request. It returns true when the response is a
// stream whose relay will call finish when done.
func (s *Server) forward(ctx *fasthttp.RequestCtx, r route, start time.Time) bool {
	body := ctx.Request.Body()
	s.metrics.bytesIn.Add(uint64(len(body)))

	var info requestInfo
	if ep := endpointOf(r); ep != epOther && ctx.IsPost() {
		var err error
		if info, err = parseRequest(ep, body); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_request", err.Error())
			return false
		}
	}
	sess, anonymous, err := s.sessionOf(ctx, info)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_session_id", err.Error())
		return false
	}
	if anonymous {
		s.metrics.anonymous.Add(1)
		if s.anonWarned.CompareAndSwap(false, true) {
			s.log.Warn("a request named a session without an API key: it goes through without session state (send Authorization: Bearer …, or start with --allow-anonymous to share one anonymous tenant); further ones are counted in sidecar_anonymous_stateless_requests_total")
		}
	}
	var sessLog []any
	if sess.ID != "" {
		sessLog = []any{"session", sess.ID, "tenant", sess.Tenant}
	}
	// A fleet's lease covers the whole turn; every path below either hands
	// release on (to the engine's after-work or the relay) or runs it.
	var release func()
	if s.opts.Fleet != nil && sess.ID != "" && (r == routeChat || r == routeCompletions) && ctx.IsPost() {
		rel, err := s.opts.Fleet.Acquire(s.stopping, sess.Tenant, sess.ID)
		if err != nil && s.stopping.Err() != nil {
			writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "shutting_down", "the sidecar is shutting down; retry")
			return false
		}
		if err != nil {
			s.metrics.fleetBusy.Add(1)
			s.log.Warn("session busy on another replica", append(sessLog, "err", err)...)
			writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "session_busy",
				"another replica is serving this session and did not finish in time; retry")
			ctx.Response.Header.Set("Retry-After", "1")
			return false
		}
		release = rel
	}
	defer func() {
		if release != nil {
			release()
		}
	}()
	var turn *memory.Turn
	if s.opts.Memory != nil && sess.ID != "" && r == routeChat && ctx.IsPost() {
		var handled bool
		if turn, body, handled = s.prepareTurn(ctx, sess, info, body, sessLog); handled {
			return false
		}
	}
	// Every path below either hands turn to record or aborts it.
	defer func() {
		if turn != nil {
			turn.Abort()
		}
	}()
	var ereq *engine.Request
	if s.opts.Engine != nil && (r == routeChat || r == routeCompletions) && ctx.IsPost() {
		// Stateless requests too: a connector that places requests on the
		// engine's slots must see every one, or a stateless request could
		// land on a slot holding a session's KV.
		tenant := sess.Tenant
		if tenant == "" { // stateless: the engine still scopes KV reuse by key
			tenant = tenantOf(ctx.Request.Header.Peek("Authorization"))
		}
		ereq = &engine.Request{Tenant: tenant, SessionID: sess.ID, Model: info.Model, Body: body}
		nb, err := s.opts.Engine.Before(ctx, ereq)
		if err != nil {
			s.log.Warn("engine connector before-hook failed; forwarding anyway", append(sessLog, "engine", s.opts.Engine.Name(), "err", err)...)
		}
		if len(nb) > 0 {
			body = nb
		}
	}
	// The engine hears of every response it saw a request for, once.
	defer func() {
		if ereq != nil {
			s.engineAfter(ereq, &engine.Response{Status: ctx.Response.StatusCode(), Body: ctx.Response.Body()}, nil, release)
			release = nil
		}
	}()

	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	s.upstreamRequest(req, &ctx.Request, body)
	if turn != nil || ereq != nil {
		// The sidecar reads this answer (to record the reply, or for the
		// engine's timings): ask for it uncompressed.
		req.Header.Del("Accept-Encoding")
	}

	slot := new(cancelSlot)
	stopWatch := watchClientGone(ctx.Conn(), slot.cancel, func() { s.metrics.disconnects.Add(1) })
	resp := fasthttp.AcquireResponse()
	uc, err := s.up.roundTrip(req, resp, s.opts.UpstreamTimeout, s.opts.WriteTimeout, slot)
	if err != nil {
		stopWatch()
		fasthttp.ReleaseResponse(resp)
		status, code, kind := classifyUpstreamError(err)
		if errors.Is(err, errCancelled) {
			s.log.Info("client went away before the upstream answered", append(sessLog, "route", r.String())...)
			writeError(ctx, statusClientClosed, typeInvalidRequest, "client_closed", "client closed the request")
			return false
		}
		s.metrics.countUpstreamError(kind)
		s.log.Warn("upstream request failed", append(sessLog, "route", r.String(), "kind", kind, "err", err)...)
		msg := "upstream unreachable: " + err.Error()
		if status == fasthttp.StatusGatewayTimeout {
			msg = fmt.Sprintf("upstream did not answer within %s", s.opts.UpstreamTimeout)
		}
		writeError(ctx, status, typeUpstream, code, msg)
		return false
	}
	ub := &upBody{u: s.up, uc: uc, r: resp.BodyStream(), idle: s.opts.StreamIdleTimeout, slot: slot, resp: resp, reuse: !resp.ConnectionClose()}

	status := resp.StatusCode()
	ctx.SetStatusCode(status)
	copyResponseHeaders(&ctx.Response.Header, &resp.Header)
	if status >= 400 {
		s.log.Debug("upstream answered an error", append(sessLog, "route", r.String(), "status", status)...)
	}

	isSSE := bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream"))
	if isSSE || resp.Header.ContentLength() < 0 && info.Stream {
		// The watch goes on while the relay waits on the upstream; the relay
		// stops it when fasthttp closes the body stream.
		rl := &relay{stopWatch: stopWatch, turn: turn, ereq: ereq, release: release,
			s: s, body: ub, conn: ctx.Conn(),
			sse: isSSE, validate: isSSE && (r == routeChat || r == routeCompletions),
			route: r, status: status, start: start, sessLog: sessLog,
			buf: relayBufs.Get().(*[32 << 10]byte)[:],
		}
		turn, ereq, release = nil, nil, nil // the relay records them
		// Headers go out at once unless the first bytes of the body are
		// already here: then both leave in one write, one wakeup less for
		// the client's time to first event.
		ctx.Response.ImmediateHeaderFlush = uc.br.Buffered() == 0
		ctx.SetBodyStream(rl, -1)
		return true
	}

	err = readBodyInto(&ctx.Response, ub, s.opts.MaxResponseBytes)
	if ctx.IsHead() && err == nil {
		// No body came; the client hears the length the upstream announced.
		ctx.Response.Header.SetContentLength(resp.Header.ContentLength())
	}
	stopWatch()
	timedOut := ub.timedO
	_ = ub.Close()
	if err != nil {
		ctx.Response.Reset()
		if errors.Is(err, errCancelled) {
			writeError(ctx, statusClientClosed, typeInvalidRequest, "client_closed", "client closed the request")
			return false
		}
		if errors.Is(err, errTooLarge) {
			s.metrics.countUpstreamError(upErrTooLarge)
			writeError(ctx, fasthttp.StatusBadGateway, typeUpstream, "upstream_response_too_large",
				fmt.Sprintf("upstream response exceeds the limit of %d bytes", s.opts.MaxResponseBytes))
			return false
		}
		status, code, kind := classifyBodyError(err, timedOut)
		s.metrics.countUpstreamError(kind)
		s.log.Warn("upstream body failed", append(sessLog, "route", r.String(), "kind", kind, "err", err)...)
		writeError(ctx, status, typeUpstream, code, "upstream response broken: "+kind)
		return false
	}
	s.metrics.ttfb[r].observe(time.Since(start))
	s.metrics.bytesOut.Add(uint64(len(ctx.Response.Body())))
	if turn != nil && status < 300 {
		// The reply is durable before the response is written (issue 12
		// row 15): a client that got its answer finds it in the session.
		raw, cut := replyMessage(ctx.Response.Body(), s.opts.Memory.MaxReplyBytes())
		s.recordTurn(turn, raw, cut)
		turn = nil
	}
	return false
}

// engineAfter runs, off the request path and in this order: rec (a
// partial reply to record, or nil), the engine's after-hook (it may save a
// slot's state) and, when the turn holds a fleet lease, the engine's
// Settle (the turn's KV saved and written through) and then release.
// resp.Body is copied: the response buffer is reused.
func (s *Server) engineAfter(req *engine.Request, resp *engine.Response, rec, release func()) {
	if resp != nil {
		resp.Body = append([]byte(nil), resp.Body...)
	}
	s.bg.run(func() {
		if rec != nil {
			rec()
		}
		if req != nil {
			s.opts.Engine.After(context.Background(), req, resp)
			if release != nil {
				s.opts.Engine.Settle(context.Background(), req)
			}
		}
		if release != nil {
			release()
		}
	})
}

// bgTasks runs work after responses in goroutines it tracks. Once closed
// (Shutdown ran out of grace while streams were still open) it runs new work
// inline, so a late stream never races a Wait. The zero value is ready.
type bgTasks struct {
	// mu protects closed and orders Add before Wait.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (b *bgTasks) run(f func()) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		f()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		f()
	}()
}

func (b *bgTasks) closeAndWait() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// statusClientClosed is logged and counted for requests whose client went
// away before the answer (nginx's 499); the client never sees it.
const statusClientClosed = 499

// upstreamRequest builds the request to the upstream: same method, the raw
// path (the one routing read) and query under the upstream's base path,
// end-to-end headers, the body unchanged (not copied: body must outlive
// req's use). An absolute-form request target is sent in origin form.
func (s *Server) upstreamRequest(req *fasthttp.Request, in *fasthttp.Request, body []byte) {
	req.Header.DisableNormalizing()
	req.Header.SetMethodBytes(in.Header.Method())
	path, query := in.URI().PathOriginal(), in.URI().QueryString()
	uri := make([]byte, 0, len(s.base.Path)+len(path)+1+len(query))
	uri = append(append(uri, s.base.Path...), path...)
	if len(query) > 0 {
		uri = append(append(uri, '?'), query...)
	}
	req.Header.SetRequestURIBytes(uri)
	req.Header.SetHost(s.base.Host)
	copyRequestHeaders(&req.Header, &in.Header)
	req.SetBodyRaw(body)
}

// handleReady answers /readyz: 200 when the upstream answered a probe
// recently, 503 otherwise. Results are reused for ReadyCacheTTL.
func (s *Server) handleReady(ctx *fasthttp.RequestCtx) {
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
	req.Header.SetRequestURI(s.base.Path + "/v1/models")
	req.Header.SetHost(s.base.Host)
	resp := fasthttp.AcquireResponse()
	timeout := min(s.opts.DialTimeout+2*time.Second, 10*time.Second)
	uc, err := s.up.roundTrip(req, resp, timeout, timeout, new(cancelSlot))
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return fmt.Errorf("upstream unreachable: %w", err)
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
