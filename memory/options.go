package memory

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

// Sentinel errors. Classify with errors.Is; returned errors wrap them with
// context and the "memory:" prefix. Those the subsystems share are package
// memerr's, re-exported here.
var (
	// ErrNotFound: the session does not exist for this tenant (it may exist
	// for another tenant; callers cannot tell, by design).
	ErrNotFound = memerr.ErrNotFound
	// ErrInvalid: the caller passed something unusable (empty session id,
	// malformed message). The proxy answers 400.
	ErrInvalid = memerr.ErrInvalid
	// ErrContextTooLarge: the client's system messages, the newest user
	// message and what follows it, and the tools do not fit the hard limit
	// even with nothing else. Prepare does not fail with it: such a turn is
	// recorded and forwarded exactly as sent, with no memory added
	// (TurnStats.AsSent), so the engine decides as it would on a direct
	// request.
	ErrContextTooLarge = errors.New("memory: context too large for the window")
	// ErrUserMismatch: the request names an end user other than the one
	// the session belongs to. Nothing was written; the proxy forwards the
	// request without session memory.
	ErrUserMismatch = errors.New("memory: the session belongs to another end user")
	// ErrDeferred: a background call (Summarizer, Extractor) did not run
	// because clients needed the engine; the work is tried again after a
	// later turn. Logged at debug level, not as a failure.
	ErrDeferred = errors.New("memory: background call deferred: clients needed the engine")
	// ErrClosed: the Store was closed.
	ErrClosed = memerr.ErrClosed
)

// errCorrupt marks a log record that failed its checks; callers match
// durable.ErrCorrupt.
var errCorrupt = durable.NewCorrupt("memory: corrupt record")

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
	// Extraction.Summarizer in the background. Until a summary exists it
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

// Options configure a Store. The zero value of every field is a documented
// default; only Dir is required. Fields are grouped by concern, as nested
// option structs, each with its own defaults and validation (Open applies
// EnsureDefaults and Validate).
type Options struct {
	// Dir is the root of the session logs, normally <data-dir>/sessions.
	// Required. Created if missing.
	Dir string

	// Fsync is when logs are fsynced. Zero: FsyncAlways.
	Fsync FsyncPolicy
	// FsyncInterval is the period for FsyncInterval. Zero: 1s.
	FsyncInterval time.Duration
	// MaxRecordBytes bounds one log record. Zero: 16 MiB.
	MaxRecordBytes int

	// Window shapes the window sent upstream: limits, tokenization,
	// overflow.
	Window WindowOptions
	// Recall chooses what the per-turn recall block shows: the indexes,
	// the working-memory gating, the user scope.
	Recall RecallOptions
	// Decay ages memories: categories' decay pass and boosts, tiering of
	// units from working to archive.
	Decay DecayOptions
	// Extraction configures the sidecar's own model calls: facts,
	// episodes, summaries.
	Extraction ExtractionOptions
	// Reviewer reviews facts whose importance crossed a threshold with
	// the Extractor's model (review.go).
	Reviewer ReviewerOptions
	// ToolContext condenses a turn's tool calls and results for the next
	// turn (toolctx.go).
	ToolContext ToolContextOptions
	// L4 compresses a session's facts past a threshold: similar facts
	// merged by the Extractor's model, kept only with enough fidelity
	// (l4.go).
	L4 L4Options
	// Pool bounds the tenants' shared pools.
	Pool PoolOptions
	// Storage bounds open files, disk use and retention, and what is kept
	// of a reply (see StorageOptions).
	Storage StorageOptions

	// QueueSize bounds the worker queue (sessions waiting for background
	// writes). A full queue never blocks a request: the session stays dirty
	// and is picked up by its next Complete. Zero: 1024.
	QueueSize int
	// PendingWait is how long Prepare waits for the previous turn of the same
	// session to Complete, so that append-mode history stays in order.
	// Zero: 2s; negative: do not wait.
	PendingWait time.Duration
	// MaxLoadedSessions bounds sessions kept in memory; idle ones are
	// dropped from memory (never from disk) beyond it, least recently used
	// first. It also bounds the user indexes kept in memory. Zero: 4096.
	MaxLoadedSessions int
	// MemoryBudget bounds the estimated bytes that loaded sessions and user
	// indexes hold in memory (messages, memory units, index documents):
	// beyond it the worker unloads idle ones, least recently used first,
	// after saving their indexes; they load again from disk on their next
	// turn (resident.go). Zero: 256 MiB; negative: no bound but
	// MaxLoadedSessions.
	MemoryBudget int64

	// SharedLog, when set, is a fleet's shared copy of every session's log
	// (see SharedLog and Store.Sync): records are written there first, and
	// a replica brings a session up to date from it. Nil: sessions live on
	// this machine only.
	SharedLog SharedLog
	// SharedLogTimeout bounds one exchange with SharedLog. Zero: 10 s.
	SharedLogTimeout time.Duration

	// Clock is the time source. Nil: the system clock.
	Clock clock.Clock
	// Logger receives warnings (quarantined log tails, summarizer errors).
	// Nil: discarded.
	Logger *slog.Logger
}

// WindowOptions shape the window: its hard limit, how tokens are counted,
// what is reserved, and how history overflows.
type WindowOptions struct {
	// Limit is the window's hard token limit. Zero: 8192.
	Limit int
	// ModelLimits overrides Limit per model: exact names, or prefixes
	// ending in "*" (longest prefix wins). Nil: none.
	ModelLimits map[string]int
	// SystemReserve is the least budget kept for the client's system
	// messages: history gets what is left after max(SystemReserve, the
	// largest system cost this session sent). Zero: none (the largest
	// cost seen alone keeps the history budget steady).
	SystemReserve int
	// ToolsReserve is the same for tools/functions. Zero: none.
	ToolsReserve int
	// Strategy selects overflow handling. Zero: StrategyImportance.
	Strategy Strategy
	// EvictTo is the hysteresis of eviction: when history overflows, it is
	// cut down to EvictTo × its budget, so history leaves the window in
	// large steps, the next turns append without evicting again, and the
	// prompt's stable prefix moves rarely. In (0, 1]. Zero: 0.3 (a step
	// of 70% of the history budget). Chosen by leave-one-conversation-out
	// on the LoCoMo dev file (docs/BENCHMARKS.md, "Prefill and recall,
	// tuned"): each turn's recall block stays in the transcript, so
	// history grows faster than the conversation, and every eviction moves
	// the prompt's start (the engine reprocesses what follows it); a large,
	// rare step costs the least reprocessing for the same recall.
	EvictTo float64
	// EngineShifts, when set, tells whether the engine serving model moves
	// KV it already holds to new positions (llama.cpp's KV shifting, which
	// its connector asks for and detects): history that stays in the
	// window after an eviction is then taken from the engine's cache, not
	// computed again. Eviction then keeps the newest turns whole and in
	// order (one chunk the engine shifts) and cuts only to ShiftEvictTo,
	// so the window stays full. Nil, or false: the engine recomputes what
	// follows the first change, so history leaves in the large steps of
	// EvictTo, by Strategy.
	EngineShifts func(model string) bool
	// ShiftEvictTo is EvictTo while the engine shifts: the step can be
	// small, the engine reuses what stays. In (0, 1]. Zero: 0.9 (a step of
	// a tenth of the budget: room for a turn or two and a recall block).
	ShiftEvictTo float64
	// StableMaxTokens caps the stable memory block after the client's
	// system messages (pinned system and core memories, summaries);
	// negative: none of them. Zero: 1024. The shared pool a request names
	// (TurnRequest.PoolPrefix) has its own budget, Pool.ContextTokens.
	StableMaxTokens int

	// Encoding forces one tiktoken encoding for every model ("cl100k_base",
	// "o200k_base", "p50k_base", "r50k_base"). Empty: chosen by model name.
	Encoding string
	// ModelEncodings overrides the encoding per model, keys as ModelLimits.
	ModelEncodings map[string]string
	// TokenCacheEntries bounds the token-count cache. Zero: 65536.
	TokenCacheEntries int
}

// minHistory is the least history budget a limit must leave after the
// reserves and the recall block.
const minHistory = 64

func (o *WindowOptions) ensureDefaults() {
	if o.Limit == 0 {
		o.Limit = 8192
	}
	if o.EvictTo == 0 {
		o.EvictTo = 0.3
	}
	if o.ShiftEvictTo == 0 {
		o.ShiftEvictTo = 0.9
	}
	if o.StableMaxTokens == 0 {
		o.StableMaxTokens = 1024
	}
	if o.TokenCacheEntries == 0 {
		o.TokenCacheEntries = 65536
	}
}

func (o *WindowOptions) validate(recallShare float64) error {
	if o.Strategy > StrategySummary {
		return fmt.Errorf("memory: invalid strategy %d", o.Strategy)
	}
	if o.SystemReserve < 0 || o.ToolsReserve < 0 {
		return errors.New("memory: reserves must not be negative")
	}
	checkLimit := func(name string, l int) error {
		if float64(l)*(1-recallShare) < float64(o.SystemReserve+o.ToolsReserve+minHistory) {
			return fmt.Errorf("memory: limit %d for %s leaves no history after reserves %d+%d and the recall block", l, name, o.SystemReserve, o.ToolsReserve)
		}
		return nil
	}
	if err := checkLimit("Window.Limit", o.Limit); err != nil {
		return err
	}
	for m, l := range o.ModelLimits {
		if err := checkLimit(m, l); err != nil {
			return err
		}
	}
	if !(o.EvictTo > 0 && o.EvictTo <= 1) {
		return fmt.Errorf("memory: Window.EvictTo %v not in (0, 1]", o.EvictTo)
	}
	if !(o.ShiftEvictTo > 0 && o.ShiftEvictTo <= 1) {
		return fmt.Errorf("memory: Window.ShiftEvictTo %v not in (0, 1]", o.ShiftEvictTo)
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
	if o.TokenCacheEntries < 0 {
		return errors.New("memory: Window.TokenCacheEntries must not be negative")
	}
	return nil
}

// RecallOptions choose what the per-turn recall block shows. The block sits
// right before the newest user message; its query is that message plus a
// little of the message before it.
type RecallOptions struct {
	// Share is the recall block's share of the window limit, in [0, 0.5]:
	// at the default limit it holds about 10–20 recalled conversation
	// turns. Negative: no recall block. Zero: 0.08.
	Share float64
	// StatementShare is the part of Share a message that asks nothing (no
	// question mark) gets: recall pays most where the reply depends on
	// what was said before, and each recalled token costs the engine a
	// prefill on the turn it appears. In [0, 1]. Zero: 0.25; negative:
	// none (no block for such messages).
	StatementShare float64
	// K is the most memories one block may show (the block's token share
	// usually binds first). Zero: 20; negative: none.
	K int
	// MinScore gates recall: hits scoring below it are not shown. An index
	// hit passes when it covers at least MinCoverage of the query (see
	// index.Hit.Coverage) or its cosine similarity reaches MinScore.
	// Zero: 0.15. With a model's embeddings (any embedder but the
	// offline one) the cosine counts only when it stands out, see
	// MinCosineZ.
	MinScore float64
	// MinCosineZ: with a model's embeddings, whose cosine is high for any
	// two texts, a hit passes on its embedding when its cosine stands this
	// many standard deviations above the query's similarity with the
	// memories searched (index.Hit.CosineZ). Zero: 3 (about the top 0.1%
	// of a normal spread; not tuned: no embedding model ran here);
	// negative: the plain cosine against MinScore, as offline.
	MinCosineZ float64
	// MinCoverage is the share of the query's information (IDF mass) an
	// index hit must contain to pass on its words alone: a memory that
	// shares only a frequent word with the question is not relevant enough
	// to spend prompt tokens, and cache hits, on. Zero: 0.15; negative:
	// any term match passes.
	MinCoverage float64
	// QueryContextBytes of the message before the newest user message are
	// added to the recall query when the newest message is short (fewer
	// than 4 index terms: "and then?" means little alone). Zero: 200;
	// negative: none.
	QueryContextBytes int
	// Recaller ranks memory units when the index is off or fails. Nil:
	// keyword (bag-of-words cosine) recall.
	Recaller Recaller

	// IndexDisabled turns the RAG indexes off (the session's and the
	// user's); recall then uses Recaller over the session's working-tier
	// units, and nothing is recalled across sessions.
	IndexDisabled bool
	// Index configures the indexes (package index). Zero value: index
	// defaults with the offline embedder, Rerank index.DefaultRerank and
	// Now from the Store's Clock.
	Index index.Options
	// IndexSaveInterval is the least time between two saves of an index
	// file by the worker (Close saves every changed one). Zero: 30s.
	IndexSaveInterval time.Duration
	// TenantUserScope makes the sessions that name no end user
	// (TurnRequest.UserID "") one user of their tenant: they recall each
	// other's turns, facts and episodes, so everyone holding the tenant's
	// API key shares one memory. False (default): a session without an end
	// user recalls only its own memory; recall across sessions is for the
	// sessions of a named end user.
	TenantUserScope bool
	// UserMaxDocs bounds one user's cross-session index: beyond it the
	// oldest documents leave it (they stay in their sessions' logs and
	// session indexes). Zero: 50000.
	UserMaxDocs int

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
	// linked neighbours reaches this skips the full retrieval (the
	// previous recalled set, still valid, plus the probe's hits); below it
	// a full retrieval of K refreshes it. In (0, 1]. Zero: 0.6.
	ReuseOverlap float64
	// LinkHalfLife is the half-life of the Hebbian links between memories
	// recalled together. Zero: 30m.
	LinkHalfLife time.Duration
}

func (o *RecallOptions) ensureDefaults(clk clock.Clock) {
	if o.Share == 0 {
		o.Share = 0.08
	}
	if o.K == 0 {
		o.K = 20
	}
	if o.StatementShare == 0 {
		o.StatementShare = 0.25
	}
	if o.MinScore == 0 {
		o.MinScore = 0.15
	}
	if o.MinCosineZ == 0 {
		o.MinCosineZ = 3
	}
	if o.MinCoverage == 0 {
		o.MinCoverage = 0.15
	}
	if o.QueryContextBytes == 0 {
		o.QueryContextBytes = 200
	}
	if o.Recaller == nil {
		o.Recaller = KeywordRecaller{}
	}
	if o.IndexSaveInterval == 0 {
		o.IndexSaveInterval = 30 * time.Second
	}
	if o.UserMaxDocs == 0 {
		o.UserMaxDocs = 50000
	}
	if o.Index.Embedder == nil {
		o.Index.Embedder = index.NewHashEmbedder(index.HashOptions{})
	}
	if o.Index.Rerank == (index.RerankWeights{}) {
		o.Index.Rerank = index.DefaultRerank
	}
	if o.Index.Now == nil {
		o.Index.Now = clk.Now
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
}

// share is the block's share of the window, 0 when the block is off.
func (o *RecallOptions) share() float64 { return max(o.Share, 0) }

// statementShare is StatementShare, 0 for none.
func (o *RecallOptions) statementShare() float64 { return max(o.StatementShare, 0) }

func (o *RecallOptions) validate() error {
	if o.Share > 0.5 {
		return fmt.Errorf("memory: Recall.Share %v above 0.5", o.Share)
	}
	if o.StatementShare > 1 {
		return fmt.Errorf("memory: Recall.StatementShare %v above 1", o.StatementShare)
	}
	if o.MinCoverage > 1 {
		return errors.New("memory: Recall.MinCoverage must be at most 1")
	}
	if o.MinScore < 0 {
		return errors.New("memory: Recall.MinScore must not be negative")
	}
	if o.IndexSaveInterval < 0 || o.ActiveSetDecay < 0 || o.LinkHalfLife < 0 {
		return errors.New("memory: Recall durations must not be negative")
	}
	if o.ActiveSetSize < 0 || o.ProbeK < 0 || o.UserMaxDocs < 0 {
		return errors.New("memory: Recall sizes must not be negative")
	}
	if !(o.ReuseOverlap > 0 && o.ReuseOverlap <= 1) {
		return fmt.Errorf("memory: Recall.ReuseOverlap %v not in (0, 1]", o.ReuseOverlap)
	}
	if _, err := index.New(o.Index); err != nil {
		return fmt.Errorf("memory: index options: %w", err)
	}
	return nil
}

// DecayOptions age memories: the decay pass of categorized memories, boosts,
// and the tiering of units from working to archive.
type DecayOptions struct {
	// Every is how often the decay pass runs on a loaded session; a
	// session loaded (after a restart) more than this after its last pass
	// catches up at once. Zero: 24h.
	Every time.Duration
	// BoostAmount is what one BOOST adds to a memory's importance, within
	// BoostCooldown and MaxBoostPerDay. Zero: 0.5.
	BoostAmount float64
	// WorkingMaxUnits is the most working-tier units a session keeps; older
	// ones (by last access) move to archive. Zero: 256.
	WorkingMaxUnits int
	// ArchiveAfter moves working units not accessed for this long to
	// archive. Zero: 24h.
	ArchiveAfter time.Duration
}

func (o *DecayOptions) ensureDefaults() {
	if o.Every == 0 {
		o.Every = 24 * time.Hour
	}
	if o.BoostAmount == 0 {
		o.BoostAmount = 0.5
	}
	if o.WorkingMaxUnits == 0 {
		o.WorkingMaxUnits = 256
	}
	if o.ArchiveAfter == 0 {
		o.ArchiveAfter = 24 * time.Hour
	}
}

func (o *DecayOptions) validate() error {
	if o.Every < 0 || o.ArchiveAfter < 0 {
		return errors.New("memory: Decay durations must not be negative")
	}
	if o.WorkingMaxUnits < 0 {
		return errors.New("memory: Decay.WorkingMaxUnits must not be negative")
	}
	if !(o.BoostAmount > 0 && o.BoostAmount <= MaxBoostPerDay) {
		return fmt.Errorf("memory: Decay.BoostAmount %v not in (0, %v]", o.BoostAmount, MaxBoostPerDay)
	}
	return nil
}

// PoolOptions bound the tenants' shared pools, their events and what a
// request that opts in sees of them (package memory/internal/pool).
type PoolOptions struct {
	// MaxValueBytes bounds a pool entry's value (JSON). Zero: 1 MiB.
	MaxValueBytes int
	// MaxEntries bounds the entries of one tenant's pool. Zero: 100000.
	MaxEntries int

	// ContextTokens bounds the pool entries a request that names a pool
	// prefix (TurnRequest.PoolPrefix) gets in its stable block, newest
	// first. Zero: 512; negative: the pool is never shown.
	ContextTokens int
	// ContextMaxEntries bounds the entries considered for it (the
	// newest). Zero: 32.
	ContextMaxEntries int

	// MaxSubscribers bounds the event subscriptions (PoolSubscribe) of all
	// tenants, MaxTenantSubscribers those of one tenant. Zero: 256 and 32.
	MaxSubscribers, MaxTenantSubscribers int
	// EventBuffer is how many events a subscriber may have pending; one
	// further behind is ended (PoolSubscription.Lagged). Zero: 256.
	EventBuffer int
	// EventHistory is how many of its newest events a pool remembers to
	// replay to a subscriber that reconnects. Zero: 1024.
	EventHistory int
}

func (o *PoolOptions) ensureDefaults() {
	if o.MaxValueBytes == 0 {
		o.MaxValueBytes = 1 << 20
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = 100000
	}
	if o.ContextTokens == 0 {
		o.ContextTokens = 512
	}
	if o.ContextMaxEntries == 0 {
		o.ContextMaxEntries = 32
	}
	if o.MaxSubscribers == 0 {
		o.MaxSubscribers = 256
	}
	if o.MaxTenantSubscribers == 0 {
		o.MaxTenantSubscribers = 32
	}
	if o.EventBuffer == 0 {
		o.EventBuffer = 256
	}
	if o.EventHistory == 0 {
		o.EventHistory = 1024
	}
}

func (o *PoolOptions) validate() error {
	if o.MaxValueBytes < 0 || o.MaxEntries < 0 || o.ContextMaxEntries < 0 || o.MaxSubscribers < 0 ||
		o.MaxTenantSubscribers < 0 || o.EventBuffer < 0 || o.EventHistory < 0 {
		return errors.New("memory: Pool sizes must not be negative")
	}
	return nil
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. Open calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.FsyncInterval == 0 {
		o.FsyncInterval = time.Second
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = 16 << 20
	}
	if o.QueueSize == 0 {
		o.QueueSize = 1024
	}
	if o.PendingWait == 0 {
		o.PendingWait = 2 * time.Second
	}
	if o.MaxLoadedSessions == 0 {
		o.MaxLoadedSessions = 4096
	}
	if o.MemoryBudget == 0 {
		o.MemoryBudget = DefaultMemoryBudget
	}
	if o.SharedLogTimeout == 0 {
		o.SharedLogTimeout = 10 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Window.ensureDefaults()
	o.Recall.ensureDefaults(o.Clock)
	o.Decay.ensureDefaults()
	o.Extraction.ensureDefaults()
	o.Reviewer.EnsureDefaults()
	o.ToolContext.EnsureDefaults()
	o.L4.EnsureDefaults()
	o.Pool.ensureDefaults()
	o.Storage.ensureDefaults()
	return o
}

// Validate checks options after EnsureDefaults.
func (o *Options) Validate() error {
	if o.Dir == "" {
		return errors.New("memory: Options.Dir is required")
	}
	if o.Fsync > FsyncNever {
		return fmt.Errorf("memory: invalid fsync policy %d", o.Fsync)
	}
	if o.FsyncInterval < 0 {
		return errors.New("memory: FsyncInterval must not be negative")
	}
	if o.QueueSize < 0 || o.MaxLoadedSessions < 0 || o.MaxRecordBytes < 0 || o.SharedLogTimeout < 0 {
		return errors.New("memory: sizes must not be negative")
	}
	return errors.Join(o.Window.validate(o.Recall.share()), o.Recall.validate(), o.Decay.validate(),
		o.Extraction.validate(), o.Reviewer.Validate(), o.ToolContext.Validate(), o.L4.Validate(), o.Pool.validate(), o.Storage.validate())
}

// DefaultMemoryBudget is Options.MemoryBudget's default.
const DefaultMemoryBudget = 256 << 20

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
