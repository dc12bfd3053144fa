package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/kv"
)

// LlamaCPPOptions configure a LlamaCPP connector. BaseURL, SlotDir and
// Cache are required; every other zero value is a documented default.
type LlamaCPPOptions struct {
	// BaseURL is the llama.cpp server's root, the proxy's upstream (for
	// example http://127.0.0.1:8000). A trailing "/v1" is dropped.
	BaseURL string
	// SlotDir is the server's --slot-save-path, a directory the sidecar
	// shares with it. It must exist. The connector writes and removes
	// only files named "kvsidecar-<hash>-<slot><op>.slot" (and temporaries beside
	// them) there.
	SlotDir string
	// Slots is the server's -np. Zero means 1.
	Slots int
	// Cache keeps saved slot states as blobs (PutBlobCached) under
	// Namespace, in whichever tier the cache puts them. It belongs to the
	// caller, who closes it after the connector.
	Cache *kv.Cache
	// Namespace of the blobs. Empty means "engine.llamacpp". The KV HTTP
	// API should not serve it to clients.
	Namespace string
	// HTTPClient makes the slot calls. Nil means http.DefaultClient.
	HTTPClient *http.Client
	// SlotTimeout bounds one slot save or restore, including the time the
	// server defers it while the slot finishes a request. Zero means two
	// minutes.
	SlotTimeout time.Duration
	// Layers is the model's layer count when known: a state file with
	// another count is rejected. Zero means the count of the first valid
	// file of each model is enforced afterwards.
	Layers int
	// MaxStateBytes bounds one state file kept. Zero means 1 GiB. (The
	// kv.Cache's MaxBlobBytes must allow it too.)
	MaxStateBytes int64
	// SaveOnResponse saves the slot after every successful response, so
	// the tiers always hold the session's latest KV. The default saves
	// only when another session needs the slot, and at Close.
	SaveOnResponse bool
	// NoSaveOnClose makes Close leave the slots' KV unsaved.
	NoSaveOnClose bool
	// MaxSessions bounds the per-session records. Zero means 65,536; the
	// least recently seen records without a slot are dropped beyond it.
	MaxSessions int
	// ProbeInterval is how long to wait before probing again a server
	// that could not be reached. Zero means 10 s.
	ProbeInterval time.Duration
	// Logger receives the warnings. Nil means slog.Default().
	Logger *slog.Logger
	// Clock tells time. Nil means the system clock.
	Clock kv.Clock
}

func (o *LlamaCPPOptions) validate() error {
	o.BaseURL = strings.TrimSuffix(strings.TrimRight(o.BaseURL, "/"), "/v1")
	switch {
	case o.BaseURL == "":
		return fmt.Errorf("engine: llamacpp: no BaseURL")
	case o.SlotDir == "":
		return fmt.Errorf("engine: llamacpp: no SlotDir (the server's --slot-save-path)")
	case o.Cache == nil:
		return fmt.Errorf("engine: llamacpp: no Cache")
	case o.Slots < 0 || o.Slots > MaxSlotStreams:
		return fmt.Errorf("engine: llamacpp: %d slots", o.Slots)
	case o.SlotTimeout < 0 || o.MaxStateBytes < 0 || o.MaxSessions < 0 || o.ProbeInterval < 0:
		return fmt.Errorf("engine: llamacpp: negative option")
	case o.Layers < 0 || o.Layers > kv.MaxLayers:
		return fmt.Errorf("engine: llamacpp: %d layers", o.Layers)
	}
	if fi, err := os.Stat(o.SlotDir); err != nil {
		return fmt.Errorf("engine: llamacpp: slot dir: %w", err)
	} else if !fi.IsDir() {
		return fmt.Errorf("engine: llamacpp: slot dir %s is not a directory", o.SlotDir)
	}
	if o.Slots == 0 {
		o.Slots = 1
	}
	if o.Namespace == "" {
		o.Namespace = "engine.llamacpp"
	}
	if o.HTTPClient == nil {
		o.HTTPClient = http.DefaultClient
	}
	if o.SlotTimeout == 0 {
		o.SlotTimeout = 2 * time.Minute
	}
	if o.MaxStateBytes == 0 {
		o.MaxStateBytes = 1 << 30
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = 1 << 16
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = sysClock{}
	}
	return nil
}

type sysClock struct{}

func (sysClock) Now() time.Time                         { return time.Now() }
func (sysClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Probe states.
const (
	probeUnknown int32 = iota
	probeEnabled
	probeDisabled
)

// LlamaCPP is the connector for a llama.cpp server started with
// --slot-save-path DIR and -np N. It pins each session to one of the N
// slots (LRU), adding "id_slot" and "cache_prompt": true to its requests,
// so the server reuses the slot's KV for the common prefix. When a slot
// goes to another session, the occupant's state is saved (POST
// /slots/{id}?action=save), read from DIR, validated (ParseSlotState) and
// kept in the kv.Cache, keyed by a hash of (tenant, session, model); when
// that session returns its state is written back to DIR and restored
// (action=restore) before its request is forwarded.
//
// If the server has no slot API (404, 405 or 501, or an error naming
// --slot-save-path) the connector disables itself with one warning and
// passes requests untouched. Stateless requests (no session) pass
// untouched too; the server places them itself and may then overwrite a
// session's slot, which costs that session a prefill, never correctness:
// llama.cpp reuses KV only for the tokens it matches.
//
// Create one with NewLlamaCPP; it owns no goroutine. Safe for concurrent use.
type LlamaCPP struct {
	opts LlamaCPPOptions
	log  *slog.Logger
	ts   timingStats

	probe     atomic.Int32
	probeMu   sync.Mutex
	lastProbe time.Time // guarded by probeMu
	closed    atomic.Bool

	slotHits, assigns, evictions                              atomic.Int64
	saves, saveErrs, saveEmpty, parseErrs, storeErrs          atomic.Int64
	restores, restoreMiss, restoreErrs, savedB, restoredB     atomic.Int64
	saveNs, restoreNs                                         atomic.Int64
	restoredFrom                                              [4]atomic.Int64
	warnedParse, warnedDir, warnedSlotID, warnedStoreTooLarge atomic.Bool

	// mu protects the fields below.
	mu             sync.Mutex
	slots          []*slotEntry
	sessions       map[string]*sessEntry    // by sessKey(tenant, session)
	layers         map[string]int           // model → layer count seen
	pending        map[string]chan struct{} // owner → closed when its queued save is done
	seq            uint64
	disabledReason string
}

type slotEntry struct {
	id       int
	owner    string // ownerKey of the session whose KV the slot holds or will hold; "" free
	sess     string // its sessKey
	model    string
	valid    bool // the slot is known to hold owner's KV
	inflight int  // requests sent with this id_slot and not yet After'ed
	lastUse  uint64
	// swap is closed when the last queued slot operation finished; slot
	// operations run one at a time in the order they were queued.
	swap chan struct{}
}

type sessEntry struct {
	stats    SessionStats
	lastSeen uint64
	owners   map[string]struct{} // ownerKeys used (one per model)
}

// NewLlamaCPP returns a llama.cpp connector. It does not contact the
// server: the first session request probes the slot API with a harmless
// call (an unknown action, answered 400 by a server with the API).
func NewLlamaCPP(opts LlamaCPPOptions) (*LlamaCPP, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	c := &LlamaCPP{opts: opts, log: opts.Logger, sessions: map[string]*sessEntry{}, layers: map[string]int{},
		pending: map[string]chan struct{}{}}
	for i := range opts.Slots {
		c.slots = append(c.slots, &slotEntry{id: i})
	}
	return c, nil
}

// Name returns "llamacpp".
func (c *LlamaCPP) Name() string { return "llamacpp" }

func hashKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(strconv.Itoa(len(p))))
		h.Write([]byte{':'})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// ownerKey names one session's KV for one model: the blob key, and (with
// a prefix) the file name in SlotDir.
func ownerKey(tenant, session, model string) string { return hashKey("kv", tenant, session, model) }
func sessKey(tenant, session string) string         { return hashKey("s", tenant, session) }

// opFileName is the file of one save or restore: unique among the
// operations that can run at once (one at a time per slot).
func opFileName(owner string, slot int, op string) string {
	return "kvsidecar-" + owner + "-" + strconv.Itoa(slot) + op + ".slot"
}

// Before pins the request's session to a slot, restoring its saved KV
// there if the slot held another session (whose KV it saves first), and
// returns the body with id_slot and cache_prompt set. Stateless requests,
// and every request while the connector is disabled, pass untouched.
func (c *LlamaCPP) Before(ctx context.Context, req *Request) ([]byte, error) {
	c.ts.requests.Add(1)
	req.assigned = false
	if req.SessionID == "" || c.closed.Load() || !c.ensureProbe(ctx) {
		return req.Body, nil
	}
	owner := ownerKey(req.Tenant, req.SessionID, req.Model)
	sk := sessKey(req.Tenant, req.SessionID)

	c.mu.Lock()
	c.seq++
	se := c.sessionLocked(sk)
	se.lastSeen = c.seq
	se.owners[owner] = struct{}{}
	se.stats.Requests++
	var sl *slotEntry
	for _, s := range c.slots {
		if s.owner == owner {
			sl = s
			break
		}
	}
	if sl != nil {
		sl.lastUse = c.seq
		sl.inflight++
		c.mu.Unlock()
		c.slotHits.Add(1)
		req.kvPath = kvResident
		return c.rewrite(req, sl.id, owner, sk)
	}
	sl = c.victimLocked()
	prev, prevSess, prevModel := sl.owner, sl.sess, sl.model
	prevHasKV := prev != "" && (sl.valid || sl.inflight > 0)
	if ps, ok := c.sessions[prevSess]; ok && prev != "" {
		ps.stats.Slot = -1
	}
	sl.owner, sl.sess, sl.model, sl.valid = owner, sk, req.Model, false
	sl.lastUse = c.seq
	sl.inflight++
	se.stats.Slot = sl.id
	wait := sl.swap
	done := make(chan struct{})
	sl.swap = done
	// A save of this session's KV queued on another slot must finish
	// before its state is restored here, or the older state would be.
	waitOwn := c.pending[owner]
	if prevHasKV {
		c.pending[prev] = done
	}
	layers := c.layersLocked(prevModel)
	c.mu.Unlock()
	c.assigns.Add(1)

	if wait != nil {
		<-wait
	}
	func() {
		defer func() {
			close(done)
			c.mu.Lock()
			if c.pending[prev] == done {
				delete(c.pending, prev)
			}
			c.mu.Unlock()
		}()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SlotTimeout)
		defer cancel()
		if prevHasKV {
			c.evictions.Add(1)
			c.save(sctx, sl.id, prev, prevSess, prevModel, layers)
		}
		if waitOwn != nil {
			<-waitOwn
		}
		if c.probe.Load() == probeDisabled {
			return
		}
		req.kvPath = kvCold
		if c.restore(sctx, sl.id, owner, sk) {
			req.kvPath = kvRestored
			c.mu.Lock()
			if sl.owner == owner {
				sl.valid = true
			}
			c.mu.Unlock()
		}
	}()
	return c.rewrite(req, sl.id, owner, sk)
}

func (c *LlamaCPP) rewrite(req *Request, slot int, owner, sk string) ([]byte, error) {
	req.assigned, req.slot, req.owner, req.sess = true, slot, owner, sk
	body, err := SetSlotFields(req.Body, slot)
	if err != nil {
		c.ts.hookErrors.Add(1)
		return req.Body, fmt.Errorf("engine: llamacpp: %w", err)
	}
	return body, nil
}

// victimLocked picks the slot for a session without one: a free slot,
// else the least recently used idle slot, else the least recently used.
func (c *LlamaCPP) victimLocked() *slotEntry {
	var idle, any *slotEntry
	for _, s := range c.slots {
		if s.owner == "" {
			return s
		}
		if s.inflight == 0 && (idle == nil || s.lastUse < idle.lastUse) {
			idle = s
		}
		if any == nil || s.lastUse < any.lastUse {
			any = s
		}
	}
	if idle != nil {
		return idle
	}
	return any
}

func (c *LlamaCPP) sessionLocked(sk string) *sessEntry {
	se, ok := c.sessions[sk]
	if ok {
		return se
	}
	if len(c.sessions) >= c.opts.MaxSessions {
		c.trimSessionsLocked()
	}
	se = &sessEntry{stats: SessionStats{Slot: -1}, owners: map[string]struct{}{}}
	c.sessions[sk] = se
	return se
}

// trimSessionsLocked drops the least recently seen eighth of the session
// records that hold no slot. Their saved KV stays in the cache.
func (c *LlamaCPP) trimSessionsLocked() {
	type kv struct {
		k    string
		seen uint64
	}
	var cand []kv
	for k, se := range c.sessions {
		if se.stats.Slot < 0 {
			cand = append(cand, kv{k, se.lastSeen})
		}
	}
	slices.SortFunc(cand, func(a, b kv) int { return int(a.seen) - int(b.seen) })
	for _, e := range cand[:max(1, min(len(cand), c.opts.MaxSessions/8))] {
		delete(c.sessions, e.k)
	}
}

func (c *LlamaCPP) layersLocked(model string) int {
	if c.opts.Layers > 0 {
		return c.opts.Layers
	}
	return c.layers[model]
}

// After releases the request's hold on its slot, records the response's
// timings and, with SaveOnResponse, saves the slot.
func (c *LlamaCPP) After(ctx context.Context, req *Request, resp *Response) {
	c.ts.responses.Add(1)
	var (
		tm    Timings
		timed bool
		ok2xx bool
	)
	if resp != nil {
		tm, timed = ParseTimings(resp.Body)
		ok2xx = resp.Status >= 200 && resp.Status < 300
	}
	if timed {
		c.ts.record(tm)
	}
	// The request path's share of kv.Cache's hit and amortization figures:
	// a resident slot is a free hit, a restore was counted by restore, and
	// a cold slot costs the prefill the engine timed.
	switch {
	case req.kvPath == kvResident && ok2xx:
		c.opts.Cache.RecordResident()
	case req.kvPath == kvCold && ok2xx && timed && tm.PromptMs > 0:
		c.opts.Cache.RecordCompute(time.Duration(tm.PromptMs * float64(time.Millisecond)))
	}
	req.kvPath = kvUnknown
	if !req.assigned {
		return
	}
	req.assigned = false
	c.mu.Lock()
	sl := c.slots[req.slot]
	sl.inflight = max(0, sl.inflight-1)
	mine := sl.owner == req.owner
	if mine && ok2xx {
		sl.valid = true
	}
	if se, ok := c.sessions[req.sess]; ok && timed {
		se.stats.Last = tm
		se.stats.Total.add(tm)
	}
	var (
		wait, done chan struct{}
		save       = c.opts.SaveOnResponse && mine && ok2xx && !c.closed.Load() && c.probe.Load() == probeEnabled
		layers     int
	)
	if save {
		wait, done = sl.swap, make(chan struct{})
		sl.swap = done
		layers = c.layersLocked(req.Model)
	}
	c.mu.Unlock()
	if !save {
		return
	}
	if wait != nil {
		<-wait
	}
	defer close(done)
	c.mu.Lock()
	still := sl.owner == req.owner
	c.mu.Unlock()
	if still {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SlotTimeout)
		defer cancel()
		c.save(sctx, req.slot, req.owner, req.sess, req.Model, layers)
	}
}

// slotResponse is the part of a slot action answer the connector reads.
type slotResponse struct {
	NSaved    *int64 `json:"n_saved"`
	NWritten  *int64 `json:"n_written"`
	NRestored *int64 `json:"n_restored"`
	NRead     *int64 `json:"n_read"`
	Error     *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// errSlotAPI is an HTTP answer that is not a success.
type errSlotAPI struct {
	status int
	msg    string
}

func (e *errSlotAPI) Error() string {
	return fmt.Sprintf("HTTP %d: %s", e.status, e.msg)
}

// unsupported reports whether an answer means the server has no usable
// slot API.
func (e *errSlotAPI) unsupported() (string, bool) {
	m := strings.ToLower(e.msg)
	switch {
	case strings.Contains(m, "slot-save-path") || strings.Contains(m, "does not support slots"):
		return "the server was started without --slot-save-path", true
	case e.status == http.StatusNotFound || e.status == http.StatusMethodNotAllowed:
		return fmt.Sprintf("the server has no slot API (POST /slots/{id} answered HTTP %d)", e.status), true
	case e.status == http.StatusNotImplemented:
		return "the server does not implement slot actions (HTTP 501)", true
	}
	return "", false
}

func (c *LlamaCPP) slotAction(ctx context.Context, slot int, action, filename string) (slotResponse, error) {
	var sr slotResponse
	body, _ := json.Marshal(map[string]string{"filename": filename})
	u := c.opts.BaseURL + "/slots/" + strconv.Itoa(slot) + "?action=" + action
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return sr, err
	}
	hr.Header.Set("Content-Type", "application/json")
	res, err := c.opts.HTTPClient.Do(hr)
	if err != nil {
		return sr, err
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	_ = json.Unmarshal(data, &sr)
	if res.StatusCode < 200 || res.StatusCode >= 300 {
		msg := strings.TrimSpace(string(data))
		if sr.Error != nil && sr.Error.Message != "" {
			msg = sr.Error.Message
		}
		return sr, &errSlotAPI{status: res.StatusCode, msg: msg}
	}
	return sr, nil
}

// ensureProbe reports whether the connector is enabled, probing the slot
// API first if it has not been yet.
func (c *LlamaCPP) ensureProbe(ctx context.Context) bool {
	switch c.probe.Load() {
	case probeEnabled:
		return true
	case probeDisabled:
		return false
	}
	c.probeMu.Lock()
	defer c.probeMu.Unlock()
	if st := c.probe.Load(); st != probeUnknown {
		return st == probeEnabled
	}
	now := c.opts.Clock.Now()
	if !c.lastProbe.IsZero() && now.Sub(c.lastProbe) < c.opts.ProbeInterval {
		return false
	}
	c.lastProbe = now
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := c.slotAction(pctx, 0, "kvsidecar-probe", "kvsidecar-probe.slot")
	var api *errSlotAPI
	switch {
	case err == nil:
		c.probe.Store(probeEnabled)
	case errors.As(err, &api):
		if reason, ok := api.unsupported(); ok {
			c.disable(reason)
			return false
		}
		c.probe.Store(probeEnabled) // 400 "Invalid action": the API is there
	default:
		c.log.Debug("llamacpp: slot API probe failed; will retry", "err", err)
		return false
	}
	return true
}

// disable turns the connector off, warning once.
func (c *LlamaCPP) disable(reason string) {
	if c.probe.Swap(probeDisabled) == probeDisabled {
		return
	}
	c.mu.Lock()
	c.disabledReason = reason
	c.mu.Unlock()
	c.log.Warn("llamacpp connector disabled: requests pass through without slot save/restore",
		"reason", reason, "server", c.opts.BaseURL, "slot_dir", c.opts.SlotDir)
}

// checkAPIError disables the connector when err says the slot API is
// missing, and warns once about a slot id the server does not have.
func (c *LlamaCPP) checkAPIError(slot int, err error) {
	var api *errSlotAPI
	if !errors.As(err, &api) {
		return
	}
	if reason, ok := api.unsupported(); ok {
		c.disable(reason)
		return
	}
	if strings.Contains(strings.ToLower(api.msg), "invalid slot") && !c.warnedSlotID.Swap(true) {
		c.log.Warn("llamacpp: the server has no such slot: is --llamacpp-slots larger than its -np?", "slot", slot, "slots", c.opts.Slots)
	}
}

// save saves slot's state, which belongs to owner, into the cache. It
// never removes what the cache held before unless the new state is
// valid and stored.
func (c *LlamaCPP) save(ctx context.Context, slot int, owner, sk, model string, layers int) {
	start := time.Now()
	name := opFileName(owner, slot, "save")
	path := filepath.Join(c.opts.SlotDir, name)
	defer os.Remove(path)
	_, err := c.slotAction(ctx, slot, "save", name)
	if err != nil {
		c.saveErrs.Add(1)
		c.checkAPIError(slot, err)
		c.log.Warn("llamacpp: slot save failed; the session's older saved state, if any, is kept", "slot", slot, "err", err)
		return
	}
	raw, err := readBounded(path, c.opts.MaxStateBytes)
	if err != nil {
		c.saveErrs.Add(1)
		if errors.Is(err, fs.ErrNotExist) && !c.warnedDir.Swap(true) {
			c.log.Warn("llamacpp: the server saved a slot but its file is not in the slot dir: is --llamacpp-slot-dir the server's --slot-save-path?",
				"slot_dir", c.opts.SlotDir)
		} else {
			c.log.Warn("llamacpp: read slot file", "err", err)
		}
		return
	}
	st, err := ParseSlotState(raw, layers)
	if err != nil {
		c.parseErrs.Add(1)
		if !c.warnedParse.Swap(true) {
			c.log.Warn("llamacpp: slot state file not in the expected layout; not kept", "err", err, "bytes", len(raw))
		}
		return
	}
	if len(st.Tokens) == 0 && st.Cells() == 0 {
		c.saveEmpty.Add(1)
		return
	}
	if err := c.opts.Cache.PutBlobCached(c.opts.Namespace, owner, kv.BlobMeta{}, raw); err != nil {
		c.storeErrs.Add(1)
		if !errors.Is(err, kv.ErrTooLarge) || !c.warnedStoreTooLarge.Swap(true) {
			c.log.Warn("llamacpp: keep slot state", "bytes", len(raw), "err", err)
		}
		return
	}
	c.saves.Add(1)
	c.savedB.Add(int64(len(raw)))
	c.saveNs.Add(int64(time.Since(start)))
	c.mu.Lock()
	if l := st.Layers(); l > 0 && c.layers[model] == 0 {
		c.layers[model] = l
	}
	if se, ok := c.sessions[sk]; ok {
		se.stats.Saves++
		se.stats.SavedTokens = len(st.Tokens)
		se.stats.SavedBytes = int64(len(raw))
	}
	c.mu.Unlock()
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("slot file of %d bytes, at most %d", fi.Size(), limit)
	}
	data := make([]byte, 0, fi.Size()+1)
	buf := bytes.NewBuffer(data)
	if _, err := buf.ReadFrom(io.LimitReader(f, limit+1)); err != nil {
		return nil, err
	}
	if int64(buf.Len()) > limit {
		return nil, fmt.Errorf("slot file over %d bytes", limit)
	}
	return buf.Bytes(), nil
}

// restore writes owner's saved state into SlotDir and restores it into
// slot. It reports whether the slot now holds it.
func (c *LlamaCPP) restore(ctx context.Context, slot int, owner, sk string) bool {
	start := time.Now()
	_, raw, tier, err := c.opts.Cache.GetBlob(c.opts.Namespace, owner)
	if err != nil {
		if errors.Is(err, kv.ErrNotFound) {
			c.restoreMiss.Add(1)
		} else {
			c.restoreErrs.Add(1)
			c.log.Warn("llamacpp: fetch saved slot state", "err", err)
		}
		return false
	}
	name := opFileName(owner, slot, "restore")
	path := filepath.Join(c.opts.SlotDir, name)
	defer os.Remove(path)
	if err := writeAtomic(c.opts.SlotDir, name, raw); err != nil {
		c.restoreErrs.Add(1)
		c.log.Warn("llamacpp: write slot file", "err", err)
		return false
	}
	if _, err := c.slotAction(ctx, slot, "restore", name); err != nil {
		c.restoreErrs.Add(1)
		c.checkAPIError(slot, err)
		c.log.Warn("llamacpp: slot restore failed; the request will prefill", "slot", slot, "err", err)
		return false
	}
	c.restores.Add(1)
	c.restoredB.Add(int64(len(raw)))
	c.restoreNs.Add(int64(time.Since(start)))
	c.opts.Cache.RecordLoad(tier, time.Since(start))
	if int(tier) < len(c.restoredFrom) {
		c.restoredFrom[tier].Add(1)
	}
	c.mu.Lock()
	if se, ok := c.sessions[sk]; ok {
		se.stats.Restores++
	}
	c.mu.Unlock()
	return true
}

// writeAtomic writes data to dir/name through a temporary file and a
// rename, so the server never reads a partial file. The file is readable
// by the server's user (0644).
func writeAtomic(dir, name string, data []byte) error {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".tmp-"+name+"-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// SessionState returns the saved slot state of a session for a model, the
// raw file bytes (byte-exact, as the server wrote them) and the tier that
// held them. Both share the cache's memory: read-only. Errors:
// kv.ErrNotFound, or ErrSlotState if the bytes do not parse.
func (c *LlamaCPP) SessionState(tenant, session, model string) (*SlotState, []byte, kv.Tier, error) {
	_, raw, tier, err := c.opts.Cache.GetBlob(c.opts.Namespace, ownerKey(tenant, session, model))
	if err != nil {
		return nil, nil, tier, fmt.Errorf("engine: llamacpp: %w", err)
	}
	c.mu.Lock()
	layers := c.layersLocked(model)
	c.mu.Unlock()
	st, err := ParseSlotState(raw, layers)
	if err != nil {
		return nil, raw, tier, fmt.Errorf("engine: llamacpp: %w", err)
	}
	return st, raw, tier, nil
}

// Forget drops a session: its records, its saved states for every model
// it used, and its slot, which is erased on the server (action=erase) so
// its KV is gone there too. For DELETE /v1/sessions/{id}.
func (c *LlamaCPP) Forget(ctx context.Context, tenant, session string) error {
	sk := sessKey(tenant, session)
	c.mu.Lock()
	se := c.sessions[sk]
	delete(c.sessions, sk)
	var erase []int
	for _, s := range c.slots {
		if s.sess == sk && s.owner != "" {
			s.owner, s.sess, s.model, s.valid = "", "", "", false
			erase = append(erase, s.id)
		}
	}
	c.mu.Unlock()
	var errs []error
	if se != nil {
		for owner := range se.owners {
			if err := c.opts.Cache.DeleteBlob(c.opts.Namespace, owner); err != nil && !errors.Is(err, kv.ErrNotFound) {
				errs = append(errs, err)
			}
		}
	}
	if c.probe.Load() == probeEnabled {
		for _, id := range erase {
			if _, err := c.slotAction(ctx, id, "erase", ""); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine: llamacpp: forget: %w", err)
	}
	return nil
}

// SessionStats returns a session's slot, saves, restores and timings.
func (c *LlamaCPP) SessionStats(tenant, session string) (SessionStats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	se, ok := c.sessions[sessKey(tenant, session)]
	if !ok {
		return SessionStats{}, false
	}
	return se.stats, true
}

// Stats returns the counters.
func (c *LlamaCPP) Stats() Stats {
	s := Stats{
		Connector:     c.Name(),
		Enabled:       c.probe.Load() != probeDisabled,
		Slots:         c.opts.Slots,
		SlotHits:      c.slotHits.Load(),
		SlotAssigns:   c.assigns.Load(),
		Evictions:     c.evictions.Load(),
		Saves:         c.saves.Load(),
		SaveErrors:    c.saveErrs.Load(),
		SaveEmpty:     c.saveEmpty.Load(),
		ParseErrors:   c.parseErrs.Load(),
		StoreErrors:   c.storeErrs.Load(),
		Restores:      c.restores.Load(),
		RestoreMisses: c.restoreMiss.Load(),
		RestoreErrors: c.restoreErrs.Load(),
		SavedBytes:    c.savedB.Load(),
		RestoredBytes: c.restoredB.Load(),
	}
	if s.Saves > 0 {
		s.MeanSaveMs = float64(c.saveNs.Load()) / float64(s.Saves) / 1e6
	}
	if s.Restores > 0 {
		s.MeanRestoreMs = float64(c.restoreNs.Load()) / float64(s.Restores) / 1e6
	}
	for t := range c.restoredFrom {
		if n := c.restoredFrom[t].Load(); n > 0 {
			if s.RestoredFrom == nil {
				s.RestoredFrom = map[string]int64{}
			}
			s.RestoredFrom[kv.Tier(t).String()] = n
		}
	}
	c.ts.fill(&s)
	c.mu.Lock()
	s.Sessions = len(c.sessions)
	s.DisabledReason = c.disabledReason
	c.mu.Unlock()
	return s
}

// Close saves, unless NoSaveOnClose, every slot known to hold a session's
// KV, so that the tiers (and through them the Archive) keep it across a
// restart; then the connector passes every request through. Call it after
// the proxy stopped forwarding and before closing the kv.Cache.
func (c *LlamaCPP) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	if c.opts.NoSaveOnClose || c.probe.Load() != probeEnabled {
		return nil
	}
	type job struct {
		slot               int
		owner, sess, model string
		layers             int
		wait               chan struct{}
	}
	var jobs []job
	c.mu.Lock()
	for _, s := range c.slots {
		if s.owner != "" && (s.valid || s.inflight > 0) {
			jobs = append(jobs, job{s.id, s.owner, s.sess, s.model, c.layersLocked(s.model), s.swap})
		}
	}
	c.mu.Unlock()
	for _, j := range jobs {
		if j.wait != nil {
			<-j.wait
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.SlotTimeout)
		c.save(ctx, j.slot, j.owner, j.sess, j.model, j.layers)
		cancel()
	}
	return nil
}
