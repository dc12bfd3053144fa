package memory

import (
	"context"
	"slices"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

// enqueue asks the worker to sync the session. It never blocks: a session
// already queued is not queued twice, and when the queue is full the
// session stays dirty until its next Complete or Abort.
func (s *Store) enqueue(sess *session) {
	if !sess.queued.CompareAndSwap(false, true) {
		return
	}
	select {
	case s.queue <- sess:
	default:
		sess.queued.Store(false)
		s.stats.queueFull.Add(1)
	}
}

// trimBatch bounds the sessions and user indexes one trim unloads, so the
// worker goes back to its queue between batches.
const trimBatch = 64

// worker is the goroutine the Store owns: it syncs dirty sessions and, for
// FsyncInterval, fsyncs logs periodically. It drains the queue on Close.
func (s *Store) worker() {
	defer s.workerWG.Done()
	var tick <-chan time.Time
	if s.opts.Fsync == FsyncInterval {
		t := time.NewTicker(s.opts.FsyncInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case sess := <-s.queue:
			sess.queued.Store(false)
			s.sync(sess)
			s.lists.Sync()
			s.reg.noteSession(sess)
			if s.reg.overBudget() {
				s.reg.trim(trimBatch)
			}
		case <-s.reg.trimC:
			if s.reg.trim(trimBatch) == trimBatch {
				s.reg.signalTrim() // more, after the queue's next session
			}
		case <-tick:
			s.syncLogs()
		case <-s.stop:
			for {
				select {
				case sess := <-s.queue:
					sess.queued.Store(false)
					s.sync(sess)
				default:
					return
				}
			}
		}
	}
}

// syncLogs fsyncs every dirty log (FsyncInterval).
func (s *Store) syncLogs() {
	s.reg.mu.Lock()
	logs := make([]*journal.Log, 0, len(s.reg.sessions))
	for _, sess := range s.reg.sessions {
		if sess.mu.TryLock() {
			if sess.log != nil {
				logs = append(logs, sess.log)
			}
			sess.mu.Unlock()
		}
	}
	s.reg.mu.Unlock()
	for _, l := range logs {
		if err := l.Sync(); err != nil {
			s.stats.writeErrors.Add(1)
			s.opts.Logger.Warn("memory: interval fsync", "err", err)
		}
	}
}

// sync performs a session's background writes: decay, tier changes, new,
// changed and deleted units, access counts; starts a summary or an
// extraction if one is due; then brings the session's index up to date.
func (s *Store) sync(sess *session) {
	sess.mu.Lock()
	if sess.gone.Load() || !sess.exists {
		sess.mu.Unlock()
		return
	}
	sess.syncing = true // not unloaded meanwhile (resident.go)
	defer func() {
		sess.mu.Lock()
		sess.syncing = false
		sess.mu.Unlock()
	}()
	now := s.opts.Clock.Now()
	s.know.maybeDecayLocked(sess, now)
	s.demoteLocked(sess, now)
	for id := range sess.accessDirty {
		if u := sess.units[id]; u != nil {
			u.indexed = false // access count and recency changed
		}
	}
	s.jrn.persistLocked(sess, now)
	s.know.maybeCompressLocked(sess, now)
	s.maybeSummarizeLocked(sess)
	s.know.maybeExtractLocked(sess)
	s.know.maybeReviewLocked(sess)
	s.know.maybeToolCtxLocked(sess)
	sess.mu.Unlock()
	s.recall.syncIndex(sess, false)
	s.syncUser(sess)
}

// syncUser brings the session's documents in its user's index up to date
// and saves that index when due.
func (s *Store) syncUser(sess *session) {
	if s.opts.Recall.IndexDisabled {
		return
	}
	um := s.holdUserFor(sess, "")
	defer s.reg.releaseUser(um)
	s.recall.syncUserDocs(sess, um)
	s.recall.saveUser(um, false)
	if um.key != "" {
		s.reg.noteUser(um)
	}
}

// demoteLocked moves working units to archive when they were not accessed
// for ArchiveAfter, and the least recently accessed ones beyond
// WorkingMaxUnits.
func (s *Store) demoteLocked(sess *session, now time.Time) {
	var working []*Unit
	for _, u := range sess.units {
		if u.Tier != PlaceWorking {
			continue
		}
		last := u.LastAccess
		if u.CreatedAt.After(last) {
			last = u.CreatedAt
		}
		if now.Sub(last) >= s.opts.Decay.ArchiveAfter {
			u.Tier, u.UpdatedAt, u.persisted = PlaceArchive, now, false
			sess.unitsChanged()
			continue
		}
		working = append(working, u)
	}
	if over := len(working) - s.opts.Decay.WorkingMaxUnits; over > 0 {
		slices.SortFunc(working, func(a, b *Unit) int {
			if c := a.LastAccess.Compare(b.LastAccess); c != 0 {
				return c
			}
			if a.ID < b.ID {
				return -1
			}
			return 1
		})
		for _, u := range working[:over] {
			u.Tier, u.UpdatedAt, u.persisted = PlaceArchive, now, false
		}
		sess.unitsChanged()
	}
}

// maybeSummarizeLocked starts a summary of evicted messages not yet
// covered, when the strategy is StrategySummary and a Summarizer is set.
func (s *Store) maybeSummarizeLocked(sess *session) {
	if s.opts.Window.Strategy != StrategySummary || s.opts.Extraction.Summarizer == nil || sess.summarizing ||
		s.ctx.Err() != nil || sess.turns == sess.summaryTurn {
		return
	}
	var es []*entry
	for _, e := range sess.hist {
		if e.dropped && e.seq > sess.coveredSeq {
			es = append(es, e)
		}
	}
	if len(es) == 0 {
		return
	}
	// One summary covers everything that waited; its prompt carries the
	// newest messages that fit.
	to := es[len(es)-1].seq
	es = newestThatFit(es, s.opts.Extraction.PromptBytes)
	from := es[0].seq
	msgs := make([]Message, len(es))
	for i, e := range es {
		msgs[i] = e.msg
	}
	select {
	case s.sumSem <- struct{}{}:
	default:
		return // busy: the session's next sync retries
	}
	prev := ""
	sess.refreshIndex()
	if n := len(sess.sums); n > 0 {
		prev = sess.sums[n-1].Content
	}
	req := SummaryRequest{Tenant: sess.tenant, SessionID: sess.id, Model: sess.lastModel, Previous: prev, Messages: msgs}
	sess.summarizing = true
	sess.summaryTurn = sess.turns
	s.stats.calls[callSummary].Add(1)
	s.sumWG.Add(1)
	go s.summarize(sess, req, from, to, sess.lastEnc)
}

func (s *Store) summarize(sess *session, req SummaryRequest, from, to uint64, enc Encoding) {
	defer s.sumWG.Done()
	defer func() { <-s.sumSem }()
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.Extraction.SummaryTimeout)
	sum, err := s.opts.Extraction.Summarizer.Summarize(ctx, req)
	cancel()
	sess.mu.Lock()
	defer sess.mu.Unlock()
	sess.summarizing = false
	if sess.gone.Load() || !sess.exists {
		return
	}
	if err != nil || sum.Text == "" {
		s.stats.summaryErrors.Add(1)
		s.logBackground(err, "memory: summarize", "err", err, "empty", err == nil)
		return
	}
	now := s.opts.Clock.Now()
	u := &Unit{ID: sumUnitID(to), Type: UnitSummary, Tier: PlaceWorking, Role: "system", Content: sum.Text,
		Tokens: s.tok.Count(enc, sum.Text), CreatedAt: now, UpdatedAt: now, LastAccess: now, FromSeq: from, ToSeq: to, Importance: 1}
	sess.units[u.ID] = u
	sess.noteUnit(u)
	sess.unitsChanged()
	for i, f := range sum.Facts {
		if f == "" {
			continue
		}
		fu := &Unit{ID: factUnitID(to, i), Type: UnitFact, Tier: PlaceWorking, Role: "fact", Content: f,
			Tokens: s.tok.Count(enc, f), CreatedAt: now, UpdatedAt: now, LastAccess: now, FromSeq: from, ToSeq: to, Importance: 0.8}
		sess.units[fu.ID] = fu
	}
	s.stats.summaries.Add(1)
	s.jrn.persistLocked(sess, now)
}
