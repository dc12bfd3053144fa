package llamacpp

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/kv"
)

// Options configure a Connector. BaseURL, SlotDir and Cache are required;
// every other zero value is a documented default (New applies
// EnsureDefaults and Validate).
type Options struct {
	// BaseURL is the llama.cpp server's root, the proxy's upstream (for
	// example http://127.0.0.1:8000). A trailing "/v1" is dropped.
	BaseURL string
	// SlotDir is the server's --slot-save-path, a directory the sidecar
	// shares with it. It must exist. The connector writes and removes
	// only files named "kvsidecar-…" there.
	SlotDir string
	// Slots is the server's -np. Zero means 1.
	Slots int
	// Cache keeps saved slot states as blobs under Namespace, written
	// through to its Archive. It belongs to the caller, who closes it
	// after the connector.
	Cache *kv.Cache
	// Namespace of the blobs. Empty means "engine.llamacpp". The KV HTTP
	// API should not serve it to clients.
	Namespace string
	// HTTPClient makes the calls to the server. Nil means a client of its
	// own, whose idle connections close after 2 s: llama-server closes an
	// idle keep-alive connection after 5 s, and a request sent on one it
	// is closing fails. (Every call the connector makes is marked
	// replayable, so net/http retries one that failed on a reused
	// connection before the server read it.)
	HTTPClient *http.Client
	// SlotTimeout bounds one slot save or restore, including the time the
	// server defers it while the slot finishes a request. Zero means two
	// minutes.
	SlotTimeout time.Duration
	// MaxStateBytes bounds one state file kept. Zero means 1 GiB. (The
	// kv.Cache's MaxBlobBytes must allow it too.)
	MaxStateBytes int64
	// MinSaveTokens is the smallest slot worth saving or restoring: below
	// it a prefill costs about what a restore does. Zero means 64.
	MinSaveTokens int
	// StatesPerSession bounds the states kept per session (a state that
	// a newer one of the same conversation extends is dropped at once;
	// these are branches). Zero means 4.
	StatesPerSession int
	// StatelessStates bounds the states kept per tenant of its requests
	// without a session. Zero means 64.
	StatelessStates int
	// MaxStates bounds the states kept in all; the least recently used
	// go first. Zero means 65,536.
	MaxStates int
	// BackgroundQuiet is how long a slot must have had no client request
	// before a background call (engine.Request.Background: the sidecar's own) may
	// start on it, so that a client sending its turns back to back never
	// meets one. Zero means 500 ms: a client replaying a conversation sends
	// its next turn within tens of milliseconds, a person takes seconds.
	// Negative means none. It doubles, up to 16 times, each time a client
	// request takes a slot from a background call (the server stops that
	// call only after the prompt batch it is computing, up to a second or
	// so), and halves back after each background call that completes. A
	// session whose history shows follow-ups (requests within one visit)
	// keeps its slot against background calls and preloads for twice its
	// own gap between them when that is longer.
	BackgroundQuiet time.Duration
	// Preload turns on predictive preload (MemGPT design §4.2): when no
	// client request is in flight, the connector restores into an idle
	// slot whose KV is saved the state of the session expected to speak
	// soonest (from each session's own arrival history: its last request
	// plus its usual gap), so that session finds its KV resident and its
	// restore leaves the request path. A slot is taken only from an
	// occupant expected later than the session preloaded (or gone quiet
	// for four of its gaps), never from one with unsaved KV. A preload
	// still fetching its state when a client request arrives is abandoned
	// (the slot keeps its occupant); one the engine is already restoring
	// is waited for only by the session it restores (cheaper than a
	// restore of its own), and other sessions take that slot last.
	// Stats.Preloads, PreloadsUsed, PreloadsWasted count them. False: off.
	Preload bool
	// NoSaveOnClose makes Close leave the slots' unsaved KV unsaved.
	NoSaveOnClose bool
	// NoBackgroundSave turns the saver off: a slot's KV is then saved only
	// when another request needs the slot, and at Close, so a crash of the
	// server loses every unsaved turn. It saves disk writes for engines
	// that never restart.
	NoBackgroundSave bool
	// MaxSessions bounds the per-session statistics records. Zero means
	// 65,536; the least recently seen are dropped beyond it.
	MaxSessions int
	// ProbeInterval is how long to wait before probing again a server
	// that could not be reached. Zero means 10 s.
	ProbeInterval time.Duration
	// CacheReuse is the n_cache_reuse the connector asks of the server on
	// each request that has none of its own: after the prefix a new prompt
	// shares with the slot's KV, the server moves (KV shifting) each chunk
	// of at least that many tokens the slot holds further on to where the
	// new prompt has it, instead of computing it again. When history leaves
	// the window, what stays is such a chunk (memory evicts in order when
	// the engine shifts, see ShiftsKV). The server ignores it, with a
	// warning in its log, where the model's KV cannot shift (sliding-window
	// or recurrent models, multimodal prompts). Zero means 64; negative
	// means never sent (the server's --cache-reuse then applies).
	CacheReuse int
	// UnusedRestores is how many restores in a row the engine may accept
	// without reusing them (cache_n far below what the state covers, as
	// on sliding-window or hybrid models) before restores stop for the
	// model, with one warning. Zero means 3.
	UnusedRestores int
	// Logger receives the warnings. Nil means slog.Default().
	Logger *slog.Logger
	// Clock tells time. Nil means the system clock.
	Clock clock.Clock
	// Shared, when set, is the fleet's shared store of states: saved
	// states are written through to it, restores look there too (see
	// engine.SharedStates). Nil: states stay on this machine.
	Shared engine.SharedStates
}

// EnsureDefaults fills every zero field with its documented default, drops
// BaseURL's trailing "/" and "/v1", and returns o. New calls it; calling it
// twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	o.BaseURL = strings.TrimSuffix(strings.TrimRight(o.BaseURL, "/"), "/v1")
	if o.Slots == 0 {
		o.Slots = 1
	}
	if o.Namespace == "" {
		o.Namespace = "engine.llamacpp"
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: 2 * time.Second}}
	}
	if o.BackgroundQuiet == 0 {
		o.BackgroundQuiet = 500 * time.Millisecond
	}
	if o.SlotTimeout == 0 {
		o.SlotTimeout = 2 * time.Minute
	}
	if o.MaxStateBytes == 0 {
		o.MaxStateBytes = 1 << 30
	}
	if o.MinSaveTokens == 0 {
		o.MinSaveTokens = 64
	}
	if o.StatesPerSession == 0 {
		o.StatesPerSession = 4
	}
	if o.StatelessStates == 0 {
		o.StatelessStates = 64
	}
	if o.MaxStates == 0 {
		o.MaxStates = 1 << 16
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = 1 << 16
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = 10 * time.Second
	}
	if o.UnusedRestores == 0 {
		o.UnusedRestores = 3
	}
	if o.CacheReuse == 0 {
		o.CacheReuse = 64
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	return o
}

// Validate checks options after EnsureDefaults; SlotDir must be an
// existing directory.
func (o *Options) Validate() error {
	switch {
	case o.BaseURL == "":
		return fmt.Errorf("engine: llamacpp: no BaseURL")
	case o.SlotDir == "":
		return fmt.Errorf("engine: llamacpp: no SlotDir (the server's --slot-save-path)")
	case o.Cache == nil:
		return fmt.Errorf("engine: llamacpp: no Cache")
	case o.Slots < 0 || o.Slots > MaxSlotStreams:
		return fmt.Errorf("engine: llamacpp: %d slots", o.Slots)
	case o.SlotTimeout < 0 || o.MaxStateBytes < 0 || o.MaxSessions < 0 || o.ProbeInterval < 0 ||
		o.MinSaveTokens < 0 || o.StatesPerSession < 0 || o.StatelessStates < 0 || o.MaxStates < 0 || o.UnusedRestores < 0:
		return fmt.Errorf("engine: llamacpp: negative option")
	}
	if fi, err := os.Stat(o.SlotDir); err != nil {
		return fmt.Errorf("engine: llamacpp: slot dir: %w", err)
	} else if !fi.IsDir() {
		return fmt.Errorf("engine: llamacpp: slot dir %s is not a directory", o.SlotDir)
	}
	return nil
}

// statesKept is how many states an owner keeps.
func (o *Options) statesKept(owner string) int {
	if strings.HasPrefix(owner, "~") {
		return o.StatelessStates
	}
	return o.StatesPerSession
}
