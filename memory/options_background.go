package memory

import (
	"errors"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
)

// ExtractionOptions configure the sidecar's own model calls (fact and
// episode extraction, summaries). They run in goroutines the Store owns,
// never on the request path, and are coalesced per session: at most one
// extraction job and one summary in flight per session, each started only
// after a client turn completed, each covering every message that waited
// (so upstream calls per client turn stay bounded whatever the message
// count).
type ExtractionOptions struct {
	// Extractor runs fact extraction and episodic summaries. Nil:
	// extraction off.
	Extractor Extractor
	// Every: facts are extracted once this many new messages accumulated
	// in a session. Zero: 6; negative: no fact extraction.
	Every int
	// EpisodeEvery: an episodic summary is made once this many messages
	// accumulated since the last one. Zero: 30; negative: no episodes.
	EpisodeEvery int
	// PromptBytes bounds the messages one job's prompt carries (the newest
	// that fit; older waiting ones are marked done, they stay in the
	// log). Zero: 24 KiB.
	PromptBytes int
	// Queue bounds queued extraction jobs; a full queue drops the job
	// (Stats.ExtractDropped) and the session retries after its next
	// turn. Zero: 64.
	Queue int
	// Workers is the number of extraction goroutines. Zero: 1.
	Workers int
	// Timeout bounds one Extractor call. Zero: 2m.
	Timeout time.Duration
	// MaxFacts bounds a session's categorized memories; ADD beyond it is
	// rejected. Zero: 1000.
	MaxFacts int

	// Summarizer makes summaries for StrategySummary. Nil: no summaries;
	// StrategySummary then behaves as StrategyImportance.
	Summarizer Summarizer
	// SummaryTimeout bounds one Summarize call. Zero: 2m.
	SummaryTimeout time.Duration
	// MaxConcurrentSummaries bounds summarizer calls in flight over all
	// sessions. Zero: 2.
	MaxConcurrentSummaries int
}

func (o *ExtractionOptions) ensureDefaults() {
	if o.Every == 0 {
		o.Every = 6
	}
	if o.EpisodeEvery == 0 {
		o.EpisodeEvery = 30
	}
	if o.PromptBytes == 0 {
		o.PromptBytes = 24 << 10
	}
	if o.Queue == 0 {
		o.Queue = 64
	}
	if o.Workers == 0 {
		o.Workers = 1
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.MaxFacts == 0 {
		o.MaxFacts = 1000
	}
	if o.SummaryTimeout == 0 {
		o.SummaryTimeout = 2 * time.Minute
	}
	if o.MaxConcurrentSummaries == 0 {
		o.MaxConcurrentSummaries = 2
	}
}

func (o *ExtractionOptions) validate() error {
	if o.Timeout < 0 || o.SummaryTimeout < 0 {
		return errors.New("memory: Extraction durations must not be negative")
	}
	if o.Queue < 0 || o.Workers < 0 || o.MaxFacts < 0 || o.MaxConcurrentSummaries < 0 || o.PromptBytes < 0 {
		return errors.New("memory: Extraction sizes must not be negative")
	}
	return nil
}

// ReviewerOptions configure the memory reviewer (review.go); see
// knowledge.ReviewerOptions.
type ReviewerOptions = knowledge.ReviewerOptions

// ToolContextOptions configure tool-result context (toolctx.go); see
// knowledge.ToolContextOptions.
type ToolContextOptions = knowledge.ToolContextOptions

// L4Options configure L4 compression (l4.go); see knowledge.L4Options.
type L4Options = knowledge.L4Options
