package memory

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"

	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// reviewLog is one tenant and user's decisions log.
type reviewLog struct {
	tenant, user, path string
	journal.Lazy

	// mu protects the fields below.
	mu      sync.Mutex
	log     *journal.Log // nil until the first decision is written
	entries []Review     // oldest first, at most Reviewer.LogSize
	records int          // decision records in the file
	closed  bool
}

type reviewRecord struct {
	K      string  `json:"k"` // "meta" or "review"
	V      int     `json:"v,omitempty"`
	Tenant string  `json:"tenant,omitempty"`
	User   string  `json:"user,omitempty"`
	Review *Review `json:"review,omitempty"`
}

func reviewLogPath(root, tenant, user string) string {
	h := sha256.Sum256([]byte("review\x00" + tenant + "\x00" + user))
	return filepath.Join(tenantDir(root, tenant), "users", hex.EncodeToString(h[:16])+".rev")
}

// reviewLogFor returns the scope's loaded log.
func (s *Store) reviewLogFor(tenant, user string) (*reviewLog, error) {
	r := &s.rev
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return journal.LoadedIn(&r.mu, &r.logs, reviewScope(tenant, user), func() *reviewLog {
		return &reviewLog{tenant: tenant, user: user, path: reviewLogPath(s.opts.Dir, tenant, user)}
	}, s.loadReviewLog)
}

func (s *Store) loadReviewLog(l *reviewLog) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	first, foreign, rejected := true, false, 0
	lf, rep, err := s.j.Open(l.path, func(b []byte) {
		isFirst := first
		first = false
		var r reviewRecord
		if foreign || json.Unmarshal(b, &r) != nil {
			rejected++
			return
		}
		switch {
		case r.K == "meta":
			foreign = isFirst && (r.Tenant != l.tenant || r.User != l.user)
		case r.K == "review" && r.Review != nil:
			l.add(*r.Review, s.opts.Reviewer.LogSize)
			l.records++
		default:
			rejected++
		}
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if use, err := s.j.Settle(lf, rep, rejected, foreign, l.path, "review"); !use {
		l.entries, l.records = nil, 0
		return err
	}
	l.log = lf
	return nil
}

// add appends a decision, keeping the newest max.
func (l *reviewLog) add(r Review, max int) {
	l.entries = append(l.entries, r)
	if over := len(l.entries) - max; over > 0 {
		l.entries = append(l.entries[:0], l.entries[over:]...)
	}
}

// logReview counts a review's outcome and appends it to its scope's log.
func (s *Store) logReview(sess *session, rev Review) {
	rev.At = s.opts.Clock.Now().UTC().Round(0) // as the log reads it back
	rev.Reason = sanitize.Text(rev.Reason, maxReviewReason)
	s.rev.reviews.Add(1)
	for i, d := range reviewDecisions {
		if d == rev.Decision {
			s.rev.by[i].Add(1)
		}
	}
	s.opts.Logger.Info("memory: review", "session", sess.id, "fact", rev.FactID, "decision", rev.Decision, "rounds", rev.Rounds, "reason", rev.Reason)
	l, err := s.reviewLogFor(sess.tenant, sess.user)
	if err == nil {
		err = s.writeReview(l, rev)
	}
	if err != nil {
		s.stats.writeErrors.Add(1)
		s.opts.Logger.Warn("memory: write review decision", "session", sess.id, "err", err)
	}
}

func (s *Store) writeReview(l *reviewLog, rev Review) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	b, err := json.Marshal(&reviewRecord{K: "review", Review: &rev})
	if err != nil {
		return fmt.Errorf("memory: encode review: %w", err)
	}
	if l.log == nil {
		meta, err := json.Marshal(&reviewRecord{K: "meta", V: 1, Tenant: l.tenant, User: l.user})
		if err != nil {
			return err
		}
		if l.log, err = s.j.Create(l.path, appendRecord(nil, meta)); err != nil {
			return err
		}
	}
	if err := l.log.Append(appendRecord(nil, b)); err != nil {
		return err
	}
	l.add(rev, s.opts.Reviewer.LogSize)
	l.records++
	if l.records > 2*s.opts.Reviewer.LogSize {
		return s.compactReviewLogLocked(l)
	}
	return nil
}

// compactReviewLogLocked rewrites the log with the decisions kept,
// atomically; on error the old log stays in use.
func (s *Store) compactReviewLogLocked(l *reviewLog) error {
	meta, err := json.Marshal(&reviewRecord{K: "meta", V: 1, Tenant: l.tenant, User: l.user})
	if err != nil {
		return err
	}
	image := journal.Image(meta)
	for i := range l.entries {
		b, err := json.Marshal(&reviewRecord{K: "review", Review: &l.entries[i]})
		if err != nil {
			return err
		}
		image = appendRecord(image, b)
	}
	nl, err := s.j.Rewrite(l.log, l.path, image)
	l.log = nl
	if err != nil {
		return err
	}
	l.records = len(l.entries)
	return nil
}

// Reviews returns the memory reviewer's decisions about the facts of a
// tenant's user ("" is the tenant's default user), newest first, at most
// limit (limit ≤ 0: Reviewer.LogSize). The result is a copy. A scope
// without decisions has none (no error); a closed store is ErrClosed. It
// reads this machine's log: in a fleet, each replica reviews the sessions
// it serves.
func (s *Store) Reviews(tenant, user string, limit int) ([]Review, error) {
	if limit <= 0 {
		limit = s.opts.Reviewer.LogSize
	}
	l, err := s.reviewLogFor(tenant, user)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Review, 0, min(limit, len(l.entries)))
	for i := len(l.entries) - 1; i >= 0 && len(out) < limit; i-- {
		out = append(out, l.entries[i])
	}
	return out, nil
}

// closeReviewLogs closes every decisions log (Shutdown, after the
// extraction workers stopped).
func (s *Store) closeReviewLogs() error {
	s.rev.mu.Lock()
	s.rev.closed = true
	logs := make([]*reviewLog, 0, len(s.rev.logs))
	for _, l := range s.rev.logs {
		logs = append(logs, l)
	}
	s.rev.mu.Unlock()
	var errs []error
	for _, l := range logs {
		l.mu.Lock()
		l.closed = true
		if l.log != nil {
			errs = append(errs, l.log.Close())
			l.log = nil
		}
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}
