package memory

import (
	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
	"github.com/kvsidecar/kvsidecar/memory/internal/reviewlog"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// Review is one outcome of the memory reviewer, as its decisions log
// (package memory/internal/reviewlog) keeps it. Only promote, keep and
// delete changed the fact.
type Review = reviewlog.Review

// logReview counts a review's outcome and appends it to its scope's log.
func (kn *learner) logReview(sess *session, rev Review) {
	rev.At = kn.opts.Clock.Now().UTC().Round(0) // as the log reads it back
	rev.Reason = sanitize.Text(rev.Reason, knowledge.MaxReviewReason)
	kn.rev.reviews.Add(1)
	for i, d := range reviewDecisions {
		if d == rev.Decision {
			kn.rev.by[i].Add(1)
		}
	}
	kn.opts.Logger.Info("memory: review", "session", sess.id, "fact", rev.FactID, "decision", rev.Decision, "rounds", rev.Rounds, "reason", rev.Reason)
	if err := kn.revLogs.Append(sess.tenant, sess.user, rev); err != nil {
		kn.stats.writeErrors.Add(1)
		kn.opts.Logger.Warn("memory: write review decision", "session", sess.id, "err", err)
	}
}

// Reviews returns the memory reviewer's decisions about the facts of a
// tenant's user ("" is the tenant's default user), newest first, at most
// limit (limit ≤ 0: Reviewer.LogSize). The result is a copy. A scope
// without decisions has none (no error); a closed store is ErrClosed. It
// reads this machine's log: in a fleet, each replica reviews the sessions
// it serves.
func (s *Store) Reviews(tenant, user string, limit int) ([]Review, error) {
	return s.know.revLogs.List(tenant, user, limit)
}

// closeReviewLogs stops new reviews and closes every decisions log
// (Shutdown, after the extraction workers stopped).
func (kn *learner) closeReviewLogs() error {
	kn.rev.mu.Lock()
	kn.rev.closed = true
	kn.rev.mu.Unlock()
	return kn.revLogs.Close()
}
