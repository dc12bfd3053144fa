package llamacpp

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Name is the connector's name, the --engine value.
const Name = "llamacpp"

// Open is the connector's engine.Factory: the llama.cpp server at
// cfg.BaseURL, its slot directory, slots and preload from cfg, its states
// in cfg.Cache (and cfg.Shared).
func Open(cfg engine.Config) (engine.Plugin, error) {
	c, err := New(Options{BaseURL: cfg.BaseURL, SlotDir: cfg.SlotDir, Slots: cfg.Slots, Cache: cfg.Cache,
		Logger: cfg.Logger, Preload: cfg.Preload, Shared: cfg.Shared})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Probe states.
const (
	probeUnknown int32 = iota
	probeEnabled
	probeDisabled
)

// Connector is the connector for a llama.cpp server started with
// --slot-save-path DIR and -np N. Every request it sees, the sidecar's own
// background calls included, goes to a slot it chose (id_slot,
// cache_prompt), so no request lands on a slot holding another session's
// KV unknown to it:
//
//   - A session keeps its slot while it can; the server then reuses the
//     slot's KV for the common prefix.
//   - After a response, once the slot is idle, a goroutine the connector
//     owns saves the slot (POST /slots/{id}?action=save), validates the
//     file (parseSlotState) and keeps it durably in the kv.Cache through
//     GetOrComputeBlob, as a state keyed by (model fingerprint, session,
//     prompt prefix hash), then removes the file. A crash of the server
//     loses at most the turn in flight; a restarted sidecar lists its
//     states again from the cache.
//   - A request whose session holds no slot (new, displaced, or either
//     process restarted) gets the least recently used slot, and the state
//     sharing the longest prompt prefix with it, whichever session saved
//     it, is restored there when that pays (restore time below the prefill
//     it saves, both measured): its own last state, or a long shared
//     document another session already computed.
//   - Background calls borrow the slot whose KV is already saved, so they
//     cost a session at most a restore, never a prefill; they start only
//     on a slot no client used for BackgroundQuiet, and a client request
//     that needs their slot cancels them (the caller retries later), so
//     they never delay a client.
//
// Guard rails: states carry the fingerprint of the model and its KV layout
// and are never restored under another; GET /slots before each request
// tells when the server restarted (slots it no longer holds); restores the
// engine accepts but does not reuse stop after UnusedRestores in a row. A
// server without the slot API disables the connector with one warning.
// Hooks never fail a request: any error leaves it to prefill.
//
// Its hooks: every one of package engine's (PreRequest, PostResponse,
// Settler, Reporter, SessionReporter, Forgetter, MetricsExporter,
// ConsoleReporter, io.Closer) and engine.Snapshotter.
//
// Create one with New; Close stops its goroutine. Safe for concurrent use.
type Connector struct {
	opts Options
	log  *slog.Logger
	api  *llamaAPI
	ts   engine.TimingStats
	cat  *catalog
	ops  []sync.Mutex // one per slot: saves and restores run one at a time
	bg   chan struct{}

	probe     atomic.Int32
	probeMu   sync.Mutex
	lastProbe time.Time // guarded by probeMu
	refreshMu sync.Mutex
	closed    atomic.Bool
	noSlots   atomic.Bool // GET /slots is not served: no restart detection

	slotHits, assigns, evictions, restarts           atomic.Int64
	restores, restoreMiss, restoreErrs, restoreSkips atomic.Int64
	prefixReuses, refused, unusedRestores, bgCalls   atomic.Int64
	slotsLost, bgCancelled, clientWaits              atomic.Int64
	nativeSaves, nativePlaced                        atomic.Int64 // native.go
	restoredB, restoreNs                             atomic.Int64
	reusedTokens, replacedPrefillUs, restoredMsTotal atomic.Int64
	restoredFrom                                     [4]atomic.Int64
	sharedPuts, sharedFetches, sharedErrs            atomic.Int64
	warnedShared, warnedSlotID                       atomic.Bool

	shift     shiftState    // what the server's answers say of KV shifting (shift.go)
	saver     *saver        // owns the goroutine: saves, then preloads
	preloader *preloader    // Options.Preload; runs in the saver's goroutine
	done      chan struct{} // closed by Close: background calls stop waiting

	// mu protects the fields below.
	mu             sync.Mutex
	sched          *scheduler
	bgReqs         map[*request]struct{} // background calls placed, with a Cancel
	changed        chan struct{}         // closed when a slot's requests or arriving change
	arriving       int                   // client requests in Before
	bgWaiting      int                   // background calls waiting for a slot
	quiet          time.Duration         // BackgroundQuiet, adapted to the clients' pauses
	lastTask       []int
	fp, layout     string
	sessions       map[string]*sessEntry // by sessKey(tenant, session)
	pred           *predictor            // the sessions' arrival history
	seq            uint64
	disabledReason string
	restoreOff     bool
	unusedRun      int
	prefillMsTok   ewma // prefill ms per token, from timings
	restoreMsMB    ewma // restore ms per MiB, measured
	bgSeconds      ewma // how long a background call holds its slot
}

// request is what Before keeps in an engine.Request (its State) for After
// and Settle.
type request struct {
	*engine.Request
	assigned  bool         // placed on a slot
	bgHeld    bool         // holds the connector's background-call token
	preempted bool         // a client took its slot (Cancel called)
	slot      int          // the slot the request went to
	sk        string       // scheduler key: session key, "~n" stateless, "" background
	owner     string       // whom a state saved from its slot belongs to
	fp        string       // model fingerprint when placed
	chain     chain        // the prompt's prefix hashes
	restore   *restoreInfo // what Before restored, if anything
	placedAt  time.Time    // when a background call got its slot
	action    bool         // a client's slot action holds the slot's operation lock (native.go)
}

// requestOf returns what Before kept in req; a request Before never saw
// reads as one never placed.
func requestOf(req *engine.Request) *request {
	if r, ok := req.State.(*request); ok {
		return r
	}
	return &request{Request: req}
}

type sessEntry struct {
	stats    engine.SessionStats
	lastSeen uint64
}

// ewma is an exponentially weighted mean; zero until the first sample.
type ewma struct {
	v float64
	n int
}

func (e *ewma) add(x float64) {
	if e.n == 0 {
		e.v = x
	} else {
		e.v += 0.2 * (x - e.v)
	}
	e.n++
}

// New returns a llama.cpp connector and starts its saver. It lists
// the states the cache holds and takes into the cache any state file an
// interrupted save left in the slot directory; it does not contact the
// server until the first request.
func New(opts Options) (*Connector, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.BackgroundQuiet = max(opts.BackgroundQuiet, 0) // negative: none
	c := &Connector{
		opts: opts, log: opts.Logger, api: &llamaAPI{base: opts.BaseURL, client: opts.HTTPClient},
		cat: newCatalog(), ops: make([]sync.Mutex, opts.Slots), bg: make(chan struct{}, 1),
		sched: newScheduler(opts.Slots), lastTask: make([]int, opts.Slots), sessions: map[string]*sessEntry{},
		bgReqs: map[*request]struct{}{}, changed: make(chan struct{}), quiet: opts.BackgroundQuiet,
		pred: newPredictor(), done: make(chan struct{}),
	}
	c.preloader = newPreloader(c, opts.Slots)
	c.saver = newSaver(c)
	for i := range c.lastTask {
		c.lastTask[i] = -1
	}
	opts.Cache.RangeBlobs(opts.Namespace, func(key string, m kv.BlobMeta, _ tiers.Tier) bool {
		sm, err := parseStateMeta(m.Aux)
		if err != nil {
			c.log.Warn("llamacpp: a stored state has unreadable metadata; dropped", "key", key, "err", err)
			_ = opts.Cache.DeleteBlob(opts.Namespace, key)
			return true
		}
		sm.id = key
		if bm, _, err := opts.Cache.StatBlob(opts.Namespace, key); err == nil {
			sm.size = bm.Size
		}
		for _, d := range c.cat.add(sm, opts.statesKept(sm.sess)) {
			_ = opts.Cache.DeleteBlob(opts.Namespace, d.id)
		}
		return true
	})
	recoverSlotDir(opts.SlotDir, c.log)
	if n, b := c.cat.size(); n > 0 {
		c.log.Info("llamacpp: saved engine states found", "states", n, "bytes", b)
	}
	c.saver.start()
	return c, nil
}

// Name returns "llamacpp".
func (c *Connector) Name() string { return Name }

func hashKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(strconv.Itoa(len(p))))
		h.Write([]byte{':'})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

func sessKey(tenant, session string) string { return hashKey("s", tenant, session) }

// statelessOwner owns the states of a tenant's requests without a session.
func statelessOwner(tenant string) string { return "~" + hashKey("~", tenant) }

// stateKey names the state of a session's prompt prefix under a model: the
// blob key, and (with a prefix) the file name in SlotDir.
func stateKey(fp, sess string, ch chain) string {
	return hashKey("kv", fp, sess, strconv.FormatUint(ch.last(), 16))
}

// opFileName is the file of one save or restore: unique among the
// operations that can run at once (one at a time per slot).
func opFileName(key string, slot int, op string) string {
	return "kvsidecar-" + key + "-" + strconv.Itoa(slot) + op + ".slot"
}

// Before places the request on a slot, saving the displaced occupant's KV
// if no stored state covers it yet and restoring the state sharing the
// longest prefix with the request when that pays, and returns the body
// with id_slot and cache_prompt set. A client request placed on a slot
// busy with background calls takes it from them (their engine.Request.Cancel,
// engine.ErrPreempted). A Background request waits, bounded by ctx, until a slot
// is idle and quiet (see Options.BackgroundQuiet) and no client
// request is on its way to a slot; when ctx ends first it returns engine.ErrBusy
// and the call must not be sent. Every request while the connector is
// disabled passes untouched.
func (c *Connector) Before(ctx context.Context, er *engine.Request) ([]byte, error) {
	c.ts.Requests.Add(1)
	req := &request{Request: er}
	er.State = req
	if er.Native.Kind == engine.RouteSlotAction {
		return c.beforeSlotAction(ctx, req)
	}
	if !req.Background {
		// No background call starts while a client is on its way to a slot.
		c.mu.Lock()
		c.arriving++
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.arriving--
			c.signalLocked()
			c.mu.Unlock()
		}()
	}
	if c.closed.Load() || !c.ensureProbe(ctx) {
		return req.Body, nil
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SlotTimeout)
	defer cancel()
	fp := c.verify(sctx)
	if fp == "" || c.probe.Load() != probeEnabled {
		return req.Body, nil // the server cannot be reached: the request fails or passes on its own
	}
	req.chain = requestChain(chainSeed(fp, req.Tenant), req.Body)
	req.fp = fp
	if req.Background {
		return c.beforeBackground(ctx, sctx, req)
	}

	c.mu.Lock()
	c.seq++
	if req.SessionID == "" {
		// Stateless: a slot key of its own (never resident, never sharing
		// a slot with a concurrent one), states owned by the tenant.
		req.sk, req.owner = "~"+strconv.FormatUint(c.seq, 10), statelessOwner(req.Tenant)
	} else {
		req.sk = sessKey(req.Tenant, req.SessionID)
		req.owner = req.sk
		se := c.sessionLocked(req.sk)
		se.lastSeen = c.seq
		se.stats.Requests++
		c.pred.arrive(req.sk, c.opts.Clock.Now())
	}
	wasted := c.sched.wasted
	var p placement
	if id := c.clientSlot(req.Body); id >= 0 && req.Native.Kind == engine.RouteCompute {
		p = c.sched.placeOn(id, req.sk, req.chain) // the slot the client asked for; its occupant saved first
		c.nativePlaced.Add(1)
	} else {
		p = c.sched.place(req.sk, req.chain)
	}
	if c.sched.wasted != wasted {
		c.log.Debug("llamacpp: a preloaded state wasted", "session", req.sk, "slot", p.slot.id, "preloaded", p.prevSess)
	}
	if p.preempt {
		c.clientWaits.Add(1)
		c.preemptLocked(p.slot.id)
	}
	waitPreload := false
	if p.resident {
		switch p.slot.preload {
		case preloadLoaded:
			c.preloader.useLocked(req, p.slot)
		case preloadRestoring:
			waitPreload = true
		}
	}
	p.slot.owner = req.owner
	req.assigned, req.slot = true, p.slot.id
	if se, ok := c.sessions[req.sk]; ok {
		se.stats.Slot = p.slot.id
	}
	if ps, ok := c.sessions[p.prevSess]; ok && !p.resident {
		ps.stats.Slot = -1
	}
	c.mu.Unlock()

	if p.resident {
		c.slotHits.Add(1)
		if waitPreload {
			// The engine is restoring this session's state, preloaded:
			// what is left of that restore is cheaper than one of our own.
			c.ops[p.slot.id].Lock()
			c.ops[p.slot.id].Unlock()
			c.preloader.waits.Add(1)
			c.mu.Lock()
			if p.slot.sess == req.sk && p.slot.preload == preloadLoaded {
				c.preloader.useLocked(req, p.slot)
			}
			c.mu.Unlock()
		}
		if c.opts.Shared != nil {
			c.refreshResident(sctx, req, p.slot)
		}
		return c.rewrite(req)
	}
	c.assigns.Add(1)
	c.ops[p.slot.id].Lock()
	if p.prevDirty {
		c.evictions.Add(1)
		c.saver.save(sctx, p.slot.id, p.prevOwner, p.prevChain, fp, 0)
	}
	// On a preempted slot the server defers the restore until the
	// cancelled call has stopped.
	c.restoreBest(sctx, req, p.slot, -1)
	c.ops[p.slot.id].Unlock()
	return c.rewrite(req)
}

var errClosed = errors.New("engine: llamacpp: connector closed")

func (c *Connector) rewrite(req *request) ([]byte, error) {
	body, err := setSlotFields(req.Body, req.slot, max(c.opts.CacheReuse, 0))
	if err != nil {
		c.ts.HookErrors.Add(1)
		return req.Body, fmt.Errorf("engine: llamacpp: %w", err)
	}
	return body, nil
}

func (c *Connector) sessionLocked(sk string) *sessEntry {
	se, ok := c.sessions[sk]
	if ok {
		return se
	}
	if len(c.sessions) >= c.opts.MaxSessions {
		c.trimSessionsLocked()
	}
	se = &sessEntry{stats: engine.SessionStats{Slot: -1}}
	c.sessions[sk] = se
	return se
}

// trimSessionsLocked drops the least recently seen eighth of the session
// records that hold no slot. Their saved states stay.
func (c *Connector) trimSessionsLocked() {
	type rec struct {
		k    string
		seen uint64
	}
	var cand []rec
	for k, se := range c.sessions {
		if se.stats.Slot < 0 {
			cand = append(cand, rec{k, se.lastSeen})
		}
	}
	if len(cand) == 0 {
		return
	}
	slices.SortFunc(cand, func(a, b rec) int { return cmp.Compare(a.seen, b.seen) })
	for _, e := range cand[:max(1, min(len(cand), c.opts.MaxSessions/8))] {
		delete(c.sessions, e.k)
		c.pred.remove(e.k)
	}
}

// After records the response and, when the slot now holds KV no stored
// state covers, wakes the saver. It never blocks on the engine.
func (c *Connector) After(_ context.Context, er *engine.Request, resp *engine.Response) {
	req := requestOf(er)
	c.ts.Responses.Add(1)
	if req.action {
		c.afterSlotAction(req)
		return
	}
	var (
		tm    engine.Timings
		timed bool
		ok2xx bool
	)
	if resp != nil {
		tm, timed = engine.ParseTimings(resp.Body)
		ok2xx = resp.Status >= 200 && resp.Status < 300
	}
	if timed {
		c.ts.Record(tm)
	}
	if req.bgHeld {
		req.bgHeld = false
		<-c.bg
	}
	if !req.assigned {
		return
	}
	req.assigned = false
	tokens := int(tm.CacheN + tm.PromptN + tm.PredictedN)
	c.mu.Lock()
	delete(c.bgReqs, req)
	c.signalLocked() // a request left its slot
	if req.Background && ok2xx && !req.preempted {
		c.quiet = max(c.opts.BackgroundQuiet, c.quiet/2)
	}
	if req.Background && !req.placedAt.IsZero() {
		c.bgSeconds.add(c.opts.Clock.Now().Sub(req.placedAt).Seconds())
	}
	if timed && tm.PromptN >= 16 && tm.PromptMs > 0 {
		c.prefillMsTok.add(tm.PromptMs / float64(tm.PromptN))
	}
	sl := c.sched.slots[req.slot]
	if !req.Background && ok2xx && timed && req.restore == nil && sl.sess == req.sk && req.SessionID != "" {
		// The slot held this session's previous prompt: did the engine
		// move what this one kept of it?
		c.shift.observe(shiftEvidence(sl.chain, req.chain, tm.CacheN, tm.CacheN+tm.PromptN), c.log)
	}
	dirty := c.sched.done(sl, req.sk, req.Background, ok2xx, req.chain, tokens, c.opts.Clock.Now())
	if dirty && (req.chain.len() == 0 || timed && tokens < c.opts.MinSaveTokens) {
		sl.dirty, dirty = false, false // nothing to index, or cheaper to prefill
		if strings.HasPrefix(req.sk, "~") {
			sl.sess = "" // a stateless request's slot is free again
		}
	}
	if dirty {
		sl.computeMs += tm.PromptMs
	}
	if se, ok := c.sessions[req.sk]; ok && timed {
		se.stats.Last = tm
		se.stats.Total.Add(tm)
	}
	if r := req.restore; r != nil && ok2xx && timed {
		req.restore = nil
		if tm.CacheN*4 < int64(r.expect) {
			c.unusedRestores.Add(1)
			c.unusedRun++
			if c.unusedRun >= c.opts.UnusedRestores && !c.restoreOff {
				c.restoreOff = true
				c.log.Warn("llamacpp: the server accepts restored states but does not reuse them (sliding-window or hybrid model?); restores stop for this model",
					"restores_unused", c.unusedRun, "expected_tokens", r.expect, "cache_n", tm.CacheN)
			}
		} else {
			c.unusedRun = 0
			c.reusedTokens.Add(tm.CacheN)
			c.restoredMsTotal.Add(int64(r.ms * 1000))
			if c.prefillMsTok.n > 0 {
				c.replacedPrefillUs.Add(int64(c.prefillMsTok.v * float64(tm.CacheN) * 1000))
			}
		}
	}
	idle := c.opts.Preload && c.preloader.clientsBusyLocked() == 0
	c.mu.Unlock()
	if dirty && !c.opts.NoBackgroundSave || idle {
		c.saver.wake()
	}
}
