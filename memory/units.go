package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Place says where a message or unit lives. Messages in the window are
// focus; what left it is working, then archive. These are labels of the
// text memory (the JSON field that carries them is "tier"); the KV tensors'
// tiers are package tiers' Tier, unrelated.
type Place string

const (
	PlaceFocus   Place = "focus"
	PlaceWorking Place = "working"
	PlaceArchive Place = "archive"
)

// UnitType classifies a memory unit.
type UnitType string

const (
	UnitTask    UnitType = "task"    // something the user asked for
	UnitContext UnitType = "context" // conversation context (replies, tool results)
	UnitFact    UnitType = "fact"    // a fact extracted by the summarizer
	UnitSummary UnitType = "summary" // a summary of evicted turns
	UnitEpisode UnitType = "episode" // an episodic summary made by the Extractor
)

// Unit is one piece of text memory. Units of the conversation record
// (evicted messages, replies, summaries) are deleted only with their session
// or by DeleteMemory; categorized memories (Category set) also by the fact
// operations of the Extractor and, for episodes, by decay. IDs are stable and
// sort in creation order within a type: "msg-<seq>" (an evicted message),
// "sum-<seq>" (a summary ending at that message), "fact-<seq>-<n>",
// "ep-<seq>" (an episode ending at that message), "mem-<seq>" (added with
// AddMemory), "reply-<seq>" (a reply that arrived after the history had moved
// on).
type Unit struct {
	ID          string    `json:"id"`
	Type        UnitType  `json:"type"`
	Tier        Place     `json:"tier"`
	Role        string    `json:"role,omitempty"`
	Content     string    `json:"content"`
	Importance  float64   `json:"importance"`
	Tokens      int       `json:"tokens"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	LastAccess  time.Time `json:"last_access"`
	AccessCount int       `json:"access_count"`
	// FromSeq and ToSeq are the message sequence numbers the unit covers.
	FromSeq uint64 `json:"from_seq"`
	ToSeq   uint64 `json:"to_seq"`
	// At is when the message a message unit holds was sent (zero for
	// other units and for units written before it existed).
	At time.Time `json:"at,omitzero"`

	// Category is the decay class of a memory (see Category); empty for
	// the conversation record (evicted turns, replies, summaries), which
	// never decays.
	Category Category `json:"category,omitempty"`
	// TouchedAt is the last creation, update, boost or recall; an episode
	// untouched for EpisodeTTL is deleted.
	TouchedAt time.Time `json:"touched_at,omitzero"`
	// DecayedAt is where the next decay period starts: reset by a touch,
	// advanced by whole periods when decay applies.
	DecayedAt time.Time `json:"decayed_at,omitzero"`
	// LastBoost is the last BOOST; BoostDay starts the current 24 h boost
	// window and Boosted is what that window added so far.
	LastBoost time.Time `json:"last_boost,omitzero"`
	BoostDay  time.Time `json:"boost_day,omitzero"`
	Boosted   float64   `json:"boosted,omitempty"`
	// Review flags the memory for review: "promote" (importance reached
	// PromoteReviewAt), "decay" (fell to DecayReviewAt) or "expire" (a fact
	// below FactReviewBelow). The Extractor sees the flags.
	Review string `json:"review,omitempty"`
	// Merged describes a fact made by L4 compression from others (l4.go):
	// the facts it replaced, its fidelity figures and the keywords it
	// lost; nil for every other unit.
	Merged *MergeInfo `json:"merged,omitempty"`

	bow       *bow // cached bag of words for keyword recall
	persisted bool // its latest state is in the log
	indexed   bool // its latest text and metadata are in the session's index
}

func msgUnitID(seq uint64) string         { return fmt.Sprintf("msg-%012d", seq) }
func sumUnitID(seq uint64) string         { return fmt.Sprintf("sum-%012d", seq) }
func orphanUnitID(seq uint64) string      { return fmt.Sprintf("reply-%012d", seq) }
func factUnitID(seq uint64, i int) string { return fmt.Sprintf("fact-%012d-%02d", seq, i) }
func episodeUnitID(seq uint64) string     { return fmt.Sprintf("ep-%012d", seq) }
func memUnitID(seq uint64) string         { return fmt.Sprintf("mem-%012d", seq) }

// words returns the unit's cached bag of words (built on first use).
func (u *Unit) words() *bow {
	if u.bow == nil {
		u.bow = makeBow(u.Content)
	}
	return u.bow
}

// RecallHit is one unit chosen by a Recaller.
type RecallHit struct {
	ID    string
	Score float64
}

// Recaller ranks a session's memory units for a query (the newest user
// message). It is given the session's working-tier units other than
// summaries (bounded by Options.Decay.WorkingMaxUnits plus what was evicted since
// the last background sync); archive units are left to the RAG index. It is
// used only when the index is off (Options.Recall.IndexDisabled) or cannot be
// searched. Recall runs on the request path under the
// session's lock: it must be fast, must not retain or modify units, and
// should return at most k hits, best first. Hits below
// Options.Recall.MinScore are not shown.
type Recaller interface {
	Recall(ctx context.Context, query string, units []*Unit, k int) ([]RecallHit, error)
}

// KeywordRecaller scores units by bag-of-words cosine similarity with the
// query (the terms of index.Tokenize); archive units, if given,
// score 0.9×. It is the default Recaller.
type KeywordRecaller struct{}

// Recall implements Recaller.
func (KeywordRecaller) Recall(_ context.Context, query string, units []*Unit, k int) ([]RecallHit, error) {
	if k <= 0 || len(units) == 0 {
		return nil, nil
	}
	q := makeBow(query)
	if q.norm == 0 {
		return nil, nil
	}
	var hits []RecallHit
	for _, u := range units {
		s := cosine(q, u.words())
		if u.Tier == PlaceArchive {
			s *= 0.9
		}
		if s > 0 {
			hits = append(hits, RecallHit{u.ID, s})
		}
	}
	slices.SortFunc(hits, func(a, b RecallHit) int {
		if a.Score != b.Score {
			if a.Score > b.Score {
				return -1
			}
			return 1
		}
		if a.ID < b.ID {
			return -1
		}
		return 1
	})
	if len(hits) > k {
		hits = hits[:k]
	}
	return hits, nil
}

// SummaryRequest is what the Summarizer is asked to condense.
type SummaryRequest struct {
	Tenant    string
	SessionID string
	// Model is the model of the session's latest turn.
	Model string
	// Previous is the latest summary text, "" for the first.
	Previous string
	// Messages are the evicted messages to summarize, oldest first.
	Messages []Message
}

// Summary is what a Summarizer returns.
type Summary struct {
	// Text summarizes Messages (it may fold in Previous).
	Text string
	// Facts are optional standalone facts worth recalling later; each
	// becomes a fact unit.
	Facts []string
}

// Summarizer condenses evicted turns, typically by calling the upstream
// model. It is called from background goroutines the Store owns, never on
// the request path; ctx is cancelled on Close and after
// Options.Extraction.SummaryTimeout.
type Summarizer interface {
	Summarize(ctx context.Context, req SummaryRequest) (Summary, error)
}

// SummarizerFunc adapts a function to Summarizer.
type SummarizerFunc func(ctx context.Context, req SummaryRequest) (Summary, error)

// Summarize implements Summarizer.
func (f SummarizerFunc) Summarize(ctx context.Context, req SummaryRequest) (Summary, error) {
	return f(ctx, req)
}

// clone copies a unit for the log or a view, without its cache.
func (u *Unit) clone() Unit {
	c := *u
	c.bow = nil
	c.Merged = u.Merged.Clone()
	return c
}

var _ json.Marshaler = Message{}
