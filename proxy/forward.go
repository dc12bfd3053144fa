package proxy

// The forward path: one /v1 request through a short pipeline of steps, each
// one function of flow (the file it leans on in brackets):
//
//	route     the room for the path; the body's fields     handle (server.go), parse (wire.go)
//	session   the session and tenant; a fleet's lease      session (session.go)
//	memory    the turn; its window becomes the messages    memory (memory.go: prepareTurn)
//	engine    the connector's before-hook                  engine
//	upstream  one round trip                               upstream (upclient.go)
//	relay     the answer streamed event by event, or read  relayAnswer (relay.go, stream.go), buffer
//	record    the reply into the session, durably, before  record (memory.go: recordTurn)
//	          the answer's end reaches the client
//
// What a step acquires it keeps in the request's flow, and flow.release
// alone gives it back, once, whichever way the request ends, in this
// order: the turn (failed, or its partial reply recorded, unless record
// took it), the engine request (its after-hook; under a lease, Settle),
// the lease. The upstream step's connection and client-gone watch go back
// (exchange.finish, upclient.go) in buffer or, for a stream, in the
// relay's Close, which also releases the flow handed to it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

// flow is one /v1 request on its way through the pipeline: what the steps
// read and what they hold until release. It lives in forward's frame
// (handOff moves it into a relay) and is used by one goroutine at a time.
type flow struct {
	s     *Server
	route route
	start time.Time
	info  requestInfo // route: the body's fields
	sess  sessionRef  // session: zero for a stateless request
	log   []any       // session: its attributes for the log
	in    []byte      // the client's body
	body  []byte      // the body to forward: in, or rewritten by memory and engine
	// status is the upstream's status, once its answer's head arrived.
	status int
	// retried is set once the upstream refused the first window for the
	// engine's context: a turn is built again at most once.
	retried bool

	// What the steps hold, each until release (record ends turn first
	// when the answer is complete).
	lease func()           // session: the fleet's lease on the session
	turn  *memory.Turn     // memory: the turn, until recorded or failed
	ereq  *engine.Request  // engine: the request the connector saw, until it hears the answer
	eresp *engine.Response // engine: where release puts the answer it hears (with ereq, one allocation)
}

// outcome is how one attempt of a flow ended.
type outcome int

const (
	answered outcome = iota // the response is in ctx: the upstream's answer, or an error the sidecar wrote
	relayed                 // a relay streams the answer and releases the flow when done
	refused                 // the upstream refused the window for the engine's context; nothing reached the client
)

// forward runs one /v1 request through the pipeline. It returns true when
// the answer is streamed: the relay counts the request when it ends.
func (s *Server) forward(ctx *fasthttp.RequestCtx, r route, start time.Time) bool {
	f := flow{s: s, route: r, start: start, in: ctx.Request.Body()}
	s.metrics.bytesIn.Add(uint64(len(f.in)))
	if !f.parse(ctx) || !f.session(ctx) {
		return false // answered; nothing held
	}
	out := f.attempt(ctx)
	if out == refused {
		f.retry(ctx)
		out = f.attempt(ctx) // never refused again: the turn goes as built
	}
	if out == relayed {
		return true
	}
	f.release(f.answer(ctx), false, nil)
	return false
}

// attempt runs the memory, engine and upstream steps once.
func (f *flow) attempt(ctx *fasthttp.RequestCtx) outcome {
	if !f.memory(ctx) {
		return answered
	}
	f.engine(ctx)
	return f.upstream(ctx)
}

// turnRoute reports whether the request is a chat or completions call: the
// engine places it on a slot and a fleet serializes it per session.
func (f *flow) turnRoute(ctx *fasthttp.RequestCtx) bool {
	return (f.route == routeChat || f.route == routeCompletions) && ctx.IsPost()
}

// parse is the route step's reading of the body: the fields the later steps
// need. A body its endpoint cannot take is answered 400.
func (f *flow) parse(ctx *fasthttp.RequestCtx) bool {
	if ep := endpointOf(f.route); ep != epOther && ctx.IsPost() {
		var err error
		if f.info, err = parseRequest(ep, f.in); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_request", err.Error())
			return false
		}
	}
	return true
}

// session is the session step: the request's session (none: stateless)
// and, in a fleet, the session's lease, held for the whole turn (until
// release). It answers 400 for a bad session id and 503 when the lease
// stays with another replica.
func (f *flow) session(ctx *fasthttp.RequestCtx) bool {
	s := f.s
	sess, anonymous, err := s.sessionOf(ctx, f.info)
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
	f.sess = sess
	if sess.ID != "" {
		f.log = []any{"session", sess.ID, "tenant", sess.Tenant}
	}
	if s.opts.Fleet == nil || sess.ID == "" || !f.turnRoute(ctx) {
		return true
	}
	lease, err := s.opts.Fleet.Acquire(s.stopping, sess.Tenant, sess.ID)
	if err != nil && s.stopping.Err() != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "shutting_down", "the sidecar is shutting down; retry")
		return false
	}
	if err != nil {
		s.metrics.fleetBusy.Add(1)
		s.log.Warn("session busy on another replica", append(f.log, "err", err)...)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "session_busy",
			"another replica is serving this session and did not finish in time; retry")
		ctx.Response.Header.Set("Retry-After", "1")
		return false
	}
	f.lease = lease
	return true
}

// memory is the memory step: a session's chat request becomes a turn
// (prepareTurn: the client's new messages recorded, the window built) and
// the body to forward carries the window. It returns false when it
// answered the request; memory failing otherwise forwards the client's
// body unchanged.
func (f *flow) memory(ctx *fasthttp.RequestCtx) bool {
	f.body = f.in
	if f.s.opts.Memory == nil || f.sess.ID == "" || f.route != routeChat || !ctx.IsPost() {
		return true
	}
	turn, body, handled := f.s.prepareTurn(ctx, f.sess, f.info, f.in, f.log)
	if handled {
		return false
	}
	f.turn, f.body = turn, body
	return true
}

// engine is the engine step: the connector's before-hook sees every chat
// and completions request, stateless ones too (a connector that places
// requests on the engine's slots must, or a stateless request could land
// on a slot holding a session's KV), and may rewrite the body. From here
// the connector hears the answer exactly once, in release.
func (f *flow) engine(ctx *fasthttp.RequestCtx) {
	s := f.s
	if s.opts.Engine == nil {
		return
	}
	var native engine.Route
	sessionID := f.sess.ID
	if !f.turnRoute(ctx) {
		// The engine's native API (llama.cpp's /completion, /infill,
		// /slots/{id}): the connector places what runs on its slots, as a
		// stateless request, and keeps its own KV moves off a slot a
		// client acts on.
		if native = s.engine.Route(ctx.Method(), ctx.Request.Header.RequestURI()); native.Kind == engine.RoutePass {
			return
		}
		sessionID = ""
	}
	tenant := f.sess.Tenant
	if tenant == "" { // stateless: the engine still scopes KV reuse by key
		tenant = tenantOf(ctx.Request.Header.Peek("Authorization"))
	}
	ec := &engineCall{req: engine.Request{Tenant: tenant, SessionID: sessionID, Model: f.info.Model, Body: f.body, Start: f.start, Native: native}}
	f.ereq, f.eresp = &ec.req, &ec.resp
	nb, err := s.engine.Before(ctx, f.ereq)
	if err != nil {
		s.log.Warn("engine connector before-hook failed; forwarding anyway", append(f.log, "engine", s.opts.Engine.Name(), "err", err)...)
	}
	if len(nb) > 0 {
		f.body = nb
	}
}

// upstream is the upstream step: one round trip, the answer's head copied
// to the client's response, its body handed to a relay (a stream) or read
// whole (buffer). The upstream request, the client-gone watch and the
// upstream body are released here, or by buffer, or by the relay's Close.
func (f *flow) upstream(ctx *fasthttp.RequestCtx) outcome {
	s := f.s
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	s.upstreamRequest(req, &ctx.Request, f.body)
	if f.turn != nil || f.ereq != nil {
		// The sidecar reads this answer (to record the reply, or for the
		// engine's timings): ask for it uncompressed.
		req.Header.Del("Accept-Encoding")
	}

	x, err := s.up.send(ctx.Conn(), s.metrics.disconnects, req, s.opts.UpstreamTimeout, s.opts.WriteTimeout, s.opts.StreamIdleTimeout)
	if err != nil {
		f.unanswered(ctx, err)
		return answered
	}
	resp := x.body.resp

	f.status = resp.StatusCode()
	ctx.SetStatusCode(f.status)
	copyResponseHeaders(&ctx.Response.Header, &resp.Header)
	if f.status >= 400 {
		s.log.Debug("upstream answered an error", append(f.log, "route", f.route.String(), "status", f.status)...)
	}

	isSSE := bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream"))
	// An engine route the sidecar does not read (its native API, its web
	// UI, NDJSON streams) is relayed as it arrives unless it is small and
	// whole; so is any answer without a length on a streamed request.
	size := resp.Header.ContentLength()
	passOn := f.route == routePassthrough && !ctx.IsHead() && bodyAllowed(f.status) && (size < 0 || size > passBuffered)
	if isSSE || size < 0 && f.info.Stream || passOn {
		if !passOn || size < 0 {
			size = -1
		}
		return f.relayAnswer(ctx, x, isSSE, size)
	}
	return f.buffer(ctx, x)
}

// passBuffered is the largest answer with a length that a pass-through
// route reads whole before answering; larger ones are relayed as they come.
const passBuffered = 64 << 10

// bodyAllowed reports whether an answer of this status may carry a body
// (RFC 9110: not 1xx, 204 or 304).
func bodyAllowed(status int) bool {
	return status >= 200 && status != fasthttp.StatusNoContent && status != fasthttp.StatusNotModified
}

// unanswered answers a request whose upstream round trip failed before
// its answer: 502, or 504 on a timeout; 499, logged only, when the client
// went away first.
func (f *flow) unanswered(ctx *fasthttp.RequestCtx, err error) {
	s := f.s
	status, code, kind := classifyUpstreamError(err)
	if errors.Is(err, errCancelled) {
		s.log.Info("client went away before the upstream answered", append(f.log, "route", f.route.String())...)
		writeError(ctx, statusClientClosed, typeInvalidRequest, "client_closed", "client closed the request")
		return
	}
	s.metrics.countUpstreamError(kind)
	s.log.Warn("upstream request failed", append(f.log, "route", f.route.String(), "kind", kind, "err", err)...)
	msg := upstreamMessage(err)
	if status == fasthttp.StatusGatewayTimeout {
		msg = fmt.Sprintf("upstream did not answer within %s", s.opts.UpstreamTimeout)
	}
	writeError(ctx, status, typeUpstream, code, msg)
}

// buffer reads a whole answer into the client's response (at most
// Options.MaxResponseBytes) and records its reply (record) before the
// handler returns, so before the client can read it. A body that breaks
// is answered 502 or 504 instead. It returns refused for a context error
// answered to the first window: ctx.Response still holds it, for retry.
func (f *flow) buffer(ctx *fasthttp.RequestCtx, x *exchange) outcome {
	s := f.s
	ub := &x.body
	err := readBodyInto(&ctx.Response, ub, s.opts.MaxResponseBytes)
	if ctx.IsHead() && err == nil {
		// No body came; the client hears the length the upstream announced.
		ctx.Response.Header.SetContentLength(ub.resp.Header.ContentLength())
	}
	timedOut := ub.timedO
	x.finish(false)
	if err != nil {
		ctx.Response.Reset()
		if errors.Is(err, errCancelled) {
			writeError(ctx, statusClientClosed, typeInvalidRequest, "client_closed", "client closed the request")
			return answered
		}
		if errors.Is(err, errTooLarge) {
			s.metrics.countUpstreamError(upErrTooLarge)
			writeError(ctx, fasthttp.StatusBadGateway, typeUpstream, "upstream_response_too_large",
				fmt.Sprintf("upstream response exceeds the limit of %d bytes", s.opts.MaxResponseBytes))
			return answered
		}
		status, code, kind := classifyBodyError(err, timedOut)
		s.metrics.countUpstreamError(kind)
		s.log.Warn("upstream body failed", append(f.log, "route", f.route.String(), "kind", kind, "err", err)...)
		writeError(ctx, status, typeUpstream, code, "upstream response broken: "+kind)
		return answered
	}
	if f.turn != nil && !f.retried && !f.turn.Stats.AsSent && f.status >= 400 {
		if ce, ok := parseContextError(f.status, ctx.Response.Body()); ok {
			// The engine's context is smaller than the window: nothing
			// reached the client yet, so build it again for what the
			// error says and send it once more.
			s.limits.learnError(f.info.Model, ce, f.turn.Stats.TotalTokens)
			s.mem.contextRetries.Add(1)
			s.log.Info("the upstream refused the window for its context; building it again for that context", append(f.log,
				"window_tokens", f.turn.Stats.TotalTokens, "engine_ctx", ce.nCtx, "engine_prompt_tokens", ce.nPrompt)...)
			return refused
		}
	}
	s.metrics.ttfb[f.route].observe(time.Since(f.start))
	s.metrics.bytesOut.Add(uint64(len(ctx.Response.Body())))
	if f.recording() {
		raw, cut := replyMessage(ctx.Response.Body(), s.opts.Memory.MaxReplyBytes())
		f.record(ctx.Response.Body(), raw, cut)
	}
	return answered
}

// retry ends the attempt the upstream refused for the engine's context
// (release: the turn fails, the engine hears the refusal) and clears the
// response; the lease stays for the next attempt, whose window is built
// for the context the refusal stated (ctxlimit.go learned it).
func (f *flow) retry(ctx *fasthttp.RequestCtx) {
	lease := f.lease
	f.lease = nil
	f.release(f.answer(ctx), false, nil)
	f.lease, f.retried = lease, true
	ctx.Response.Reset()
}

// recording reports whether the answer's reply goes into the session: a
// turn is open and the upstream answered with success.
func (f *flow) recording() bool { return f.turn != nil && f.status < 300 }

// record is the record step, for a complete answer while recording: the
// reply (raw, a message object; cut: over memory's reply cap) enters the
// session's log before the answer's end reaches the client (issue 12 row
// 15): buffer returns, or the relay passes [DONE], only after it. usage is
// the body or event carrying the engine's prompt counts.
func (f *flow) record(usage, raw []byte, cut bool) {
	f.s.observeContext(f.info.Model, f.turn, usage)
	f.s.recordTurn(f.turn, raw, cut)
	f.turn = nil
}

// answer is what the engine hears of a response the handler wrote.
func (f *flow) answer(ctx *fasthttp.RequestCtx) engine.Response {
	return engine.Response{Status: ctx.Response.StatusCode(), Body: ctx.Response.Body()}
}

// engineCall is what the engine step allocates: the request the connector
// sees and the answer it hears, in one allocation (BenchmarkProxyChatEngine).
type engineCall struct {
	req  engine.Request
	resp engine.Response
}

// release gives back what the steps still hold, once, in this order: the
// turn not recorded (a success answer cut short, partial, records reply
// as partial; any other fails: a turn without an answer is not history,
// the client will retry it), then the engine's after-hook with answer
// and, under a lease, Settle (the turn's KV saved and written through),
// then the lease. What may block runs in that order on the Server's
// background tasks, off the request path; a lease with nothing before it
// is released at once, and so is the after-hook with nothing around it.
func (f *flow) release(answer engine.Response, partial bool, reply []byte) {
	s := f.s
	lease, turn, ereq, eresp := f.lease, f.turn, f.ereq, f.eresp
	f.lease, f.turn, f.ereq, f.eresp = nil, nil, nil, nil
	var rec func()
	if turn != nil {
		if partial {
			rec = func() { s.recordTurn(turn, reply, true) }
		} else {
			s.failTurn(turn)
		}
	}
	if rec == nil && ereq == nil {
		if lease != nil {
			lease()
		}
		return
	}
	if rec == nil && lease == nil {
		// Only the after-hook is left, which never blocks (engine.PostResponse):
		// called here, it costs no goroutine and no copy of the answer (a
		// stateless request's whole release; BenchmarkProxyChatEngine).
		*eresp = answer
		s.engine.After(context.Background(), ereq, eresp)
		eresp.Body = nil
		return
	}
	var resp *engine.Response
	if ereq != nil {
		// A copy: the response's buffer is reused once the handler returns.
		resp = &engine.Response{Status: answer.Status, Stream: answer.Stream, Body: append([]byte(nil), answer.Body...)}
	}
	s.bg.run(func() {
		if rec != nil {
			rec()
		}
		if ereq != nil {
			s.engine.After(context.Background(), ereq, resp)
			if lease != nil {
				s.engine.Settle(context.Background(), ereq)
			}
		}
		if lease != nil {
			lease()
		}
	})
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

// statusClientClosed is logged and counted for requests whose client went
// away before the answer (nginx's 499); the client never sees it.
const statusClientClosed = 499

// upstreamRequest builds the request to the upstream: same method, the raw
// path (the one routing read) and query under the upstream's base path,
// end-to-end headers, the body unchanged (not copied: body must outlive
// req's use). An absolute-form request target is sent in origin form.
func (s *Server) upstreamRequest(req *fasthttp.Request, in *fasthttp.Request, body []byte) {
	req.Header.DisableNormalizing()
	req.Header.SetNoDefaultContentType(true) // none the client did not send
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
