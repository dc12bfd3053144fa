package engine

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/internal/jsonscan"
)

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

// Add adds o to t.
func (t *Timings) Add(o Timings) {
	t.CacheN += o.CacheN
	t.PromptN += o.PromptN
	t.PromptMs += o.PromptMs
	t.PredictedN += o.PredictedN
	t.PredictedMs += o.PredictedMs
}

// SessionStats is one session's view in a connector.
type SessionStats struct {
	// Slot is the engine slot the session holds; -1 when none.
	Slot int `json:"slot"`
	// Requests counts Before calls for the session.
	Requests int64 `json:"requests"`
	// Saves and Restores count the session's KV moved out of and into
	// the engine; SavedTokens and SavedBytes describe the last save.
	Saves    int64 `json:"saves"`
	Restores int64 `json:"restores"`
	// Preloads counts the session's states restored ahead of its
	// requests; they are not in Restores.
	Preloads    int64 `json:"preloads"`
	SavedTokens int   `json:"saved_tokens"`
	SavedBytes  int64 `json:"saved_bytes"`
	// Last is the last response's timings; Total their sums.
	Last  Timings `json:"last"`
	Total Timings `json:"total"`
}

// Stats are the counters every connector keeps (the console's figures and
// the sidecar_engine_* families every connector writes). A connector with
// more embeds Stats in a struct of its own (its Report), which marshals
// into one JSON object.
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
	// Sessions are the sessions the connector keeps records of.
	Sessions int `json:"sessions"`

	// Slots is how many requests the engine runs at once, when known
	// (0: unknown, or an engine that batches).
	Slots int `json:"slots,omitempty"`
	// BackgroundCalls counts the sidecar's own calls placed on slots.
	BackgroundCalls int64 `json:"background_calls"`
	// BackgroundCancelled counts background calls cancelled because a
	// client request needed their slot; ClientWaits the client requests
	// placed on a slot busy with background work (each cancelled it, or
	// waited for it when it could not be cancelled). The goal is 0 waits.
	BackgroundCancelled int64 `json:"background_cancelled"`
	ClientWaits         int64 `json:"client_waits"`

	// ReusedTokens sums cache_n of the requests whose KV the connector put
	// in the engine (restored): prompt tokens the engine did not reprocess
	// thanks to it. 0 for a connector that moves no KV.
	ReusedTokens int64 `json:"reused_tokens"`

	// TimedResponses counts responses that carried timings or usage;
	// Timings sums them. CachedRatio is CacheN / (CacheN + PromptN).
	TimedResponses int64   `json:"timed_responses"`
	Timings        Timings `json:"timings"`
	CachedRatio    float64 `json:"cached_ratio"`
}

// Common returns s: Stats is the Report of a connector with nothing more,
// and the part of every Report that embeds it.
func (s Stats) Common() Stats { return s }

// Report is a snapshot of a connector's counters: Stats, or a struct of
// the connector's own that embeds it (and so has Common). The console
// shows it as JSON (/admin/v1/kv "engine").
type Report interface {
	Common() Stats
}

// TimingStats counts a connector's hooks and sums its responses' timings.
// The zero value is ready; safe for concurrent use.
type TimingStats struct {
	Requests, Responses, HookErrors atomic.Int64

	// mu protects the fields below.
	mu    sync.Mutex
	timed int64
	sum   Timings
}

// Record adds one response's timings.
func (t *TimingStats) Record(tm Timings) {
	t.mu.Lock()
	t.timed++
	t.sum.Add(tm)
	t.mu.Unlock()
}

// Fill sets s's hook counts, timings and cached ratio.
func (t *TimingStats) Fill(s *Stats) {
	s.Requests = t.Requests.Load()
	s.Responses = t.Responses.Load()
	s.HookErrors = t.HookErrors.Load()
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
// (jsonscan checks the object and hands over its top-level members in one
// pass; gjson reads only "usage" and "timings": an answer costs no
// allocation; BenchmarkParseTimings) and keeps encoding/json's strictness
// where it matters: an invalid object, or a "timings" or "usage" of the
// wrong type, gives nothing; a later duplicate key wins.
func timingsOf(obj []byte) (Timings, bool) {
	if len(obj) == 0 || obj[0] != '{' {
		return Timings{}, false
	}
	var timingsRaw, usageRaw []byte
	m := jsonscan.Members(obj)
	for m.Next() {
		switch jsonscan.Name(m.Key()) {
		case "timings":
			timingsRaw = m.Value()
		case "usage":
			usageRaw = m.Value()
		}
	}
	if !m.Valid() {
		return Timings{}, false
	}
	// String views of obj: no result outlives the call.
	timings := gjson.Parse(unsafe.String(unsafe.SliceData(timingsRaw), len(timingsRaw)))
	usage := gjson.Parse(unsafe.String(unsafe.SliceData(usageRaw), len(usageRaw)))
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
