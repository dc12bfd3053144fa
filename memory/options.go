package memory

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// Sentinel errors. Classify with errors.Is; returned errors wrap them with
// context and the "memory:" prefix.
var (
	// ErrNotFound: the session does not exist for this tenant (it may exist
	// for another tenant; callers cannot tell, by design).
	ErrNotFound = errors.New("memory: session not found")
	// ErrInvalid: the caller passed something unusable (empty session id,
	// malformed message). The proxy answers 400.
	ErrInvalid = errors.New("memory: invalid request")
	// ErrContextTooLarge: the client's system messages, the newest user
	// message and what follows it, and the tools do not fit the hard limit
	// even with nothing else. The proxy answers 400 (context_length_exceeded).
	ErrContextTooLarge = errors.New("memory: context too large for the window")
	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("memory: store closed")
	// ErrCorrupt marks a log record that failed its checks. It matches
	// durable.ErrCorrupt.
	ErrCorrupt = durable.NewCorrupt("memory: corrupt record")
)

// FsyncPolicy says when a session log is fsynced.
type FsyncPolicy uint8

const (
	// FsyncAlways fsyncs every append before it is acknowledged (default).
	FsyncAlways FsyncPolicy = iota
	// FsyncInterval fsyncs dirty logs every Options.FsyncInterval; a crash of
	// the machine (not of the process) can lose that much.
	FsyncInterval
	// FsyncNever leaves flushing to the OS; survives kill -9, not power loss.
	FsyncNever
)

func (p FsyncPolicy) String() string {
	switch p {
	case FsyncAlways:
		return "always"
	case FsyncInterval:
		return "interval"
	case FsyncNever:
		return "never"
	}
	return fmt.Sprintf("FsyncPolicy(%d)", uint8(p))
}

// ParseFsyncPolicy parses "always", "interval" or "never" ("" is always).
func ParseFsyncPolicy(s string) (FsyncPolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "always":
		return FsyncAlways, nil
	case "interval":
		return FsyncInterval, nil
	case "never":
		return FsyncNever, nil
	}
	return 0, fmt.Errorf("memory: unknown fsync policy %q (want always|interval|never)", s)
}

// Strategy selects how the window overflows.
type Strategy uint8

const (
	// StrategyImportance (default) drops the lowest-scored history first:
	// 0.4 semantic similarity to the newest user message + 0.3 recency +
	// 0.2 user emphasis + 0.1 structure; kept messages stay in order.
	StrategyImportance Strategy = iota
	// StrategyTail drops the oldest history first.
	StrategyTail
	// StrategySummary replaces older turns by a running summary made by
	// Options.Summarizer in the background. Until a summary exists it
	// behaves as StrategyImportance; afterwards it drops oldest first.
	StrategySummary
)

func (s Strategy) String() string {
	switch s {
	case StrategyImportance:
		return "importance"
	case StrategyTail:
		return "tail"
	case StrategySummary:
		return "summary"
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// ParseStrategy parses "importance", "tail" or "summary" ("" is importance).
func ParseStrategy(s string) (Strategy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "importance":
		return StrategyImportance, nil
	case "tail", "cutoff", "tail-cutoff":
		return StrategyTail, nil
	case "summary":
		return StrategySummary, nil
	}
	return 0, fmt.Errorf("memory: unknown strategy %q (want importance|tail|summary)", s)
}

// BlockRefresh says when the injected memory block may change.
type BlockRefresh uint8

const (
	// BlockRefreshOnEvict (default) keeps the block byte for byte while no
	// history leaves the window, so consecutive prompts extend each other
	// and the upstream's prefix cache covers the whole history; recall runs
	// again when the history is cut (the cached prefix breaks there anyway)
	// or when what the block shows changed.
	BlockRefreshOnEvict BlockRefresh = iota
	// BlockRefreshEveryTurn recalls for every request: fresher memories,
	// at the cost of a prefix-cache miss after the system message whenever
	// the recalled set changes.
	BlockRefreshEveryTurn
)

// Clock is the time source; tests inject a fake one. It must be safe for
// concurrent use (the worker reads it too).
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Options configure a Store. The zero value of every field is a documented
// default; only Dir is required.
type Options struct {
	// Dir is the root of the session logs, normally <data-dir>/sessions.
	// Required. Created if missing.
	Dir string

	// Fsync is when logs are fsynced. Zero: FsyncAlways.
	Fsync FsyncPolicy
	// FsyncInterval is the period for FsyncInterval. Zero: 1s.
	FsyncInterval time.Duration

	// HardLimit is the window's token limit. Zero: 8192.
	HardLimit int
	// ModelLimits overrides HardLimit per model: exact names, or prefixes
	// ending in "*" (longest prefix wins). Nil: none.
	ModelLimits map[string]int
	// SystemReserve is reserved for the client's system messages: history
	// gets what is left after max(SystemReserve, system cost). Zero: 1024.
	SystemReserve int
	// ToolsReserve is reserved for tools/functions: history gets what is left
	// after max(ToolsReserve, tools cost). Zero: 1024.
	ToolsReserve int
	// Strategy selects overflow handling. Zero: StrategyImportance.
	Strategy Strategy
	// EvictTo is the hysteresis of eviction: when history overflows, it is
	// cut down to EvictTo × its budget so the next turns append without
	// evicting again (and share their prefix). In (0, 1]. Zero: 0.75.
	EvictTo float64

	// Encoding forces one tiktoken encoding for every model ("cl100k_base",
	// "o200k_base", "p50k_base", "r50k_base"). Empty: chosen by model name.
	Encoding string
	// ModelEncodings overrides the encoding per model, keys as ModelLimits.
	ModelEncodings map[string]string
	// TokenCacheEntries bounds the token-count cache. Zero: 65536.
	TokenCacheEntries int

	// InjectMaxTokens caps the injected memory block. Zero: 1024.
	InjectMaxTokens int
	// RecallK is how many memories recall may inject. Zero: 4; negative: none.
	RecallK int
	// RecallMinScore gates recall: hits scoring below it are not injected.
	// Zero: 0.15.
	RecallMinScore float64
	// Recaller ranks memory units for the newest user message when the
	// index is off or fails. Nil: keyword (bag-of-words cosine) recall.
	Recaller Recaller

	// IndexDisabled turns the per-session RAG index off; recall then uses
	// Recaller over the working-tier units.
	IndexDisabled bool
	// Index configures the per-session indexes (package index). Zero
	// value: index defaults with the offline embedder, Rerank
	// index.DefaultRerank and Now from Clock. An index hit passes
	// RecallMinScore when a query term matched it (BM25) or its cosine
	// similarity reaches it.
	Index index.Options
	// IndexSaveInterval is the least time between two saves of a session's
	// index file by the worker (Close saves every changed one). Zero: 30s.
	IndexSaveInterval time.Duration

	// ActiveSetSize is the capacity of a session's working memory (the
	// active set of recently recalled memories). Zero: 7.
	ActiveSetSize int
	// ActiveSetDecay: an active memory not activated for this long leaves
	// the set. Zero: 300s.
	ActiveSetDecay time.Duration
	// ProbeK is the depth of the light probe that decides whether a turn
	// stays on the active topic. Zero: 3.
	ProbeK int
	// ReuseOverlap: a probe whose share of hits in the active set and its
	// linked neighbours reaches this reuses the recalled set; below it, a
	// full recall of RecallK refreshes it. In (0, 1]. Zero: 0.6.
	ReuseOverlap float64
	// LinkHalfLife is the half-life of the Hebbian links between memories
	// recalled together. Zero: 30m.
	LinkHalfLife time.Duration

	// DecayEvery is how often the decay pass runs on a loaded session; a
	// session loaded (after a restart) more than this after its last pass
	// catches up at once. Zero: 24h.
	DecayEvery time.Duration
	// BoostAmount is what one BOOST adds to a memory's importance, within
	// BoostCooldown and MaxBoostPerDay. Zero: 0.5.
	BoostAmount float64

	// Extractor runs fact extraction and episodic summaries through the
	// upstream model, in background goroutines the Store owns, never on the
	// request path. Nil: extraction off.
	Extractor Extractor
	// ExtractEvery: facts are extracted once this many new messages
	// accumulated in a session. Zero: 6; negative: no fact extraction.
	ExtractEvery int
	// EpisodeEvery: an episodic summary is made each time a session's
	// history passes this many messages since the last one. Zero: 30;
	// negative: no episodes.
	EpisodeEvery int
	// ExtractQueue bounds queued extraction jobs; a full queue drops the
	// job (Stats.ExtractDropped) and the session retries after its next
	// turn. Zero: 64.
	ExtractQueue int
	// ExtractWorkers is the number of extraction goroutines. Zero: 1.
	ExtractWorkers int
	// ExtractTimeout bounds one Extractor call. Zero: 2m.
	ExtractTimeout time.Duration
	// MaxFacts bounds a session's categorized memories; ADD beyond it is
	// rejected. Zero: 1000.
	MaxFacts int

	// PoolMaxValueBytes bounds a pool entry's value (JSON). Zero: 1 MiB.
	PoolMaxValueBytes int
	// PoolMaxEntries bounds the entries of one tenant's pool. Zero: 100000.
	PoolMaxEntries int

	// BlockRefresh says when the injected block may change. Zero:
	// BlockRefreshOnEvict.
	BlockRefresh BlockRefresh
	// Summarizer makes summaries for StrategySummary. Nil: no summaries;
	// StrategySummary then behaves as StrategyImportance.
	Summarizer Summarizer
	// SummaryTimeout bounds one Summarize call. Zero: 2m.
	SummaryTimeout time.Duration
	// MaxConcurrentSummaries bounds summarizer calls in flight. Zero: 2.
	MaxConcurrentSummaries int

	// QueueSize bounds the worker queue (sessions waiting for background
	// writes). A full queue never blocks a request: the session stays dirty
	// and is picked up by its next Complete. Zero: 1024.
	QueueSize int
	// WorkingMaxUnits is the most working-tier units a session keeps; older
	// ones (by last access) move to archive. Zero: 256.
	WorkingMaxUnits int
	// ArchiveAfter moves working units not accessed for this long to
	// archive. Zero: 24h.
	ArchiveAfter time.Duration
	// PendingWait is how long Prepare waits for the previous turn of the same
	// session to Complete, so that append-mode history stays in order.
	// Zero: 2s; negative: do not wait.
	PendingWait time.Duration
	// MaxLoadedSessions bounds sessions kept in memory; idle ones are
	// dropped from memory (never from disk) beyond it. Zero: 4096.
	MaxLoadedSessions int
	// MaxRecordBytes bounds one log record. Zero: 16 MiB.
	MaxRecordBytes int

	// Storage bounds open files, disk use and retention, and what is kept
	// of a reply (see StorageOptions).
	Storage StorageOptions

	// Clock is the time source. Nil: the system clock.
	Clock Clock
	// Logger receives warnings (quarantined log tails, summarizer errors).
	// Nil: discarded.
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.FsyncInterval == 0 {
		o.FsyncInterval = time.Second
	}
	if o.HardLimit == 0 {
		o.HardLimit = 8192
	}
	if o.SystemReserve == 0 {
		o.SystemReserve = 1024
	}
	if o.ToolsReserve == 0 {
		o.ToolsReserve = 1024
	}
	if o.EvictTo == 0 {
		o.EvictTo = 0.75
	}
	if o.TokenCacheEntries == 0 {
		o.TokenCacheEntries = 65536
	}
	if o.InjectMaxTokens == 0 {
		o.InjectMaxTokens = 1024
	}
	if o.RecallK == 0 {
		o.RecallK = 4
	}
	if o.RecallMinScore == 0 {
		o.RecallMinScore = 0.15
	}
	if o.Recaller == nil {
		o.Recaller = KeywordRecaller{}
	}
	if o.SummaryTimeout == 0 {
		o.SummaryTimeout = 2 * time.Minute
	}
	if o.MaxConcurrentSummaries == 0 {
		o.MaxConcurrentSummaries = 2
	}
	if o.QueueSize == 0 {
		o.QueueSize = 1024
	}
	if o.WorkingMaxUnits == 0 {
		o.WorkingMaxUnits = 256
	}
	if o.ArchiveAfter == 0 {
		o.ArchiveAfter = 24 * time.Hour
	}
	if o.PendingWait == 0 {
		o.PendingWait = 2 * time.Second
	}
	if o.MaxLoadedSessions == 0 {
		o.MaxLoadedSessions = 4096
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = 16 << 20
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.IndexSaveInterval == 0 {
		o.IndexSaveInterval = 30 * time.Second
	}
	if o.Index.Embedder == nil {
		o.Index.Embedder = index.NewHashEmbedder(index.HashOptions{})
	}
	if o.Index.Rerank == (index.RerankWeights{}) {
		o.Index.Rerank = index.DefaultRerank
	}
	if o.Index.Now == nil {
		o.Index.Now = o.Clock.Now
	}
	if o.ActiveSetSize == 0 {
		o.ActiveSetSize = 7
	}
	if o.ActiveSetDecay == 0 {
		o.ActiveSetDecay = 300 * time.Second
	}
	if o.ProbeK == 0 {
		o.ProbeK = 3
	}
	if o.ReuseOverlap == 0 {
		o.ReuseOverlap = 0.6
	}
	if o.LinkHalfLife == 0 {
		o.LinkHalfLife = 30 * time.Minute
	}
	if o.DecayEvery == 0 {
		o.DecayEvery = 24 * time.Hour
	}
	if o.BoostAmount == 0 {
		o.BoostAmount = 0.5
	}
	if o.ExtractEvery == 0 {
		o.ExtractEvery = 6
	}
	if o.EpisodeEvery == 0 {
		o.EpisodeEvery = 30
	}
	if o.ExtractQueue == 0 {
		o.ExtractQueue = 64
	}
	if o.ExtractWorkers == 0 {
		o.ExtractWorkers = 1
	}
	if o.ExtractTimeout == 0 {
		o.ExtractTimeout = 2 * time.Minute
	}
	if o.MaxFacts == 0 {
		o.MaxFacts = 1000
	}
	if o.PoolMaxValueBytes == 0 {
		o.PoolMaxValueBytes = 1 << 20
	}
	if o.PoolMaxEntries == 0 {
		o.PoolMaxEntries = 100000
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Storage.setDefaults()
}

// minHistory is the least history budget a limit must leave after the
// reserves.
const minHistory = 64

func (o *Options) validate() error {
	if o.Dir == "" {
		return errors.New("memory: Options.Dir is required")
	}
	if o.Fsync > FsyncNever {
		return fmt.Errorf("memory: invalid fsync policy %d", o.Fsync)
	}
	if o.Strategy > StrategySummary {
		return fmt.Errorf("memory: invalid strategy %d", o.Strategy)
	}
	if o.FsyncInterval < 0 || o.SummaryTimeout < 0 || o.ArchiveAfter < 0 {
		return errors.New("memory: durations must not be negative")
	}
	if o.SystemReserve < 0 || o.ToolsReserve < 0 || o.InjectMaxTokens < 0 {
		return errors.New("memory: reserves must not be negative")
	}
	checkLimit := func(name string, l int) error {
		if l < o.SystemReserve+o.ToolsReserve+minHistory {
			return fmt.Errorf("memory: limit %d for %s leaves no history after reserves %d+%d", l, name, o.SystemReserve, o.ToolsReserve)
		}
		return nil
	}
	if err := checkLimit("HardLimit", o.HardLimit); err != nil {
		return err
	}
	for m, l := range o.ModelLimits {
		if err := checkLimit(m, l); err != nil {
			return err
		}
	}
	if !(o.EvictTo > 0 && o.EvictTo <= 1) {
		return fmt.Errorf("memory: EvictTo %v not in (0, 1]", o.EvictTo)
	}
	if o.Encoding != "" {
		if _, ok := encodingByName(o.Encoding); !ok {
			return fmt.Errorf("memory: unknown encoding %q", o.Encoding)
		}
	}
	for m, e := range o.ModelEncodings {
		if _, ok := encodingByName(e); !ok {
			return fmt.Errorf("memory: unknown encoding %q for model %q", e, m)
		}
	}
	if o.TokenCacheEntries < 0 || o.QueueSize < 0 || o.WorkingMaxUnits < 0 ||
		o.MaxConcurrentSummaries < 0 || o.MaxLoadedSessions < 0 || o.MaxRecordBytes < 0 {
		return errors.New("memory: sizes must not be negative")
	}
	if o.RecallMinScore < 0 {
		return errors.New("memory: RecallMinScore must not be negative")
	}
	if o.IndexSaveInterval < 0 || o.ActiveSetDecay < 0 || o.LinkHalfLife < 0 || o.DecayEvery < 0 || o.ExtractTimeout < 0 {
		return errors.New("memory: durations must not be negative")
	}
	if o.ActiveSetSize < 0 || o.ProbeK < 0 || o.ExtractQueue < 0 || o.ExtractWorkers < 0 || o.MaxFacts < 0 ||
		o.PoolMaxValueBytes < 0 || o.PoolMaxEntries < 0 {
		return errors.New("memory: sizes must not be negative")
	}
	if !(o.ReuseOverlap > 0 && o.ReuseOverlap <= 1) {
		return fmt.Errorf("memory: ReuseOverlap %v not in (0, 1]", o.ReuseOverlap)
	}
	if !(o.BoostAmount > 0 && o.BoostAmount <= MaxBoostPerDay) {
		return fmt.Errorf("memory: BoostAmount %v not in (0, %v]", o.BoostAmount, MaxBoostPerDay)
	}
	return o.Storage.validate()
}

// lookupModel finds model in m: exact key first, then the longest key
// ending in "*" that prefixes it.
func lookupModel[V any](m map[string]V, model string) (V, bool) {
	if v, ok := m[model]; ok {
		return v, true
	}
	var best V
	bestLen := -1
	for k, v := range m {
		if p, ok := strings.CutSuffix(k, "*"); ok && strings.HasPrefix(model, p) && len(p) > bestLen {
			best, bestLen = v, len(p)
		}
	}
	return best, bestLen >= 0
}
