package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/frontdoor"
)

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

// newUpClient builds the pooled client for the upstream base URL.
func newUpClient(base *url.URL, o *Options) *upClient {
	addr := base.Host
	if base.Port() == "" {
		if base.Scheme == "https" {
			addr = net.JoinHostPort(base.Hostname(), "443")
		} else {
			addr = net.JoinHostPort(base.Hostname(), "80")
		}
	}
	u := &upClient{addr: addr, dialTimeout: o.DialTimeout, maxIdle: o.MaxIdleConnsPerHost, idleFor: o.UpstreamIdleTimeout, now: time.Now}
	if base.Scheme == "https" {
		u.tls = &tls.Config{ServerName: base.Hostname(), MinVersion: tls.VersionTLS12}
	}
	return u
}

// copyRequestHeaders copies end-to-end headers from the client's request
// (frontdoor.HopByHop: byte comparisons, no canonical copy of a name: a
// request of an OpenAI SDK, 15 headers, is copied in a fraction of the
// time and allocations; BenchmarkCopyHeaders).
func copyRequestHeaders(dst *fasthttp.RequestHeader, src *fasthttp.RequestHeader) {
	conn := src.Peek("Connection")
	for k, v := range src.All() {
		if frontdoor.HopByHop(k, conn) || frontdoor.FoldEq(k, "Host") || frontdoor.FoldEq(k, "Content-Length") || frontdoor.FoldEq(k, "Expect") {
			continue // the sidecar already holds the body: no 100-continue upstream
		}
		dst.AddBytesKV(k, v)
	}
}

// copyResponseHeaders copies end-to-end headers from the upstream's response.
func copyResponseHeaders(dst *fasthttp.ResponseHeader, src *fasthttp.ResponseHeader) {
	conn := src.Peek("Connection")
	for k, v := range src.All() {
		if frontdoor.HopByHop(k, conn) || frontdoor.FoldEq(k, "Content-Length") {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// classifyUpstreamError maps a failed round trip to a status, an error code
// and a metrics kind.
func classifyUpstreamError(err error) (status int, code, kind string) {
	var bad *badResponseError
	switch {
	case isTimeout(err):
		return fasthttp.StatusGatewayTimeout, "upstream_timeout", upErrTimeout
	case errors.As(err, &bad):
		return fasthttp.StatusBadGateway, "upstream_bad_response", upErrBadResponse
	}
	return fasthttp.StatusBadGateway, "upstream_unreachable", upErrUnreachable
}

// upstreamMessage is what a client reads about a failed round trip. It
// never carries the upstream's bytes (fasthttp's parse errors quote the
// head they refused; the log has them), only what the sidecar did.
func upstreamMessage(err error) string {
	var (
		bad     *badResponseError
		cut     *cutResponseError
		nothing *noResponseError
		dial    *dialError
	)
	switch {
	case isTimeout(err):
		return "upstream did not answer in time"
	case errors.As(err, &bad) && bad.tooLarge:
		return fmt.Sprintf("upstream response headers exceed %d KiB", maxHeadBytes>>10)
	case errors.As(err, &bad):
		return "upstream sent a malformed response (its status line or headers are not valid HTTP/1.1)"
	case errors.As(err, &cut):
		return "upstream closed the connection in the middle of its response headers"
	case errors.As(err, &nothing):
		return "upstream closed the connection without answering"
	case errors.As(err, &dial):
		return "upstream unreachable: " + dial.Error()
	}
	return "upstream unreachable"
}

// classifyBodyError maps a failure while reading an upstream response body:
// a timeout, or a broken response.
func classifyBodyError(err error, timedOut bool) (status int, code, kind string) {
	if timedOut {
		return fasthttp.StatusGatewayTimeout, "upstream_timeout", upErrTimeout
	}
	status, code, kind = classifyUpstreamError(err)
	if kind == upErrUnreachable {
		return fasthttp.StatusBadGateway, "upstream_stream_broken", upErrBroken
	}
	return status, code, kind
}

// readAllLimit reads r to the end, at most limit bytes.
func readAllLimit(r io.Reader, limit int64) ([]byte, error) {
	var b []byte
	err := readLimited(r, limit, func(p []byte) { b = append(b, p...) })
	return b, err
}

var errTooLarge = errors.New("upstream response exceeds the size limit")

// copyBufs recycles buffers for reading buffered upstream bodies.
var copyBufs = sync.Pool{New: func() any { return new([16 << 10]byte) }}

// readBodyInto reads r to the end into dst's body, at most limit bytes,
// with no buffer of its own beyond a pooled one.
func readBodyInto(dst *fasthttp.Response, r io.Reader, limit int64) error {
	dst.ResetBody()
	return readLimited(r, limit, func(p []byte) { dst.AppendBody(p) })
}

// readLimited hands each piece of r to emit until EOF, failing with
// errTooLarge past limit bytes. The pieces are only valid during emit.
func readLimited(r io.Reader, limit int64, emit func([]byte)) error {
	buf := copyBufs.Get().(*[16 << 10]byte)
	defer copyBufs.Put(buf)
	var n int64
	for {
		k, err := r.Read(buf[:])
		n += int64(k)
		if n > limit {
			return errTooLarge
		}
		emit(buf[:k])
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// maxHeadBytes bounds a response head read by rereadHead, past the
// connection buffer's 32 KiB: the event loop's bound too.
const maxHeadBytes = frontdoor.MaxAnswerHead

var errHeadTooLarge = errors.New("response head too large")

// readHead reads one response head (status line, headers, the empty line)
// from br, at most limit bytes.
func readHead(br *bufio.Reader, limit int) ([]byte, error) {
	var head []byte
	line := 0 // where the current line starts
	for {
		chunk, err := br.ReadSlice('\n')
		if len(head)+len(chunk) > limit {
			return nil, errHeadTooLarge
		}
		head = append(head, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil, err
		}
		if l := head[line:]; line > 0 && (len(l) == 1 || len(l) == 2 && l[0] == '\r') {
			return head, nil
		}
		line = len(head)
	}
}

// hasHeaderLine reports whether a line of b (after the first) names the
// header name, in any case.
func hasHeaderLine(b []byte, name string) bool {
	first := true
	for l := range bytes.Lines(b) {
		if first {
			first = false
			continue
		}
		if k, _, ok := bytes.Cut(l, []byte(":")); ok && bytes.EqualFold(bytes.TrimRight(k, " \t"), []byte(name)) {
			return true
		}
	}
	return false
}
