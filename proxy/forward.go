package proxy

// Forwarding one /v1 request upstream: the memory window and the engine's
// before-hook on the way in, the response relayed or buffered on the way
// out, and the work left for after the response (recording, the engine's
// after-hook and settle, the fleet lease) on goroutines the Server tracks.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

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
	x := &exchange{r: r, start: start, info: info, sess: sess, sessLog: sessLog, body: body, release: &release}
	for attempt := 0; ; attempt++ {
		x.attempt = attempt
		if stream, again := s.forwardOnce(ctx, x); !again {
			return stream
		}
	}
}

// exchange is one client request as forward passes it through its
// attempts: a turn whose window the engine refused for its context is
// built again for the context the error stated and sent once more.
type exchange struct {
	r       route
	start   time.Time
	info    requestInfo
	sess    sessionRef
	sessLog []any
	body    []byte  // the client's body
	release *func() // the fleet lease, taken by whoever finishes the turn
	attempt int
}

// forwardOnce makes one attempt of x. It returns stream true when the
// response is a stream whose relay will finish it, and again true when the
// upstream refused the turn's window for the engine's context before any
// byte reached the client: forward then tries once more.
func (s *Server) forwardOnce(ctx *fasthttp.RequestCtx, x *exchange) (stream, again bool) {
	r, start, info, sess, sessLog, body := x.r, x.start, x.info, x.sess, x.sessLog, x.body
	var turn *memory.Turn
	if s.opts.Memory != nil && sess.ID != "" && r == routeChat && ctx.IsPost() {
		var handled bool
		if turn, body, handled = s.prepareTurn(ctx, sess, info, body, sessLog); handled {
			return false, false
		}
	}
	// Every path below either hands turn to record or fails it: a turn
	// without an answer is not history (the client will retry it).
	defer func() {
		if turn != nil {
			s.failTurn(turn)
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
		nb, err := s.engine.Before(ctx, ereq)
		if err != nil {
			s.log.Warn("engine connector before-hook failed; forwarding anyway", append(sessLog, "engine", s.opts.Engine.Name(), "err", err)...)
		}
		if len(nb) > 0 {
			body = nb
		}
	}
	// The engine hears of every response it saw a request for, once.
	var refused *engine.Response // a context error answered to this attempt
	defer func() {
		switch {
		case ereq != nil && refused != nil:
			s.engineAfter(ereq, refused, nil, nil) // the turn goes on: the lease stays
		case ereq != nil:
			s.engineAfter(ereq, &engine.Response{Status: ctx.Response.StatusCode(), Body: ctx.Response.Body()}, nil, *x.release)
			*x.release = nil
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
			return false, false
		}
		s.metrics.countUpstreamError(kind)
		s.log.Warn("upstream request failed", append(sessLog, "route", r.String(), "kind", kind, "err", err)...)
		msg := upstreamMessage(err)
		if status == fasthttp.StatusGatewayTimeout {
			msg = fmt.Sprintf("upstream did not answer within %s", s.opts.UpstreamTimeout)
		}
		writeError(ctx, status, typeUpstream, code, msg)
		return false, false
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
		rl := &relay{stopWatch: stopWatch, turn: turn, model: info.Model, ereq: ereq, release: *x.release,
			s: s, body: ub, conn: ctx.Conn(),
			sse: isSSE, validate: isSSE && (r == routeChat || r == routeCompletions),
			route: r, status: status, start: start, sessLog: sessLog,
			buf: relayBufs.Get().(*[32 << 10]byte)[:],
		}
		turn, ereq, *x.release = nil, nil, nil // the relay records them
		// Headers go out at once unless the first bytes of the body are
		// already here: then both leave in one write, one wakeup less for
		// the client's time to first event.
		ctx.Response.ImmediateHeaderFlush = uc.br.Buffered() == 0
		ctx.SetBodyStream(rl, -1)
		return true, false
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
			return false, false
		}
		if errors.Is(err, errTooLarge) {
			s.metrics.countUpstreamError(upErrTooLarge)
			writeError(ctx, fasthttp.StatusBadGateway, typeUpstream, "upstream_response_too_large",
				fmt.Sprintf("upstream response exceeds the limit of %d bytes", s.opts.MaxResponseBytes))
			return false, false
		}
		status, code, kind := classifyBodyError(err, timedOut)
		s.metrics.countUpstreamError(kind)
		s.log.Warn("upstream body failed", append(sessLog, "route", r.String(), "kind", kind, "err", err)...)
		writeError(ctx, status, typeUpstream, code, "upstream response broken: "+kind)
		return false, false
	}
	if turn != nil && x.attempt == 0 && !turn.Stats.AsSent && status >= 400 {
		if ce, ok := parseContextError(status, ctx.Response.Body()); ok {
			// The engine's context is smaller than the window: nothing
			// reached the client yet, so build it again for what the
			// error says and send it once more.
			s.limits.learnError(info.Model, ce, turn.Stats.TotalTokens)
			s.mem.contextRetries.Add(1)
			s.log.Info("the upstream refused the window for its context; building it again for that context", append(sessLog,
				"window_tokens", turn.Stats.TotalTokens, "engine_ctx", ce.nCtx, "engine_prompt_tokens", ce.nPrompt)...)
			refused = &engine.Response{Status: status, Body: append([]byte(nil), ctx.Response.Body()...)}
			s.failTurn(turn)
			turn = nil
			ctx.Response.Reset()
			return false, true
		}
	}
	s.metrics.ttfb[r].observe(time.Since(start))
	s.metrics.bytesOut.Add(uint64(len(ctx.Response.Body())))
	if turn != nil && status < 300 {
		s.observeContext(info.Model, turn, ctx.Response.Body())
		// The reply is durable before the response is written (issue 12
		// row 15): a client that got its answer finds it in the session.
		raw, cut := replyMessage(ctx.Response.Body(), s.opts.Memory.MaxReplyBytes())
		s.recordTurn(turn, raw, cut)
		turn = nil
	}
	return false, false
}

// observeContext learns the engine's tokens per memory token from an
// answer's prompt tokens (usage or llama.cpp timings) to turn's window.
func (s *Server) observeContext(model string, turn *memory.Turn, body []byte) {
	if s.limits == nil || turn.Stats.AsSent {
		return
	}
	if tm, ok := engine.ParseTimings(body); ok {
		s.limits.observe(model, turn.Stats.TotalTokens, int(tm.PromptN+tm.CacheN))
	}
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
			s.engine.After(context.Background(), req, resp)
			if release != nil {
				s.engine.Settle(context.Background(), req)
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
	// running counts tasks not yet done; quiet (when set) is poked as
	// each ends.
	running atomic.Int64
	quiet   *quietSignal
}

func (b *bgTasks) run(f func()) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		f()
		return
	}
	b.wg.Add(1)
	b.running.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		f()
		b.running.Add(-1)
		b.quiet.poke()
	}()
}

// quietSignal lets a waiter sleep until a condition on counters that other
// goroutines decrement holds (see Server.waitIdle in the tests): poke costs
// one atomic load while nobody waits. A nil *quietSignal ignores pokes;
// cond.L must be &mu before the first wait.
type quietSignal struct {
	waiting atomic.Int32
	// mu orders a waiter's check of its condition before its Wait against
	// a poke's Broadcast.
	mu   sync.Mutex
	cond sync.Cond
}

func (q *quietSignal) poke() {
	if q == nil || q.waiting.Load() == 0 {
		return
	}
	q.mu.Lock()
	q.cond.Broadcast()
	q.mu.Unlock()
}

// wait returns once done() is true; done is re-checked after every poke.
func (q *quietSignal) wait(done func() bool) {
	q.waiting.Add(1)
	defer q.waiting.Add(-1)
	q.mu.Lock()
	defer q.mu.Unlock()
	for !done() {
		q.cond.Wait()
	}
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
	uri := make([]byte, 0, len(s.basePath)+len(path)+1+len(query))
	uri = append(append(uri, s.basePath...), path...)
	if len(query) > 0 {
		uri = append(append(uri, '?'), query...)
	}
	req.Header.SetRequestURIBytes(uri)
	req.Header.SetHost(s.base.Host)
	copyRequestHeaders(&req.Header, &in.Header)
	req.SetBodyRaw(body)
}
