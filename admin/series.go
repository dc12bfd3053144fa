package admin

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/memory"
)

// KVSample is one point of the console's KV time series: cumulative
// counters and gauges read at At. The page plots differences of counters
// between samples (the hit rate over each interval) and gauges as they are
// (tier occupancy).
type KVSample struct {
	At time.Time `json:"at"`
	// KV cache lookups (package kv).
	KVHits   int64 `json:"kv_hits"`
	KVMisses int64 `json:"kv_misses"`
	// Tiers is the KV cache's usage per tier, fastest first.
	Tiers []TierSample `json:"tiers,omitempty"`
	// Engine: prompt tokens the engine reused from its KV and prefilled
	// (timings.cache_n, prompt_n), tokens not reprocessed thanks to a
	// restore, and the engine states kept by the fastest tier holding them.
	CachedTokens     int64            `json:"cached_tokens"`
	PrefilledTokens  int64            `json:"prefilled_tokens"`
	ReusedTokens     int64            `json:"reused_tokens"`
	StateBytesByTier map[string]int64 `json:"state_bytes_by_tier,omitempty"`
	// Memory: windows built and their tokens.
	Turns        uint64 `json:"turns"`
	WindowTokens uint64 `json:"window_tokens"`

	// alert is what the console's thresholds read (thresholds.go).
	alert *alertPoint
}

// TierSample is one KV tier's usage in a sample.
type TierSample struct {
	Tier     string `json:"tier"`
	Bytes    int64  `json:"bytes"`
	MaxBytes int64  `json:"max_bytes"`
	Entries  int    `json:"entries"`
}

// sample reads the counters now.
func (s *Server) sample(now time.Time) KVSample {
	turns, windowTokens, _, _ := s.opts.Sessions.WindowCounters()
	x := KVSample{At: now, Turns: turns, WindowTokens: windowTokens, alert: s.readAlertPoint()}
	if c := s.opts.KV; c != nil {
		st := c.Stats()
		x.KVHits, x.KVMisses = st.Hits, st.Misses
		for _, t := range st.Tiers {
			x.Tiers = append(x.Tiers, TierSample{Tier: t.Tier, Bytes: t.Bytes, MaxBytes: t.MaxBytes, Entries: t.Entries})
		}
	}
	if e := s.opts.Engine; e != nil {
		st := e.Stats()
		x.CachedTokens, x.PrefilledTokens, x.ReusedTokens = st.Timings.CacheN, st.Timings.PromptN, st.ReusedTokens
		for _, t := range e.ConsoleFacts().Tiers {
			if x.StateBytesByTier == nil {
				x.StateBytesByTier = map[string]int64{}
			}
			x.StateBytesByTier[t.Tier] = t.Bytes
		}
	}
	return x
}

// kvSeries is a ring of the last samples. The zero value holds none; its
// methods are safe for concurrent use.
type kvSeries struct {
	// mu protects the fields below.
	mu   sync.Mutex
	ring []KVSample
	next int  // where the next sample goes
	full bool // the ring wrapped
}

func newKVSeries(n int) *kvSeries { return &kvSeries{ring: make([]KVSample, n)} }

func (r *kvSeries) add(x KVSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ring) == 0 {
		return
	}
	r.ring[r.next] = x
	r.next++
	if r.next == len(r.ring) {
		r.next, r.full = 0, true
	}
}

// snapshot returns the samples, oldest first (a copy).
func (r *kvSeries) snapshot() []KVSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []KVSample{}
	if r.full {
		out = append(out, r.ring[r.next:]...)
	}
	return append(out, r.ring[:r.next]...)
}

// runSampler adds a sample now and every period until ctx ends. The
// Server starts it in Serve and waits for it in Shutdown.
func (s *Server) runSampler(ctx context.Context, every time.Duration) {
	s.series.add(s.sample(time.Now()))
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.series.add(s.sample(now))
		}
	}
}

// lastWindow is what the console shows of a session's last window: its
// size and how it was built, and the recall and stable blocks' text.
type lastWindow struct {
	At             time.Time `json:"at"`
	Model          string    `json:"model,omitempty"`
	Mode           string    `json:"mode"`
	ModeDetected   bool      `json:"mode_detected"`
	Match          string    `json:"match"`
	User           string    `json:"user"`
	Limit          int       `json:"limit"`
	TotalTokens    int       `json:"total_tokens"`
	SystemTokens   int       `json:"system_tokens"`
	StableTokens   int       `json:"stable_tokens"`
	HistoryTokens  int       `json:"history_tokens"`
	RecallTokens   int       `json:"recall_tokens"`
	ToolsTokens    int       `json:"tools_tokens"`
	WindowMessages int       `json:"window_messages"`
	StoredMessages int       `json:"stored_messages"`
	Evicted        int       `json:"evicted"`
	Recalled       int       `json:"recalled"`
	CrossSession   int       `json:"cross_session"`
	Recall         string    `json:"recall"`
	SharedPrefix   int       `json:"shared_prefix_tokens"`
	RecallBlock    string    `json:"recall_block,omitempty"`
	StableBlock    string    `json:"stable_block,omitempty"`
}

func newLastWindow(at time.Time, turn *memory.Turn) *lastWindow {
	ts := &turn.Stats
	return &lastWindow{At: at, Model: ts.Model, Mode: ts.Mode, ModeDetected: ts.ModeDetected, Match: ts.Match, User: ts.User, Limit: ts.Limit,
		TotalTokens: ts.TotalTokens, SystemTokens: ts.SystemTokens, StableTokens: ts.StableTokens,
		HistoryTokens: ts.HistoryTokens, RecallTokens: ts.RecallTokens, ToolsTokens: ts.ToolsTokens,
		WindowMessages: ts.WindowMessages, StoredMessages: ts.StoredMessages, Evicted: ts.Evicted,
		Recalled: ts.Recalled, CrossSession: ts.CrossSession, Recall: ts.Recall, SharedPrefix: ts.Prefix.Tokens,
		RecallBlock: gjson.GetBytes(turn.Block, "content").String(), StableBlock: gjson.GetBytes(turn.Stable, "content").String()}
}

// Windows keeps the last window of the most recently served sessions, at
// most max of them (the oldest leave first), for the console's session
// page. The proxy fills it (proxy.Options.Windows: Window as it builds a
// window, Forget as it deletes a session); the console reads it. A nil
// *Windows keeps nothing; its methods are safe for concurrent use.
type Windows struct {
	max int
	// mu protects the fields below.
	mu    sync.Mutex
	m     map[string]*lastWindow
	order []string // the keys of m, oldest first
}

// NewWindows returns a Windows that keeps the last windows of max sessions
// (ConsoleWindows is the sidecar's).
func NewWindows(max int) *Windows {
	return &Windows{max: max, m: map[string]*lastWindow{}}
}

// Window keeps turn's window as session id's last, built at at.
func (c *Windows) Window(tenant, id string, at time.Time, turn *memory.Turn) {
	if c == nil || c.max <= 0 {
		return
	}
	c.put(tenant, id, newLastWindow(at, turn))
}

func (c *Windows) put(tenant, id string, w *lastWindow) {
	if c == nil || c.max <= 0 {
		return
	}
	k := sessionKeyOf(tenant, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok {
		c.order = append(c.order, k)
	}
	c.m[k] = w
	for len(c.m) > c.max && len(c.order) > 0 {
		old := c.order[0]
		c.order = c.order[1:]
		delete(c.m, old)
	}
}

func (c *Windows) get(tenant, id string) *lastWindow {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[sessionKeyOf(tenant, id)]
}

// Forget drops session id's last window (the session was deleted).
func (c *Windows) Forget(tenant, id string) {
	if c == nil {
		return
	}
	k := sessionKeyOf(tenant, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok {
		return
	}
	delete(c.m, k)
	if i := slices.Index(c.order, k); i >= 0 {
		c.order = slices.Delete(c.order, i, i+1)
	}
}

func sessionKeyOf(tenant, id string) string { return tenant + "\x00" + id }
