// Package generic is the engine connector for engines without a KV
// transfer API (vLLM, SGLang, OpenAI, TGI, Ollama, or llama.cpp without
// --engine llamacpp): it forwards bodies untouched and keeps the engine's
// prompt figures; the KV reuse there comes from the engine's own prefix
// cache, which hits because package memory keeps the prompt prefix
// byte-stable.
//
// Invariants: Before returns req.Body unchanged (ErrBusy aside, for a
// background call that found no free slot); the connector owns no
// goroutine; a client request never waits for a background call it can
// cancel, nor for anything else (NeverBlocks: engine.NonBlocking).
package generic

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/engine"
)

// Name is the connector's name, the --engine value.
const Name = "generic"

// Open is the connector's engine.Factory: the engine at cfg.BaseURL, its
// slots learned from it.
func Open(cfg engine.Config) (engine.Plugin, error) {
	return New(Options{BaseURL: cfg.BaseURL}), nil
}

// Options configure a Connector. The zero value is usable:
// statistics only, and background calls gated by what the engine states.
// Every zero value is a documented default; nothing is refused (New applies
// EnsureDefaults).
type Options struct {
	// BaseURL is the engine's root (the proxy's upstream). A trailing "/"
	// and "/v1" are dropped. Empty: the connector asks the engine nothing,
	// and Slots alone gates background calls.
	BaseURL string
	// Slots is how many requests the engine runs at once, for the
	// background gate: a client request that finds every slot busy takes
	// one from a background call (engine.Request.Cancel, ErrPreempted), and a
	// background call starts only while a slot is free and no client
	// request came for BackgroundQuiet. Zero: learned from the engine's
	// /props (llama.cpp's total_slots); an engine that states none batches
	// requests (vLLM, SGLang) and background calls are never held back.
	// Negative: never held back.
	Slots int
	// BackgroundQuiet is how long after the last client request a
	// background call may start. Zero: 500 ms.
	BackgroundQuiet time.Duration
	// HTTPClient asks the engine for /props. Nil: one of its own (5 s
	// timeouts, idle connections closed after 1 s).
	HTTPClient *http.Client
}

// EnsureDefaults fills every zero field with its documented default, drops
// BaseURL's trailing "/" and "/v1", and returns o. New calls it; calling it
// twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.BackgroundQuiet == 0 {
		o.BackgroundQuiet = 500 * time.Millisecond
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Second}}
	}
	o.BaseURL = strings.TrimSuffix(strings.TrimRight(o.BaseURL, "/"), "/v1")
	return o
}

// Connector forwards bodies untouched and keeps statistics from the
// responses' usage (cached_tokens) and timings; engines that push KV
// themselves use the kv blob API (/v1/kv/…). Its hooks: PreRequest,
// PostResponse, Reporter, io.Closer.
//
// It also keeps the sidecar's own calls (engine.Request.Background) from
// delaying a client on an engine with few slots (a local llama-server with
// -np 1): see Options.Slots.
//
// The zero value is not usable; call New. Safe for concurrent use.
type Connector struct {
	opts Options
	ts   engine.TimingStats

	bgCalls, bgCancelled, clientWaits atomic.Int64

	// mu protects the fields below.
	mu         sync.Mutex
	slots      int // 0: unknown yet; <0: not held back
	probedAt   time.Time
	clients    int                          // client requests in flight
	bg         map[*engine.Request]*request // background calls in flight
	lastClient time.Time
	// quiet is the wait after a client request before a background call
	// may start: BackgroundQuiet, doubled (up to 16 times) each time a
	// client took a slot back from one, halved after each that finished
	// undisturbed — clients that pause briefly between turns are not
	// interrupted again and again.
	quiet time.Duration
	// changed is closed and cleared when a count drops; a background call
	// that waits makes it (nil: nobody waits, and a client request's
	// After costs no allocation).
	changed chan struct{}
}

// request is what Before keeps in a Request (its State) for After.
type request struct {
	assigned  bool // a client request counted in clients
	bgHeld    bool // a background call in bg
	preempted bool // a client took its slot (Cancel called)
}

// New returns a generic connector.
func New(opts Options) *Connector {
	opts.EnsureDefaults()
	g := &Connector{opts: opts, slots: opts.Slots, bg: map[*engine.Request]*request{}, quiet: opts.BackgroundQuiet}
	if g.slots == 0 && opts.BaseURL == "" {
		g.slots = -1
	}
	return g
}

// Name returns "generic".
func (g *Connector) Name() string { return Name }

// NeverBlocks is true: a client request's Before and After take the
// connector's lock for a few counters, never a wait (engine.NonBlocking).
// A background call's Before waits, but none comes from the event loop.
func (g *Connector) NeverBlocks() bool { return true }

// Before returns req.Body unchanged. A client request on an engine whose
// slots are all busy takes one from a background call; a background call
// waits, bounded by ctx, for a free slot and a quiet moment, and returns
// ErrBusy (the call must not be sent) when ctx ends first.
func (g *Connector) Before(ctx context.Context, req *engine.Request) ([]byte, error) {
	g.ts.Requests.Add(1)
	st := &request{}
	req.State = st
	if req.Background {
		return g.beforeBackground(ctx, req, st)
	}
	g.mu.Lock()
	g.clients++
	st.assigned = true
	if g.lastClient = req.Start; g.lastClient.IsZero() {
		g.lastClient = time.Now()
	}
	if g.slots > 0 && g.clients+len(g.bg) > g.slots {
		for r, rs := range g.bg {
			if g.clients+len(g.bg) <= g.slots {
				break
			}
			if r.Cancel != nil && !rs.preempted {
				rs.preempted = true
				r.Cancel(engine.ErrPreempted)
				g.bgCancelled.Add(1)
				g.quiet = min(2*g.quiet, 16*g.opts.BackgroundQuiet)
				delete(g.bg, r) // its slot is the client's now
			}
		}
		if len(g.bg) > 0 && g.clients+len(g.bg) > g.slots {
			g.clientWaits.Add(1) // a background call that cannot be taken back
		}
	}
	g.mu.Unlock()
	return req.Body, nil
}

func (g *Connector) beforeBackground(ctx context.Context, req *engine.Request, st *request) ([]byte, error) {
	g.learnSlots(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		if g.slots <= 0 {
			break
		}
		quietFor := g.quiet - time.Since(g.lastClient)
		if g.clients+len(g.bg) < g.slots && quietFor <= 0 {
			break
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		ch := g.changed
		g.mu.Unlock()
		wait := time.Second // looked at again at least once a second
		if quietFor > 0 {
			wait = min(quietFor, wait) // and as soon as the quiet ends
		}
		t := time.NewTimer(wait)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			g.mu.Lock()
			return nil, fmt.Errorf("engine: generic: background call: %w (%w)", engine.ErrBusy, ctx.Err())
		}
		t.Stop()
		g.mu.Lock()
	}
	g.bg[req] = st
	st.bgHeld = true
	g.bgCalls.Add(1)
	return req.Body, nil
}

// learnSlots asks the engine for its slots (llama.cpp /props total_slots)
// when they are unknown, at most once a minute.
func (g *Connector) learnSlots(ctx context.Context) {
	g.mu.Lock()
	if g.slots != 0 || time.Since(g.probedAt) < time.Minute {
		g.mu.Unlock()
		return
	}
	g.probedAt = time.Now()
	g.mu.Unlock()
	n := -1 // answered, but states no slots: a batching engine
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, g.opts.BaseURL+"/props", nil)
	if err != nil {
		return
	}
	req.Header.Set("User-Agent", engine.ProbeUserAgent)
	resp, err := g.opts.HTTPClient.Do(req)
	if err != nil {
		return // unreachable: ask again later
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if s := gjson.GetBytes(b, "total_slots").Int(); s > 0 {
			n = int(s)
		}
	}
	g.mu.Lock()
	if g.slots == 0 {
		g.slots = n
	}
	g.mu.Unlock()
}

// After records the response's usage and timings, and frees what Before
// counted.
func (g *Connector) After(_ context.Context, req *engine.Request, resp *engine.Response) {
	g.ts.Responses.Add(1)
	st, _ := req.State.(*request)
	if st == nil {
		st = &request{} // not placed by this connector
	}
	g.mu.Lock()
	switch {
	case st.bgHeld:
		st.bgHeld = false
		delete(g.bg, req)
		if !st.preempted {
			g.quiet = max(g.opts.BackgroundQuiet, g.quiet/2)
		}
	case st.assigned:
		st.assigned = false
		g.clients--
	}
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
	g.mu.Unlock()
	if resp == nil {
		return
	}
	if tm, ok := engine.ParseTimings(resp.Body); ok {
		g.ts.Record(tm)
	}
}

// Stats returns the counters.
func (g *Connector) Stats() engine.Stats {
	s := engine.Stats{Connector: g.Name(), Enabled: true}
	g.ts.Fill(&s)
	s.BackgroundCalls, s.BackgroundCancelled, s.ClientWaits = g.bgCalls.Load(), g.bgCancelled.Load(), g.clientWaits.Load()
	g.mu.Lock()
	s.Slots = max(g.slots, 0)
	g.mu.Unlock()
	return s
}

// Report returns Stats: the connector keeps nothing more.
func (g *Connector) Report() engine.Report { return g.Stats() }

// Close drops idle connections.
func (g *Connector) Close() error {
	g.opts.HTTPClient.CloseIdleConnections()
	return nil
}
