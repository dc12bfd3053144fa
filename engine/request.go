package engine

import (
	"context"
	"errors"
	"time"
)

// Request is one chat or completions request the proxy forwards, as a
// connector's hooks see it. The proxy makes one per request, passes the
// same pointer to Before and then to After, and does not share it between
// requests.
type Request struct {
	// Tenant scopes SessionID (a hash of the bearer token). SessionID is
	// the session (X-Session-ID or prompt_cache_key); empty means a
	// stateless request, which connectors pass through untouched.
	Tenant, SessionID string
	// Model is the request's "model" field.
	Model string
	// Body is the JSON request body the proxy is about to forward. It is
	// valid only during Before: the proxy reuses its buffer afterwards.
	Body []byte
	// Background marks the sidecar's own calls (summaries, extraction,
	// reviews) made on behalf of the session: a connector places them so
	// that they never cost a session its KV, nor a client its turn.
	Background bool
	// Start is when the client's request arrived; zero on the sidecar's
	// own calls. A connector that needs the time of a request reads it
	// here rather than the clock (a clock read is 2% of the pass-through
	// path's CPU, make bench-proxy-wrk).
	Start time.Time
	// Cancel, on a Background request, cancels the context the caller
	// sends the call under. A connector that gives the call's slot to a
	// client request calls it with ErrPreempted (the engine stops
	// generating when the connection closes); the caller may send the
	// call again later. Nil: the call cannot be taken back, and a client
	// needing its slot waits for it.
	Cancel context.CancelCauseFunc
	// Native is the Router's word on a request to the engine's native API
	// (zero: an OpenAI chat or completions request).
	Native Route

	// State belongs to the connector the request is given to: Before keeps
	// there what After needs (its slot, what it restored). Callers leave
	// it alone; a connector that finds none in After treats the request
	// as one it did not place.
	State any
}

// ErrPreempted is the cause a connector cancels a Background request's
// context with (Request.Cancel) when a client request takes its slot.
var ErrPreempted = errors.New("engine: background call preempted by a client request")

// ErrBusy is returned by Before for a Background request that found no
// slot it may use (every slot serving clients) before its context ended:
// the call must not be sent; After is still due.
var ErrBusy = errors.New("engine: no slot free for a background call")

// Response is what the proxy saw of the upstream's answer to a Request.
type Response struct {
	// Status is the upstream's HTTP status; 0 when it never answered.
	Status int
	// Stream is true for an SSE response.
	Stream bool
	// Body is the JSON body of a non-streamed response or, for a stream,
	// the last data event(s) carrying "timings" or "usage" (raw "data: …"
	// lines are accepted too). It may be nil or truncated: After then
	// records no timings. It is valid only during After (the proxy reuses
	// its buffer): a connector copies what it keeps.
	Body []byte
}

// ProbeUserAgent is the User-Agent of the sidecar's requests that ask the
// engine what it is (its context, its slots), so an upstream's logs and
// scripted upstreams in tests can tell them from client traffic.
const ProbeUserAgent = "kvsidecar-context-probe"
