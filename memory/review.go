package memory

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// The memory reviewer. A fact whose importance reaches Reviewer.PromoteAt
// (boosts, an operator's edit) or falls below Reviewer.DemoteBelow (decay)
// is reviewed by the Extractor's model in the background: up to
// Reviewer.MaxRounds calls, each answering exactly one line (knowledge.ParseReview):
// [SEARCH:keywords] (the reviewer searches the scope's memory, lexically,
// and shows the hits in the next round), or a verdict — [PROMOTE] (the
// fact becomes core), [KEEP] (its importance is reset to DemoteBelow) or
// [DELETE] (deleted through deleteUnit, like every deletion). Anything
// else ends the review as "malformed", a search in the last round as
// "undecided", and a verdict about a fact that changed (or was deleted)
// since the review was queued as "stale": none of them changes anything.
//
// Reviews run as extraction jobs (the same queue, workers, timeout and
// Extractor; Close cancels and waits for them), never on the request path.
// The worker queues one after a session's sync when a fact crossed a
// threshold, at most one in flight per tenant and user; a fact is not
// reviewed twice in the same state (sessReview.seen). Every outcome is
// appended to the decisions log of the tenant and user,
// <tenant>/users/<hash>.rev: a store log (framed, checksummed records after
// a meta record naming the scope), compacted to the newest Reviewer.LogSize
// decisions when it holds twice as many. Reviews serves it.

// Review decisions (package memory/internal/knowledge names them).
const (
	ReviewPromote   = knowledge.ReviewPromote   // the fact became core
	ReviewKeep      = knowledge.ReviewKeep      // importance reset to Reviewer.DemoteBelow
	ReviewDelete    = knowledge.ReviewDelete    // the fact was deleted
	ReviewMalformed = knowledge.ReviewMalformed // the model's answer broke the format: nothing changed
	ReviewUndecided = knowledge.ReviewUndecided // no verdict within MaxRounds: nothing changed
	ReviewStale     = knowledge.ReviewStale     // the fact changed meanwhile: the verdict was not applied
	// ReviewSearch is the answer that asks for a search, not a verdict.
	ReviewSearch = knowledge.ReviewSearch
)

// ReviewStats count the reviewer's work (Stats embeds them).
type ReviewStats struct {
	Reviews          int64 // reviews finished
	ReviewCalls      int64 // model calls made by reviews (rounds)
	ReviewsPromoted  int64
	ReviewsKept      int64
	ReviewsDeleted   int64
	ReviewsMalformed int64 // answers that broke the format
	ReviewsUndecided int64 // reviews out of rounds
	ReviewsStale     int64 // verdicts not applied: the fact changed meanwhile
	ReviewErrors     int64 // Extractor calls that failed (nothing changed, not logged)
	ReviewsDropped   int64 // reviews not queued: the extraction queue was full
}

// reviewer is knowledge's reviewer state.
type reviewer struct {
	// mu protects the fields below.
	mu       sync.Mutex
	inflight map[string]bool // scopes (tenant "\x00" user) with a review queued or running
	closed   bool

	reviews, calls, errs, dropped atomic.Int64
	by                            [6]atomic.Int64 // by decision, in reviewDecisions order
}

var reviewDecisions = [...]string{ReviewPromote, ReviewKeep, ReviewDelete, ReviewMalformed, ReviewUndecided, ReviewStale}

func (r *reviewer) stats() ReviewStats {
	return ReviewStats{Reviews: r.reviews.Load(), ReviewCalls: r.calls.Load(), ReviewErrors: r.errs.Load(), ReviewsDropped: r.dropped.Load(),
		ReviewsPromoted: r.by[0].Load(), ReviewsKept: r.by[1].Load(), ReviewsDeleted: r.by[2].Load(),
		ReviewsMalformed: r.by[3].Load(), ReviewsUndecided: r.by[4].Load(), ReviewsStale: r.by[5].Load()}
}

// sessReview is a session's reviewer state.
type sessReview struct {
	// seen maps a fact id to its UpdatedAt when it was last queued: a fact
	// is reviewed again only once it changed.
	seen map[string]time.Time
	// fromLog is set once seen holds the facts the decisions log shows
	// reviewed since their last change (so a restart reviews none twice).
	fromLog bool
}

// seenFromLogLocked marks the session's facts that the scope's decisions
// log shows reviewed at or after their last change. Called once per loaded
// session, with sess.mu held, from the worker.
func (kn *learner) seenFromLogLocked(sess *session) {
	sess.rv.fromLog = true
	// A log that cannot be read: facts past a threshold are reviewed again.
	_ = kn.revLogs.Each(sess.tenant, sess.user, func(r *Review) {
		u := sess.units[r.FactID]
		if r.Session != sess.id || u == nil || r.At.Before(u.UpdatedAt) {
			return
		}
		if sess.rv.seen == nil {
			sess.rv.seen = map[string]time.Time{}
		}
		sess.rv.seen[u.ID] = u.UpdatedAt
	})
}

// reviewTask is the fact a review is about, as it was when queued.
type reviewTask struct {
	id, trigger string
	content     string
	category    Category
	importance  float64
	updated     time.Time
	created     time.Time
}

func reviewScope(tenant, user string) string { return tenant + "\x00" + user }

// reviewTrigger reports why u is due for review ("" if it is not).
func (kn *learner) reviewTrigger(u *Unit) string {
	o := &kn.opts.Reviewer
	switch {
	case u.Category != CategoryFact:
	case u.Importance >= o.PromoteAt:
		return "promote"
	case u.Importance < o.DemoteBelow:
		return "demote"
	}
	return ""
}

// dueLocked returns the session's fact with the lowest id that is past a
// threshold and not yet reviewed in its current state (nil if none): one
// pass, no sort.
func (kn *learner) dueLocked(sess *session) *Unit {
	var due *Unit
	for _, u := range sess.units {
		if (due != nil && u.ID > due.ID) || kn.reviewTrigger(u) == "" {
			continue
		}
		if at, ok := sess.rv.seen[u.ID]; ok && at.Equal(u.UpdatedAt) {
			continue
		}
		due = u
	}
	return due
}

// maybeReviewLocked queues a review of the session's first fact (by id)
// past a threshold and not yet reviewed in its current state, unless the scope has one in flight. Called with
// sess.mu held, from the worker.
func (kn *learner) maybeReviewLocked(sess *session) {
	if !kn.opts.Reviewer.Enabled || kn.opts.Extraction.Extractor == nil || kn.ctx.Err() != nil {
		return
	}
	if len(sess.rv.seen) > 2*len(sess.units)+64 {
		for id := range sess.rv.seen {
			if sess.units[id] == nil {
				delete(sess.rv.seen, id) // deleted since
			}
		}
	}
	due := kn.dueLocked(sess)
	if due != nil && !sess.rv.fromLog {
		// Only a session with a fact due reads the decisions log, once.
		kn.seenFromLogLocked(sess)
		due = kn.dueLocked(sess)
	}
	if due == nil {
		return
	}
	task := &reviewTask{id: due.ID, trigger: kn.reviewTrigger(due), content: due.Content, category: due.Category,
		importance: due.Importance, updated: due.UpdatedAt, created: due.CreatedAt}
	scope := reviewScope(sess.tenant, sess.user)
	r := &kn.rev
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight[scope] || r.closed {
		return
	}
	if !kn.q.TryPut(&extractJob{sess: sess, kind: jobReview, review: task, model: sess.lastModel, enc: sess.lastEnc}) {
		r.dropped.Add(1) // the next sync tries again
		return
	}
	sess.refs.Add(1) // resident until the job ran (runExtract)
	if r.inflight == nil {
		r.inflight = map[string]bool{}
	}
	r.inflight[scope] = true
	if sess.rv.seen == nil {
		sess.rv.seen = map[string]time.Time{}
	}
	sess.rv.seen[task.id] = task.updated
}

// runReview runs one review to its outcome and logs it.
func (kn *learner) runReview(job *extractJob) {
	sess, task := job.sess, job.review
	scope := reviewScope(sess.tenant, sess.user)
	defer func() {
		kn.rev.mu.Lock()
		delete(kn.rev.inflight, scope)
		kn.rev.mu.Unlock()
		kn.wk.enqueue(sess) // the next fact due, if any
	}()
	rev := Review{FactID: task.id, Session: sess.id, Trigger: task.trigger}
	var searches strings.Builder
	var step knowledge.ReviewStep
	for round := 1; ; round++ {
		rev.Rounds = round
		kn.rev.calls.Add(1)
		ctx, cancel := context.WithTimeout(kn.ctx, kn.opts.Extraction.Timeout)
		out, err := kn.opts.Extraction.Extractor.Extract(ctx, ExtractRequest{Tenant: sess.tenant, SessionID: sess.id, Model: job.model,
			Kind: jobReview.String(), Prompt: kn.reviewPrompt(task, round, searches.String())})
		cancel()
		if err != nil {
			kn.rev.errs.Add(1)
			kn.logBackground(err, "memory: review", "session", sess.id, "fact", task.id, "err", err)
			return // nothing decided; the fact is reviewed again once it changes
		}
		if step, err = knowledge.ParseReview(out); err != nil {
			rev.Decision, rev.Reason = ReviewMalformed, err.Error()
			break
		}
		if step.Kind != ReviewSearch {
			break
		}
		if round >= kn.opts.Reviewer.MaxRounds {
			rev.Decision, rev.Reason = ReviewUndecided, fmt.Sprintf("still searching after %d rounds", round)
			break
		}
		fmt.Fprintf(&searches, "[SEARCH:%s] found:\n%s", step.Keywords, kn.reviewSearch(sess, task.id, step.Keywords))
	}
	if rev.Decision == "" {
		rev.Decision, rev.Reason = kn.applyReview(sess, task, step)
	}
	kn.logReview(sess, rev)
}

// reviewSearch searches the session's and its user's memory for keywords
// (lexically: the keywords are words, and no embedding call is made).
func (kn *learner) reviewSearch(sess *session, self, keywords string) string {
	um := kn.users.userFor(sess, "")
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.gone.Load() || !sess.exists {
		return "(nothing)\n"
	}
	items := kn.recall.searchAll(kn.ctx, sess, um, recallQuery{text: keywords, focus: keywords}, kn.opts.Reviewer.SearchK, index.ModeBM25, map[string]bool{self: true})
	var b strings.Builder
	for _, it := range items {
		role := it.role
		if role == "" {
			role = "memory"
		}
		fmt.Fprintf(&b, "- %s: %s\n", role, sanitize.Text(it.text, knowledge.MaxReviewShownBytes))
	}
	if b.Len() == 0 {
		return "(nothing)\n"
	}
	return b.String()
}

// applyReview applies a verdict unless the fact changed since the review
// was queued; it returns the decision and its reason.
func (kn *learner) applyReview(sess *session, task *reviewTask, step knowledge.ReviewStep) (string, string) {
	sess.mu.Lock()
	u := sess.units[task.id]
	if sess.gone.Load() || !sess.exists || u == nil || !u.UpdatedAt.Equal(task.updated) || u.Content != task.content || u.Category != task.category {
		sess.mu.Unlock()
		return ReviewStale, fmt.Sprintf("%s not applied: the fact changed or was deleted since the review was queued", step.Kind)
	}
	now := kn.opts.Clock.Now()
	switch step.Kind {
	case ReviewPromote:
		c := CategoryCore
		sess.edit(kn.tok, u, MemoryEdit{Category: &c}, "", now)
	case ReviewKeep:
		imp := kn.opts.Reviewer.DemoteBelow
		sess.edit(kn.tok, u, MemoryEdit{Importance: &imp}, "", now)
	case ReviewDelete:
		sess.deleteUnit(task.id)
	}
	kn.jrn.persistLocked(sess, now)
	sess.mu.Unlock()
	return step.Kind, step.Reason
}

// reviewPrompt is the prompt of one round.
func (kn *learner) reviewPrompt(task *reviewTask, round int, searches string) string {
	return knowledge.ReviewPrompt(knowledge.ReviewFact{ID: task.id, Content: task.content, Importance: task.importance,
		Created: task.created.UTC().Format(blockTimeLayout), Promote: task.trigger == "promote"},
		round, kn.opts.Reviewer.MaxRounds, searches)
}
