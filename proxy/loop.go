package proxy

// The pass-through on the front door's event loop (Options.EventLoop,
// frontdoor.Loop; docs/DESIGN.md, "The pass-through on the front door's
// event loop"): which requests the loop serves, decided here alone, and
// the proxy's side of each (loopBackend, a frontdoor.Backend): the engine's
// hooks, the metrics, the OpenAI-shaped errors — the same as the forward
// path's, so that a request reads the same answer on either path
// (TestEventLoopMatchesFasthttp).
//
// Why a loop of its own: on a small machine the proxy's CPU per request is
// its latency, and Go's poller wakes a goroutine per socket event; the
// loop keeps readiness per socket and serves the pass-through at 1.2–1.3
// times the fasthttp path's requests/s for 0.7 of its CPU per request
// (make bench-proxy-wrk and bench-proxy-ceiling, docs/BENCHMARKS.md).

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/frontdoor"
)

// startLoop starts the loop on ln when Options.EventLoop asks and the
// server allows; it returns the listener fasthttp serves (ln through the
// front door without the loop; with it, the loop's hand-overs) and the
// loop. Serve calls it with loopMu held.
func (s *Server) startLoop(ln net.Listener) (net.Listener, *frontdoor.Loop) {
	if !s.opts.EventLoop {
		return s.FrontListener(ln), nil
	}
	o, why := s.loopOptions(ln)
	if why != "" {
		s.log.Warn("event loop off: "+why+"; serving on Go's poller", "upstream", s.opts.Upstream)
		return s.FrontListener(ln), nil
	}
	l, err := frontdoor.StartLoop(ln.(*net.TCPListener), o, loopBackend{s})
	if err != nil {
		s.log.Warn("event loop off; serving on Go's poller", "err", err)
		return s.FrontListener(ln), nil
	}
	s.loop = l
	return l, l
}

// loopOptions are the loop's options for ln, or why the loop cannot serve
// this server: it needs a TCP listener, a plain-HTTP upstream at an IP
// address (the loop resolves no name and speaks no TLS) and an engine
// connector whose hooks never block (engine.NonBlocking), or none.
func (s *Server) loopOptions(ln net.Listener) (o frontdoor.LoopOptions, why string) {
	if _, ok := ln.(*net.TCPListener); !ok {
		return o, "the listener is not TCP"
	}
	if s.base.Scheme != "http" {
		return o, "the upstream is not plain HTTP"
	}
	ip, err := netip.ParseAddr(s.base.Hostname())
	if err != nil || ip.Zone() != "" {
		return o, "the upstream is named, not an IP address"
	}
	if !s.engine.NeverBlocks() {
		return o, "the engine connector's hooks may block (it does not say engine.NonBlocking)"
	}
	port := uint64(80)
	if p := s.base.Port(); p != "" {
		port, _ = strconv.ParseUint(p, 10, 16)
	}
	return frontdoor.LoopOptions{
		Front:               s.frontOptions(),
		Upstream:            netip.AddrPortFrom(ip, uint16(port)),
		BasePath:            s.basePath,
		Host:                s.base.Host,
		MaxBody:             int64(s.opts.MaxBodyBytes),
		MaxAnswer:           s.opts.MaxResponseBytes,
		IdleTimeout:         s.opts.IdleTimeout,
		WriteTimeout:        s.opts.WriteTimeout,
		DialTimeout:         s.opts.DialTimeout,
		UpstreamTimeout:     s.opts.UpstreamTimeout,
		StreamIdleTimeout:   s.opts.StreamIdleTimeout,
		UpstreamIdleTimeout: s.opts.UpstreamIdleTimeout,
		MaxIdleUpstream:     s.opts.MaxIdleConnsPerHost,
		Logger:              s.log,
	}, ""
}

// loopBackend is the proxy as the loop sees it.
type loopBackend struct{ s *Server }

// Eligible is the first half of which requests the loop serves: from the
// head, a POST to /v1/chat/completions or /v1/completions exactly as
// written (no query, escape or dot segment: classify's reading would be
// the same, but the upstream's target is the one sent) with a
// Content-Type (the forward path sends none the client did not). The
// loop has taken only HTTP/1.1 with a Content-Length body within
// MaxBodyBytes.
func (b loopBackend) Eligible(r *frontdoor.Request) bool {
	h, buf := &r.Head, r.Buf
	if string(h.Method(buf)) != fasthttp.MethodPost {
		return false
	}
	switch string(h.Target(buf)) {
	case "/v1/chat/completions":
		r.Route = int(routeChat)
	case "/v1/completions":
		r.Route = int(routeCompletions)
	default:
		return false
	}
	ct, ok := h.Get(buf, "Content-Type")
	return ok && len(ct) > 0
}

// Start is the second half, from the body: one the forward path would
// send on unchanged, with no session (sessionKey: neither X-Session-ID nor
// prompt_cache_key) and no stream (a stream keeps the relay); a body
// parseRequest refuses keeps the forward path's 400. Then the request
// starts as the forward path's does: counted in flight, its bytes, and the
// engine's before-hook with the bearer's tenant.
func (b loopBackend) Start(r *frontdoor.Request) bool {
	s := b.s
	info, err := parseRequest(endpointOf(route(r.Route)), r.Body)
	if err != nil || info.Stream {
		return false
	}
	if sid, _ := r.Head.Get(r.Buf, "X-Session-ID"); sessionKey(sid, info) != "" {
		return false
	}
	s.metrics.inFlight.Add(1)
	s.metrics.bytesIn.Add(uint64(len(r.Body)))
	if s.engine == nil {
		return true
	}
	auth, _ := r.Head.Get(r.Buf, "Authorization")
	ec := &engineCall{req: engine.Request{Tenant: tenantOf(auth), Model: info.Model, Body: r.Body, Start: r.Start}}
	nb, err := s.engine.Before(context.Background(), &ec.req)
	if err != nil {
		s.log.Warn("engine connector before-hook failed; forwarding anyway", "engine", s.opts.Engine.Name(), "err", err)
	}
	if len(nb) > 0 {
		r.Send = nb
	}
	r.Uncompressed = true // the engine reads the answer
	r.Call = ec
	return true
}

// End is the upstream's answer: its time to the first byte (the whole
// answer, read at once), its bytes, then the request's end.
func (b loopBackend) End(r *frontdoor.Request, status int, body []byte) {
	s := b.s
	s.metrics.ttfb[route(r.Route)].observe(r.End.Sub(r.Start))
	s.metrics.bytesOut.Add(uint64(len(body)))
	b.end(r, status, body)
}

// Fail is a request without the upstream's answer: the error the forward
// path answers for the same failure (classifyUpstreamError,
// classifyBodyError, upstreamMessage), counted and logged as there.
func (b loopBackend) Fail(r *frontdoor.Request, f frontdoor.Failure) (status int, body []byte) {
	s := b.s
	rt := route(r.Route)
	switch f.Kind {
	case frontdoor.FailShutdown:
		status = statusClientClosed
	case frontdoor.FailClientGone:
		s.metrics.disconnects.Add(1)
		s.log.Info("client went away before the upstream answered", "route", rt.String())
		status, body = statusClientClosed, errorJSON(typeInvalidRequest, "client_closed", "client closed the request")
	case frontdoor.FailTooLarge:
		s.metrics.countUpstreamError(upErrTooLarge)
		status, body = fasthttp.StatusBadGateway, errorJSON(typeUpstream, "upstream_response_too_large",
			fmt.Sprintf("upstream response exceeds the limit of %d bytes", s.opts.MaxResponseBytes))
	case frontdoor.FailBody, frontdoor.FailBodyTimeout:
		err := f.Err
		if err == nil {
			err = os.ErrDeadlineExceeded
		}
		st, code, kind := classifyBodyError(err, f.Kind == frontdoor.FailBodyTimeout)
		s.metrics.countUpstreamError(kind)
		s.log.Warn("upstream body failed", "route", rt.String(), "kind", kind, "err", err)
		status, body = st, errorJSON(typeUpstream, code, "upstream response broken: "+kind)
	default:
		err := upstreamError(f)
		st, code, kind := classifyUpstreamError(err)
		s.metrics.countUpstreamError(kind)
		s.log.Warn("upstream request failed", "route", rt.String(), "kind", kind, "err", err)
		msg := upstreamMessage(err)
		if st == fasthttp.StatusGatewayTimeout {
			msg = fmt.Sprintf("upstream did not answer within %s", s.opts.UpstreamTimeout)
		}
		status, body = st, errorJSON(typeUpstream, code, msg)
	}
	b.end(r, status, body)
	return status, body
}

// upstreamError is the failure of an exchange before an answer's head as
// the forward path's client would have returned it.
func upstreamError(f frontdoor.Failure) error {
	switch f.Kind {
	case frontdoor.FailDial:
		return &dialError{err: f.Err}
	case frontdoor.FailNoAnswer:
		return &noResponseError{err: f.Err}
	case frontdoor.FailCutHead:
		return &cutResponseError{err: f.Err}
	case frontdoor.FailBadHead:
		return &badResponseError{err: f.Err}
	case frontdoor.FailHeadTooLarge:
		return &badResponseError{err: errHeadTooLarge, tooLarge: true}
	}
	return os.ErrDeadlineExceeded // FailTimeout
}

// Retried counts a request sent again after a stale pooled connection, in
// the same counter as the forward path's.
func (b loopBackend) Retried() { b.s.up.retries.Add(1) }

// end is a request's end: the engine hears the answer, the metrics count
// it, as the forward path's release and finish do.
func (b loopBackend) end(r *frontdoor.Request, status int, body []byte) {
	s := b.s
	if ec, ok := r.Call.(*engineCall); ok {
		r.Call = nil
		ec.resp = engine.Response{Status: status, Body: body}
		s.engine.After(context.Background(), &ec.req, &ec.resp)
	}
	s.metrics.inFlight.Add(-1)
	s.metrics.countRequest(route(r.Route), status, r.End.Sub(r.Start))
	s.quiet.poke()
}
