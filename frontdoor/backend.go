package frontdoor

import (
	"errors"
	"log/slog"
	"net/netip"
	"time"
)

// Backend is the server behind the event loop (the proxy), as the loop
// sees it: which requests the loop serves, and what the server does at
// each one's start and end. The loop calls it from its one thread, so no
// method may block (an engine hook that could wait keeps the loop off:
// the proxy asks engine.Hooks.NeverBlocks).
//
// Every request the loop reads goes: Eligible (its head) → the body read →
// Start (the whole request) → the upstream exchange → End or Fail, exactly
// once. A false from Eligible or Start hands the connection over, with the
// bytes read, before anything of that request went upstream.
type Backend interface {
	// Eligible reports, from the head alone (r.Body nil), whether the loop
	// may serve the request: only then is its body read. It may set
	// r.Route.
	Eligible(r *Request) bool
	// Start reports, from the whole request, whether the loop serves it
	// and, when it does, starts it: r.Send, r.Uncompressed and r.Call are
	// the Backend's to set. It decides the rest of eligibility: a request
	// the loop would not send as the Backend's own path sends it is
	// handed over.
	Start(r *Request) bool
	// End ends a started request with the upstream's answer: its status
	// and the body the client gets.
	End(r *Request, status int, body []byte)
	// Fail ends a started request that got no answer the client may have
	// (f says why) and returns the status and the JSON error body the
	// client gets; for FailClientGone and FailShutdown the client gets
	// nothing.
	Fail(r *Request, f Failure) (status int, body []byte)
	// Retried counts a request sent once more, on a new upstream
	// connection, after a reused one failed before any byte of an answer.
	Retried()
}

// Request is one request the loop read, as its Backend sees it. The loop
// owns it (one per client connection, reused); a Backend keeps nothing of
// it past End or Fail.
type Request struct {
	// Head is the request's head as Parse read it; its accessors take Buf.
	Head Head
	// Buf holds the head, then the body.
	Buf []byte
	// Body is the body as the client sent it; nil while only the head is
	// read (Eligible).
	Body []byte
	// Start is the loop's clock when the request was read whole, End when
	// it ended (set before End and Fail): one clock reading per wake-up
	// of the loop, shared by the requests it served.
	Start, End time.Time

	// Set by the Backend in Start (and Route in Eligible).

	// Send is the body to send upstream (Body when nil).
	Send []byte
	// Uncompressed asks the upstream for an answer without a content
	// coding (the client's Accept-Encoding is not sent): the Backend
	// reads the answer.
	Uncompressed bool
	// Route and Call are the Backend's own, kept for End and Fail.
	Route int
	Call  any
}

// Failure is why a started request got no answer from the upstream.
type Failure struct {
	Kind FailKind
	// Err is the underlying error, where there is one: a system call's,
	// os.ErrDeadlineExceeded for a connect that timed out, or what the
	// answer's bytes broke.
	Err error
}

// FailKind names a Failure.
type FailKind uint8

const (
	// FailDial: no connection to the upstream (socket, connect, or the
	// connect's timeout: Err).
	FailDial FailKind = iota
	// FailTimeout: no answer's head within LoopOptions.UpstreamTimeout.
	FailTimeout
	// FailNoAnswer: the request could not be written, or the connection
	// ended before any byte of an answer.
	FailNoAnswer
	// FailCutHead: the connection ended within the answer's head.
	FailCutHead
	// FailBadHead: an answer head the forward path's client refuses too,
	// even read leniently (RepairFraming).
	FailBadHead
	// FailHeadTooLarge: an answer head past MaxAnswerHead.
	FailHeadTooLarge
	// FailBody: the answer's body broke after its head (closed, reset,
	// malformed chunked framing).
	FailBody
	// FailBodyTimeout: the body stopped for LoopOptions.StreamIdleTimeout.
	FailBodyTimeout
	// FailTooLarge: the body passed LoopOptions.MaxAnswer.
	FailTooLarge
	// FailClientGone: the client left before the answer; its connection
	// is closed.
	FailClientGone
	// FailShutdown: the loop closed with the request under way.
	FailShutdown
)

// MaxAnswerHead bounds an upstream answer's head, as the proxy's client
// bounds one it reads again (curl takes up to 300 KiB).
const MaxAnswerHead = 256 << 10

// LoopOptions configure a Loop. Every zero value is a documented default;
// Upstream and Host are required (StartLoop applies EnsureDefaults and
// Validate).
type LoopOptions struct {
	// Front reads the connections the loop hands over (Options.Limits,
	// ReadTimeout, Reject, Linger) and bounds the loop's own reading the
	// same way: a request not read whole within Front.ReadTimeout of its
	// first byte is answered 408 with Front.Reject.
	Front Options
	// Upstream is the upstream's address: an IP address and a port; the
	// loop resolves no name. Required.
	Upstream netip.AddrPort
	// BasePath is put before each request's target upstream (a path
	// without a trailing "/", as sent on the wire); Host is the upstream
	// request's Host. Host is required.
	BasePath, Host string
	// MaxBody bounds the body the loop reads: a request with a longer one
	// is handed over. Zero or negative: 32 MiB.
	MaxBody int64
	// MaxAnswer bounds an answer's body (FailTooLarge beyond). Zero or
	// negative: 256 MiB.
	MaxAnswer int64
	// IdleTimeout closes a client connection idle between requests;
	// WriteTimeout bounds writing an answer. Zero: no bound.
	IdleTimeout, WriteTimeout time.Duration
	// DialTimeout bounds a connect, UpstreamTimeout the wait for an
	// answer's head, StreamIdleTimeout the wait for more of its body.
	// Zero: no bound.
	DialTimeout, UpstreamTimeout, StreamIdleTimeout time.Duration
	// UpstreamIdleTimeout closes a pooled upstream connection idle that
	// long (below the upstreams' own bounds: llama-server and uvicorn
	// close theirs after 5 s). Zero or negative: 2 s.
	UpstreamIdleTimeout time.Duration
	// MaxIdleUpstream bounds the pooled upstream connections. Zero or
	// negative: 256.
	MaxIdleUpstream int
	// Logger hears what the loop itself does wrong (a failed accept, a
	// failed hand-over); nil: nothing is logged. A request's failures are
	// the Backend's to log.
	Logger *slog.Logger
}

// EnsureDefaults fills every zero field with its documented default, Front's
// included, and returns o. StartLoop calls it; calling it twice changes
// nothing.
func (o *LoopOptions) EnsureDefaults() *LoopOptions {
	o.Front.EnsureDefaults()
	if o.MaxBody <= 0 {
		o.MaxBody = 32 << 20
	}
	if o.MaxAnswer <= 0 {
		o.MaxAnswer = 256 << 20
	}
	if o.UpstreamIdleTimeout <= 0 {
		o.UpstreamIdleTimeout = 2 * time.Second
	}
	if o.MaxIdleUpstream <= 0 {
		o.MaxIdleUpstream = 256
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *LoopOptions) Validate() error {
	switch {
	case !o.Upstream.IsValid() || o.Upstream.Port() == 0:
		return errors.New("frontdoor: the loop needs the upstream's IP address and port")
	case o.Host == "":
		return errors.New("frontdoor: the loop needs the upstream's Host")
	case o.IdleTimeout < 0 || o.WriteTimeout < 0 || o.DialTimeout < 0 || o.UpstreamTimeout < 0 || o.StreamIdleTimeout < 0:
		return errors.New("frontdoor: a negative timeout")
	}
	return nil
}
