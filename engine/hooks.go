package engine

import (
	"context"
	"io"

	"github.com/kvsidecar/kvsidecar/internal/obs"
)

// Plugin is an engine connector: a package's type named by Name ("generic",
// "llamacpp") that implements the hooks it needs among those below. Hooks
// calls them; for a hook a connector lacks it does what a connector that
// keeps nothing would.
type Plugin interface {
	Name() string
}

// PreRequest is the hook before a request is forwarded.
type PreRequest interface {
	// Before returns the body to forward: req.Body or a rewrite of it.
	// It never fails the request: with an error (for logs and metrics)
	// the body is still the one to forward, except ErrBusy for a
	// Background request (the call must not be sent). It may block while
	// the engine saves or restores KV (bounded by the connector's timeout,
	// not by ctx, so that a client going away does not leave the engine
	// half swapped).
	Before(ctx context.Context, req *Request) ([]byte, error)
}

// PostResponse is the hook after the response: After is called exactly
// once per Before, whatever happened, with what the proxy saw of the
// answer. It returns nothing and never blocks on the engine.
type PostResponse interface {
	After(ctx context.Context, req *Request, resp *Response)
}

// Settler is the hook of a connector that saves the KV a request left in
// the engine: after After, Settle waits until it is saved (and written
// through to a fleet's shared store), so another replica can serve the
// session's next turn from it. Bounded by the connector's timeout.
type Settler interface {
	Settle(ctx context.Context, req *Request)
}

// Reporter is the stats hook: a snapshot of the connector's counters.
type Reporter interface {
	Report() Report
}

// SessionReporter is the hook of a connector that keeps records per
// session: what it knows of one.
type SessionReporter interface {
	SessionStats(tenant, sessionID string) (SessionStats, bool)
}

// Forgetter is the forget hook: drop what the connector keeps of a deleted
// session (its records, its saved KV, its slot's KV in the engine).
type Forgetter interface {
	Forget(ctx context.Context, tenant, sessionID string) error
}

// MetricsExporter is the metrics hook: ExportMetrics registers the
// connector's own sidecar_engine_* families in reg (the families of Stats
// are written for every connector).
type MetricsExporter interface {
	ExportMetrics(reg *obs.Registry)
}

// ConsoleReporter is the console hook: what the console's KV page shows of
// the connector (Facts).
type ConsoleReporter interface {
	ConsoleFacts() Facts
}

// Router is the hook of a connector that knows its engine's native API:
// for a request outside the OpenAI routes the proxy reads, Route says
// whether it computes on the engine's slots (placed by the connector, as a
// stateless chat request is, so it never lands on a slot whose KV a
// session holds, nor a session's KV on the slot it holds) or acts on one
// slot (the connector keeps its own saves and restores off that slot while
// it runs, and reads the slot's state again after). Path is the raw path
// and query as sent, without the upstream's base path.
type Router interface {
	Route(method, path []byte) Route
}

// Route is what a Router says of a native request.
type Route struct {
	Kind RouteKind
	// Slot is the slot a RouteSlotAction acts on.
	Slot int
	// Changes is set for a RouteSlotAction that replaces or erases the
	// slot's KV (llama.cpp's restore and erase; a save leaves it).
	Changes bool
}

// RouteKind classifies a native request.
type RouteKind uint8

const (
	// RoutePass: the engine does no slot work the connector tracks; the
	// hooks are not called.
	RoutePass RouteKind = iota
	// RouteCompute: the request computes on a slot; Before places it and
	// may rewrite its body (llama.cpp: id_slot).
	RouteCompute
	// RouteSlotAction: the request acts on Route.Slot; Before and After
	// bracket it.
	RouteSlotAction
)

// NonBlocking is a connector's word that its Before and After never block
// for a client's request (Request.Background false): no I/O with the
// engine, no wait for a slot, no lock held across either. The proxy then
// calls them on the front door's event loop, one thread serving every
// connection, where a hook that waited would stall them all (package
// frontdoor). A connector that saves and restores KV on the request path
// (llama.cpp's) does not have it.
type NonBlocking interface {
	NeverBlocks() bool
}

// Hooks is the proxy's handle on one connector: each of its hooks, and for
// a hook it lacks the default of a connector that keeps nothing (Before
// forwards the body, Forget forgets nothing, Report is Stats with its name,
// Close does nothing). Wrap makes one. Safe for concurrent use as far as
// the connector is.
type Hooks struct {
	p       Plugin
	pre     PreRequest
	post    PostResponse
	settle  Settler
	rep     Reporter
	sess    SessionReporter
	forget  Forgetter
	metrics MetricsExporter
	console ConsoleReporter
	router  Router
	closer  io.Closer
	// inline: Before and After never block for a client (NeverBlocks).
	inline bool
}

// Wrap returns the hooks of connector p; nil for nil (no connector). Wrap
// of a *Hooks is itself.
func Wrap(p Plugin) *Hooks {
	switch p := p.(type) {
	case nil:
		return nil
	case *Hooks:
		return p
	}
	h := &Hooks{p: p}
	h.pre, _ = p.(PreRequest)
	h.post, _ = p.(PostResponse)
	h.settle, _ = p.(Settler)
	h.rep, _ = p.(Reporter)
	h.sess, _ = p.(SessionReporter)
	h.forget, _ = p.(Forgetter)
	h.metrics, _ = p.(MetricsExporter)
	h.console, _ = p.(ConsoleReporter)
	h.router, _ = p.(Router)
	h.closer, _ = p.(io.Closer)
	nb, ok := p.(NonBlocking)
	h.inline = ok && nb.NeverBlocks() || h.pre == nil && h.post == nil
	return h
}

// Plugin returns the connector itself (for the hooks Hooks does not call,
// such as Snapshotter).
func (h *Hooks) Plugin() Plugin { return h.p }

// Name is the connector's name.
func (h *Hooks) Name() string { return h.p.Name() }

// NeverBlocks reports whether Before and After never block for a client's
// request: the connector says so (NonBlocking), or it has neither hook.
// Nil Hooks (no connector) never block.
func (h *Hooks) NeverBlocks() bool { return h == nil || h.inline }

// Before runs the connector's PreRequest hook; without one the body goes
// as it is.
func (h *Hooks) Before(ctx context.Context, req *Request) ([]byte, error) {
	if h.pre == nil {
		return req.Body, nil
	}
	return h.pre.Before(ctx, req)
}

// Route runs the connector's Router hook; RoutePass without one.
func (h *Hooks) Route(method, path []byte) Route {
	if h.router == nil {
		return Route{}
	}
	return h.router.Route(method, path)
}

// After runs the connector's PostResponse hook.
func (h *Hooks) After(ctx context.Context, req *Request, resp *Response) {
	if h.post != nil {
		h.post.After(ctx, req, resp)
	}
}

// Settle runs the connector's Settler hook.
func (h *Hooks) Settle(ctx context.Context, req *Request) {
	if h.settle != nil {
		h.settle.Settle(ctx, req)
	}
}

// Report returns the connector's Report; without a Reporter, Stats with
// its name, enabled.
func (h *Hooks) Report() Report {
	if h.rep == nil {
		return Stats{Connector: h.p.Name(), Enabled: true}
	}
	return h.rep.Report()
}

// Stats returns the counters every connector keeps.
func (h *Hooks) Stats() Stats { return h.Report().Common() }

// SessionStats runs the connector's SessionReporter hook; without one it
// knows no session.
func (h *Hooks) SessionStats(tenant, sessionID string) (SessionStats, bool) {
	if h.sess == nil {
		return SessionStats{}, false
	}
	return h.sess.SessionStats(tenant, sessionID)
}

// Forget runs the connector's Forgetter hook.
func (h *Hooks) Forget(ctx context.Context, tenant, sessionID string) error {
	if h.forget == nil {
		return nil
	}
	return h.forget.Forget(ctx, tenant, sessionID)
}

// ConsoleFacts returns the connector's Facts; without a ConsoleReporter,
// DefaultFacts of its Stats.
func (h *Hooks) ConsoleFacts() Facts {
	if h.console == nil {
		return DefaultFacts(h.Stats())
	}
	return h.console.ConsoleFacts()
}

// ExportMetrics registers in reg the families of Stats (mirrored from
// Report at each scrape) and the connector's own (MetricsExporter).
func (h *Hooks) ExportMetrics(reg *obs.Registry) {
	reg.OnScrape(func() { mirrorStats(reg, h.Stats()) })
	if h.metrics != nil {
		h.metrics.ExportMetrics(reg)
	}
}

// Close closes the connector (io.Closer): a connector holding KV saves it
// first. Call it after the proxy stopped forwarding and before closing the
// kv.Cache it uses.
func (h *Hooks) Close() error {
	if h.closer == nil {
		return nil
	}
	return h.closer.Close()
}
