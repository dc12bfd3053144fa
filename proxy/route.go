package proxy

import (
	"bytes"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/httpapi"
	"github.com/valyala/fasthttp"
)

// Routing reads the request path once, as the client sent it (escaped, not
// normalised), and every handler works from that same reading:
//
//   - A path whose first two segments are v1 and sessions, pool or kv (each
//     compared after percent-decoding) belongs to the sidecar and is never
//     forwarded. Its handler gets the remaining segments, each decoded on
//     its own, so "/v1/sessions/.." names the session "..", and
//     "/v1/sessions/a%2Fb" the session "a/b".
//   - Any other path is the engine's and is forwarded exactly as sent
//     (not an allowlist: an engine route added next year passes too),
//     unless it holds a dot segment ("." or "..", escaped or not), a
//     malformed escape, or a reading another server may give it
//     (fasthttp's normalisation; full decoding with backslashes as
//     slashes, then cleaning) that is a sidecar route: such paths are
//     ambiguous between servers and get 400 invalid_path.
//   - /healthz, /readyz and /mcp (404 with the MCP server off) match the raw
//     path exactly; the operational endpoints (/metrics, the console, the
//     admin API) are on the admin listener only.
//
// Without this, a path such as /v1/kv/ns/../../etc/passwd was routed by its
// normalised form (/v1/etc/passwd, a passthrough) and forwarded raw, with
// the client's Authorization, to the upstream.

// handle is the route step: it counts the request in flight, reads the raw
// path once and hands the request to its room: the ops endpoints, /mcp,
// the console, the sidecar's own state APIs (route.go), or, for any other
// /v1 path, the forward path (forward.go). Every request is counted as it
// ends, here or, for a streamed answer, by the relay's Close.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	s.metrics.inFlight.Add(1)
	if r, streaming := s.dispatch(ctx, start); !streaming {
		s.finish(r, ctx.Response.StatusCode(), start)
	}
}

// dispatch serves ctx by its path and returns its route; streaming is true
// when a relay finishes the request. The main listener's own surface is
// /healthz, /readyz, /mcp (404 without Options.MCP) and the client APIs under
// /v1/sessions, /v1/pool and /v1/kv; every other path is the engine's and
// is forwarded as sent (route.go's rules aside), whatever its method.
// The sidecar's operational endpoints live on the admin listener
// (package admin), so none of them shadows an engine route such as /metrics.
func (s *Server) dispatch(ctx *fasthttp.RequestCtx, start time.Time) (r route, streaming bool) {
	// One reading of the path for routing and handling: the path as sent.
	raw := ctx.URI().PathOriginal()
	switch string(raw) {
	case "/healthz":
		s.HandleHealth(ctx)
		return routeHealthz, false
	case "/readyz":
		s.HandleReady(ctx)
		return routeReadyz, false
	case "/mcp": // no engine serves it (llama.cpp, vLLM, SGLang, Ollama): the sidecar's, on or off
		s.handleMCP(ctx)
		return routeMCP, false
	}
	if r, tail, ok := ownedRoute(raw); ok {
		limit := s.opts.MaxBodyBytes
		switch {
		case r == routeKV:
			limit = s.opts.MaxKVBytes
		case r == routeSessions && isSnapshotPath(tail):
			limit = s.opts.MaxSnapshotBytes
		}
		if !httpapi.TooLarge(ctx, limit) {
			switch r {
			case routeSessions:
				s.handleSessions(ctx, tail)
			case routePool:
				s.handlePool(ctx, tail)
			default:
				s.handleKV(ctx, tail)
			}
		}
		return r, false
	}
	if !forwardable(raw, ctx.Path()) {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_path",
			"the path holds dot segments or escapes that servers read differently; send it normalised")
		return routePassthrough, false
	}
	r = classify(raw)
	if httpapi.TooLarge(ctx, s.opts.MaxBodyBytes) {
		return r, false
	}
	return r, s.forward(ctx, r, start)
}

// ownedRoute reports whether the raw path's first segments name a sidecar
// route, and which; tail is the raw rest after it (after "/v1/kv", say,
// tail is "" or starts with '/').
func ownedRoute(raw []byte) (r route, tail []byte, ok bool) {
	seg0, rest, ok0 := nextSegment(raw)
	if !ok0 || !segmentIs(seg0, "v1") {
		return 0, nil, false
	}
	seg1, rest, ok1 := nextSegment(rest)
	if !ok1 {
		return 0, nil, false
	}
	switch {
	case segmentIs(seg1, "sessions"):
		return routeSessions, rest, true
	case segmentIs(seg1, "pool"):
		return routePool, rest, true
	case segmentIs(seg1, "kv"):
		return routeKV, rest, true
	}
	return 0, nil, false
}

// classify names the OpenAI route of a raw path that is not the sidecar's
// own, segment by segment after decoding (routing and the upstream read
// "/v1/chat/c%6Fmpletions" alike); any other path is a pass-through.
func classify(raw []byte) route {
	v1, rest, _ := nextSegment(raw)
	if !segmentIs(v1, "v1") {
		return routePassthrough
	}
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

// isSnapshotPath reports whether tail, the raw path after /v1/sessions,
// names a session's snapshot (/{id}/snapshot), whose body bound is
// Options.MaxSnapshotBytes.
func isSnapshotPath(tail []byte) bool {
	_, rest, ok := nextSegment(tail)
	if !ok {
		return false
	}
	seg, rest, ok := nextSegment(rest)
	return ok && rest == nil && segmentIs(seg, "snapshot")
}

// nextSegment splits "/seg/rest" into seg and "/rest"; ok is false when p
// does not start with '/'.
func nextSegment(p []byte) (seg, rest []byte, ok bool) {
	if len(p) == 0 || p[0] != '/' {
		return nil, nil, false
	}
	p = p[1:]
	if i := bytes.IndexByte(p, '/'); i >= 0 {
		return p[:i], p[i:], true
	}
	return p, nil, true
}

// segmentIs reports whether the escaped segment seg decodes to lit, without
// allocating.
func segmentIs(seg []byte, lit string) bool {
	j := 0
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c == '%' {
			if i+2 >= len(seg) {
				return false
			}
			h, l := unhex(seg[i+1]), unhex(seg[i+2])
			if h < 0 || l < 0 {
				return false
			}
			c = byte(h<<4 | l)
			i += 2
		}
		if j >= len(lit) || lit[j] != c {
			return false
		}
		j++
	}
	return j == len(lit)
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// hasDotSegment reports whether the raw path holds a dot segment ("." or
// ".."), counting escaped dots and segments made by escaped slashes or
// backslashes ("a%2F..%2Fb"), which some servers split on.
func hasDotSegment(raw []byte) bool {
	var buf [64]byte
	for p := raw; len(p) > 0; {
		seg, rest, ok := nextSegment(p)
		if !ok {
			return false
		}
		p = rest
		if bytes.IndexByte(seg, '.') < 0 && !bytes.Contains(seg, []byte("%2")) && !bytes.Contains(seg, []byte("%5")) {
			continue // no dot, no escaped dot, slash or backslash
		}
		dec := buf[:0]
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if c == '%' && i+2 < len(seg) && unhex(seg[i+1]) >= 0 && unhex(seg[i+2]) >= 0 {
				c = byte(unhex(seg[i+1])<<4 | unhex(seg[i+2]))
				i += 2
			}
			dec = append(dec, c)
		}
		// The decoded segment split at slashes and backslashes.
		start := 0
		for i := 0; i <= len(dec); i++ {
			if i < len(dec) && dec[i] != '/' && dec[i] != '\\' {
				continue
			}
			if part := dec[start:i]; string(part) == "." || string(part) == ".." {
				return true
			}
			start = i + 1
		}
	}
	return false
}

// validEscapes reports whether every '%' in p starts a two-digit hex
// escape (RFC 3986); servers answer other paths differently (Go's closes
// the connection after a 400).
func validEscapes(p []byte) bool {
	for i := 0; i < len(p); i++ {
		if p[i] == '%' {
			if i+2 >= len(p) || unhex(p[i+1]) < 0 || unhex(p[i+2]) < 0 {
				return false
			}
			i += 2
		}
	}
	return true
}

// forwardable reports whether a path that is not a sidecar route may go to
// the upstream as sent: no dot segment, no malformed escape, and no
// reading a server may give it — norm (fasthttp's normalisation), and the
// path fully decoded with backslashes as slashes and cleaned — names a
// sidecar route.
func forwardable(raw, norm []byte) bool {
	if hasDotSegment(raw) || !validEscapes(raw) {
		return false
	}
	if bytes.Equal(raw, norm) && bytes.IndexByte(raw, '\\') < 0 {
		return true // the common case: nothing to read differently
	}
	dec, err := url.PathUnescape(string(raw))
	if err != nil {
		return false
	}
	loose := path.Clean(strings.ReplaceAll(dec, `\`, "/"))
	for _, reading := range [][]byte{norm, []byte(loose)} {
		if _, _, owned := ownedRoute(reading); owned || sidecarPath(reading) {
			return false
		}
	}
	return true
}

// sidecarPath reports whether p is one of the sidecar's own exact paths on
// the main listener.
func sidecarPath(p []byte) bool {
	switch string(p) {
	case "/healthz", "/readyz", "/mcp":
		return true
	}
	return false
}

// pathSegments decodes the segments of tail ("/a/b%2Fc" → ["a", "b/c"]).
// An empty tail gives none; a trailing slash gives a last empty segment.
// isDotName reports whether a decoded segment is "." or "..".
var (
	pathSegments = httpapi.PathSegments
	isDotName    = httpapi.IsDotName
)
