package proxy

// The forward path: one /v1 request through a short pipeline of steps, each
// one function of flow, in the file of the work it does. This file holds
// the pipeline (forward, attempt), the engine step, and release:
//
//	route     the room for the path; the body's fields     handle, dispatch (route.go), parse (wire.go)
//	session   the session and tenant; a fleet's lease      session (session.go)
//	memory    the turn; its window becomes the messages    memory (memory.go)
//	engine    the connector's before-hook                  engine (here)
//	upstream  one round trip                               upstream (upstream.go; the client: upclient.go)
//	relay     the answer streamed event by event, or read  relayAnswer (relay.go, stream.go), buffer (upstream.go)
//	record    the reply into the session, durably, before  record (memory.go)
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
	"context"
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
