package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Request is one chat or completions request the proxy forwards, as a
// Connector sees it. The proxy makes one per request, passes the same
// pointer to Before and then to After, and does not share it between
// requests: Before records in it what After needs.
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
	// Cancel, on a Background request, cancels the context the caller
	// sends the call under. A connector that gives the call's slot to a
	// client request calls it with ErrPreempted (the engine stops
	// generating when the connection closes); the caller may send the
	// call again later. Nil: the call cannot be taken back, and a client
	// needing its slot waits for it.
	Cancel context.CancelCauseFunc

	// Set by Before, read by After.
	assigned  bool
	bgHeld    bool         // holds the connector's background-call token
	preempted bool         // a client took its slot (Cancel called)
	slot      int          // the slot the request went to
	sk        string       // scheduler key: session key, "~n" stateless, "" background
	owner     string       // whom a state saved from its slot belongs to
	fp        string       // model fingerprint when placed
	chain     chain        // the prompt's prefix hashes
	restore   *restoreInfo // what Before restored, if anything
	placedAt  time.Time    // when a background call got its slot
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
	// records no timings.
	Body []byte
}

// Connector makes a session's prefix KV present in an LLM engine before a
// request is forwarded and captures the KV the engine computed afterwards.
//
// The proxy calls, for every forwarded chat/completions request:
//
//	body, err := c.Before(ctx, req) // forward body (req.Body when err != nil)
//	… forward, stream the answer to the client …
//	c.After(ctx, req, &resp)        // exactly once per Before, whatever happened
//
// Hooks never fail the request: Before returns the body to forward even
// with an error (which is for logs and metrics: the request goes on), and
// After returns nothing. Stats and Close are for the admin view and for
// shutdown; Close is called after the proxy stopped forwarding and before
// the kv.Cache the connector uses is closed.
type Connector interface {
	// Name is "llamacpp" or "generic".
	Name() string
	// Before returns the body to forward: req.Body or a rewrite of it.
	// It may block while the engine saves or restores KV (bounded by the
	// connector's timeout, not by ctx, so that a client going away does
	// not leave the engine half swapped).
	Before(ctx context.Context, req *Request) ([]byte, error)
	// After records the response (timings, usage) and may capture KV. It
	// must not block (no engine call, no lock held across one): the proxy
	// calls it on the request path when nothing else is left to release.
	// resp and its Body are valid only during the call.
	After(ctx context.Context, req *Request, resp *Response)
	// SessionStats returns what the connector knows of one session.
	SessionStats(tenant, sessionID string) (SessionStats, bool)
	// Forget drops what the connector keeps of a deleted session: its
	// records, its saved KV, its slot's KV in the engine.
	Forget(ctx context.Context, tenant, sessionID string) error
	// Settle, after After, waits until the KV the request left in the
	// engine is saved (and written through to a fleet's shared store), so
	// another replica can serve the session's next turn from it. Bounded
	// by the connector's timeout; a no-op for connectors that save nothing.
	Settle(ctx context.Context, req *Request)
	// Stats returns a snapshot of the connector's counters.
	Stats() Stats
	// Close releases the connector (a llama.cpp connector first saves the
	// slots it knows to be in use). Idempotent.
	Close() error
}

// Timings are an engine's prompt figures for one response, or their sums.
type Timings struct {
	// CacheN is the number of prompt tokens reused from the engine's KV
	// (llama.cpp timings.cache_n, or usage.prompt_tokens_details.cached_tokens).
	CacheN int64 `json:"cache_n"`
	// PromptN is the number of prompt tokens processed (prefilled).
	PromptN int64 `json:"prompt_n"`
	// PromptMs is the time spent on them.
	PromptMs float64 `json:"prompt_ms"`
	// PredictedN and PredictedMs are the generated tokens and their time.
	PredictedN  int64   `json:"predicted_n"`
	PredictedMs float64 `json:"predicted_ms"`
}

func (t *Timings) add(o Timings) {
	t.CacheN += o.CacheN
	t.PromptN += o.PromptN
	t.PromptMs += o.PromptMs
	t.PredictedN += o.PredictedN
	t.PredictedMs += o.PredictedMs
}

// SessionStats is one session's view in a connector.
type SessionStats struct {
	// Slot is the llama.cpp slot the session holds; -1 when none.
	Slot int `json:"slot"`
	// Requests counts Before calls for the session.
	Requests int64 `json:"requests"`
	// Saves and Restores count the session's KV moved out of and into
	// the engine; SavedTokens and SavedBytes describe the last save.
	Saves    int64 `json:"saves"`
	Restores int64 `json:"restores"`
	// Preloads counts the session's states restored ahead of its
	// requests (LlamaCPPOptions.Preload); they are not in Restores.
	Preloads    int64 `json:"preloads"`
	SavedTokens int   `json:"saved_tokens"`
	SavedBytes  int64 `json:"saved_bytes"`
	// Last is the last response's timings; Total their sums.
	Last  Timings `json:"last"`
	Total Timings `json:"total"`
}

// Stats is a snapshot of a connector's counters.
type Stats struct {
	Connector string `json:"connector"`
	// Enabled is false once a connector found the engine unable to do
	// its job (DisabledReason says why); requests then pass untouched.
	Enabled        bool   `json:"enabled"`
	DisabledReason string `json:"disabled_reason,omitempty"`
	Requests       int64  `json:"requests"`
	Responses      int64  `json:"responses"`
	// HookErrors counts Before and After failures that were absorbed.
	HookErrors int64 `json:"hook_errors"`
	Sessions   int   `json:"sessions"`

	// Slots (llama.cpp).
	Slots         int   `json:"slots,omitempty"`
	SlotHits      int64 `json:"slot_hits"`
	SlotAssigns   int64 `json:"slot_assigns"`
	Evictions     int64 `json:"evictions"`
	Saves         int64 `json:"saves"`
	SaveErrors    int64 `json:"save_errors"`
	SaveEmpty     int64 `json:"save_empty"`
	ParseErrors   int64 `json:"parse_errors"`
	StoreErrors   int64 `json:"store_errors"`
	Restores      int64 `json:"restores"`
	RestoreMisses int64 `json:"restore_misses"`
	RestoreErrors int64 `json:"restore_errors"`
	SavedBytes    int64 `json:"saved_bytes"`
	RestoredBytes int64 `json:"restored_bytes"`
	// MeanSaveMs and MeanRestoreMs are the mean wall time of a successful
	// save (HTTP call, reading and parsing the file, storing it) and
	// restore (fetching from the tiers, writing the file, HTTP call).
	MeanSaveMs    float64 `json:"mean_save_ms"`
	MeanRestoreMs float64 `json:"mean_restore_ms"`
	// RestoredFrom counts restores by the tier that held the state.
	RestoredFrom map[string]int64 `json:"restored_from,omitempty"`
	// RestoreSkips counts states found but not worth restoring (too short,
	// or the restore would cost more than the prefill it saves).
	RestoreSkips int64 `json:"restore_skips"`
	// PrefixReuses counts restores of a state another session saved.
	PrefixReuses int64 `json:"prefix_reuses"`
	// Refused counts states not restored because the server's KV layout
	// differs from theirs.
	Refused int64 `json:"refused"`
	// UnusedRestores counts restores the engine accepted but did not
	// reuse; RestoresOff is true once they stopped restores.
	UnusedRestores int64 `json:"unused_restores"`
	RestoresOff    bool  `json:"restores_off"`
	// Restarts counts times the server was found restarted or unreachable;
	// SlotsLost slots whose KV another client replaced.
	Restarts  int64 `json:"restarts"`
	SlotsLost int64 `json:"slots_lost"`
	// BackgroundCalls counts the sidecar's own calls placed on slots.
	BackgroundCalls int64 `json:"background_calls"`
	// BackgroundCancelled counts background calls cancelled because a
	// client request needed their slot; ClientWaits the client requests
	// placed on a slot busy with background work (each cancelled it, or
	// waited for it when it could not be cancelled). The goal is 0 waits.
	BackgroundCancelled int64 `json:"background_cancelled"`
	ClientWaits         int64 `json:"client_waits"`
	// Preloads counts states restored into an idle slot ahead of their
	// session's request (LlamaCPPOptions.Preload), off the request path:
	// Restores counts only those on it. PreloadsUsed counts the preloaded
	// states their session came back to; PreloadsWasted those another
	// session's placement, a forget or an engine restart dropped first;
	// PreloadsAbandoned the preloads given up before the engine was asked
	// (a client request arrived while the state was fetched);
	// PreloadWaits the client requests that waited for the preload of
	// their own state to finish; PreloadErrors the preloads that failed.
	// MeanPreloadMs is the mean time of a preload (fetch and restore).
	Preloads          int64   `json:"preloads"`
	PreloadsUsed      int64   `json:"preloads_used"`
	PreloadsWasted    int64   `json:"preloads_wasted"`
	PreloadsAbandoned int64   `json:"preloads_abandoned"`
	PreloadWaits      int64   `json:"preload_waits"`
	PreloadErrors     int64   `json:"preload_errors"`
	MeanPreloadMs     float64 `json:"mean_preload_ms"`
	// States and StateBytes describe the states kept; StatesByTier where.
	States           int              `json:"states"`
	StateBytes       int64            `json:"state_bytes"`
	StatesByTier     map[string]int   `json:"states_by_tier,omitempty"`
	StateBytesByTier map[string]int64 `json:"state_bytes_by_tier,omitempty"`
	// StatesDeleted counts states dropped (superseded or over the cap).
	StatesDeleted int64 `json:"states_deleted"`
	// ReusedTokens sums cache_n of restored requests: prompt tokens the
	// engine did not reprocess thanks to a restore. ReplacedPrefillMs is
	// what prefilling them would have cost at the measured rate, against
	// RestoreMsTotal, what the restores took.
	ReusedTokens      int64   `json:"reused_tokens"`
	ReplacedPrefillMs float64 `json:"replaced_prefill_ms"`
	RestoreMsTotal    float64 `json:"restore_ms_total"`
	// QueueDepth is the slots whose KV waits for a background save.
	QueueDepth int `json:"queue_depth"`
	// SharedPuts counts states written through to the fleet's shared
	// store, SharedFetches states taken from it (another replica's), and
	// SharedErrors its failures (the request went on with local states).
	SharedPuts    int64 `json:"shared_puts"`
	SharedFetches int64 `json:"shared_fetches"`
	SharedErrors  int64 `json:"shared_errors"`

	// TimedResponses counts responses that carried timings or usage;
	// Timings sums them. CachedRatio is CacheN / (CacheN + PromptN).
	TimedResponses int64   `json:"timed_responses"`
	Timings        Timings `json:"timings"`
	CachedRatio    float64 `json:"cached_ratio"`
}

// timingStats accumulates response timings; shared by connectors.
type timingStats struct {
	requests, responses, hookErrors atomic.Int64

	// mu protects the fields below.
	mu    sync.Mutex
	timed int64
	sum   Timings
}

func (t *timingStats) record(tm Timings) {
	t.mu.Lock()
	t.timed++
	t.sum.add(tm)
	t.mu.Unlock()
}

func (t *timingStats) fill(s *Stats) {
	s.Requests = t.requests.Load()
	s.Responses = t.responses.Load()
	s.HookErrors = t.hookErrors.Load()
	t.mu.Lock()
	s.TimedResponses, s.Timings = t.timed, t.sum
	t.mu.Unlock()
	if d := s.Timings.CacheN + s.Timings.PromptN; d > 0 {
		s.CachedRatio = float64(s.Timings.CacheN) / float64(d)
	}
}

// MaxTimingsBody bounds the bytes ParseTimings reads.
const MaxTimingsBody = 8 << 20

// ParseTimings extracts prompt timings from a response body: a JSON object
// or SSE "data:" lines (the last event with timings or usage wins).
// llama.cpp's timings (cache_n, prompt_n, prompt_ms, predicted_*) are
// preferred; otherwise usage.prompt_tokens and
// usage.prompt_tokens_details.cached_tokens give CacheN and PromptN (the
// uncached part). It reports false when there is neither.
func ParseTimings(body []byte) (Timings, bool) {
	if len(body) == 0 || len(body) > MaxTimingsBody {
		return Timings{}, false
	}
	t := bytes.TrimSpace(body)
	if len(t) > 0 && t[0] == '{' {
		return timingsOf(t)
	}
	var (
		best Timings
		ok   bool
	)
	for line := range bytes.SplitSeq(t, []byte("\n")) {
		line = bytes.TrimSpace(line)
		p, found := bytes.CutPrefix(line, []byte("data:"))
		if !found {
			continue
		}
		if tm, has := timingsOf(bytes.TrimSpace(p)); has {
			best, ok = tm, true
		}
	}
	return best, ok
}

// timingsOf reads the prompt figures of one JSON object. It reads in place
// (gjson, no decoding of the rest: an answer costs no allocation;
// BenchmarkParseTimings) and keeps encoding/json's strictness where it
// matters: an invalid object, or a "timings" or "usage" of the wrong type,
// gives nothing; a later duplicate key wins.
func timingsOf(obj []byte) (Timings, bool) {
	if len(obj) == 0 || obj[0] != '{' || !gjson.ValidBytes(obj) {
		return Timings{}, false
	}
	var timings, usage gjson.Result
	// A string view of obj: no result outlives the call.
	gjson.Parse(unsafe.String(unsafe.SliceData(obj), len(obj))).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "timings":
			timings = v
		case "usage":
			usage = v
		}
		return true
	})
	var (
		tm             Timings
		cacheN, cached gjson.Result
		bad            bool
	)
	intOf := func(r gjson.Result) int64 {
		switch {
		case r.Type == gjson.Null:
		case r.Type != gjson.Number || strings.ContainsAny(r.Raw, ".eE"):
			bad = true // encoding/json refuses it for an int64
		default:
			return int64(r.Num)
		}
		return 0
	}
	floatOf := func(r gjson.Result) float64 {
		if r.Type != gjson.Null && r.Type != gjson.Number {
			bad = true
		}
		return r.Num
	}
	if !objectOrNull(usage) || !objectOrNull(timings) {
		return Timings{}, false
	}
	found := usage.IsObject() // usage or timings: something to report
	if found {
		var details gjson.Result
		usage.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "prompt_tokens":
				tm.PromptN = intOf(v)
			case "prompt_tokens_details":
				details = v
			}
			return true
		})
		if !objectOrNull(details) {
			return Timings{}, false
		}
		details.ForEach(func(k, v gjson.Result) bool {
			if k.Str == "cached_tokens" {
				cached = v
			}
			return true
		})
		tm.CacheN = intOf(cached)
		if details.IsObject() {
			tm.PromptN = max(0, tm.PromptN-tm.CacheN)
		}
	}
	if timings.IsObject() {
		usageCache := tm.CacheN
		tm = Timings{}
		timings.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "cache_n":
				cacheN = v
			case "prompt_n":
				tm.PromptN = intOf(v)
			case "prompt_ms":
				tm.PromptMs = floatOf(v)
			case "predicted_n":
				tm.PredictedN = intOf(v)
			case "predicted_ms":
				tm.PredictedMs = floatOf(v)
			}
			return true
		})
		tm.CacheN = usageCache
		if cacheN.Exists() && cacheN.Type != gjson.Null {
			tm.CacheN = intOf(cacheN)
		}
		found = true
	}
	if bad || !found {
		return Timings{}, false
	}
	return tm, true
}

// objectOrNull reports whether r is absent, null or an object: what
// encoding/json decodes into a pointer to a struct.
func objectOrNull(r gjson.Result) bool {
	return !r.Exists() || r.Type == gjson.Null || r.IsObject()
}

// setSlotFields returns body with the top-level "id_slot" set to slot and
// "cache_prompt" set to true. Other members keep their order and bytes;
// when neither field is present the body is only prefixed. body must be a
// JSON object; otherwise the error says why and body should be forwarded
// as it is.
func setSlotFields(body []byte, slot int) ([]byte, error) {
	t := bytes.TrimLeft(body, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return body, fmt.Errorf("engine: request body is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil {
		return body, fmt.Errorf("engine: request body: %w", err)
	}
	type member struct {
		key string
		val json.RawMessage
	}
	var (
		members []member
		present bool
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return body, fmt.Errorf("engine: request body: %w", err)
		}
		k, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return body, fmt.Errorf("engine: request body: %w", err)
		}
		if k == "id_slot" || k == "cache_prompt" {
			present = true
		}
		members = append(members, member{k, v})
	}
	if _, err := dec.Token(); err != nil {
		return body, fmt.Errorf("engine: request body: %w", err)
	}
	if rest := bytes.TrimSpace(t[dec.InputOffset():]); len(rest) != 0 {
		return body, fmt.Errorf("engine: request body: data after the object")
	}
	out := make([]byte, 0, len(body)+40)
	out = append(out, `{"id_slot":`...)
	out = strconv.AppendInt(out, int64(slot), 10)
	out = append(out, `,"cache_prompt":true`...)
	if !present {
		if len(members) > 0 {
			out = append(out, ',')
			out = append(out, bytes.TrimLeft(t[1:], " \t\r\n")...)
		} else {
			out = append(out, '}')
		}
		return out, nil
	}
	for _, m := range members {
		if m.key == "id_slot" || m.key == "cache_prompt" {
			continue
		}
		out = append(out, ',')
		kb, _ := json.Marshal(m.key)
		out = append(out, kb...)
		out = append(out, ':')
		out = append(out, m.val...)
	}
	return append(out, '}'), nil
}
