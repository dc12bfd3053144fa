package memory

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/userlist"
)

// enqueue asks the worker to sync the session. It never blocks: a session
// already queued is not queued twice, and when the queue is full the
// session stays dirty until its next Complete or Abort.
func (wk *worker) enqueue(sess *session) {
	if !sess.queued.CompareAndSwap(false, true) {
		return
	}
	select {
	case wk.queue <- sess:
	default:
		sess.queued.Store(false)
		wk.stats.queueFull.Add(1)
	}
}

// worker owns the background writes (this file): its goroutine drains a
// queue of sessions whose turns completed, writes what they left (units,
// deletions, access counts, marks), starts what is due (decay, tier
// changes, L4, summaries, extraction, reviews, tool context), brings the
// indexes up to date, fsyncs the users' session lists, and unloads idle
// entries when the registry holds too much; it also runs the summarizer
// goroutines. start and the WaitGroups let Shutdown stop and wait for
// them.
//
// Invariants: enqueue never blocks (a full queue leaves the session dirty
// until its next turn, counted); a session is in the queue at most once;
// at most Extraction.MaxConcurrentSummaries summaries run, one per
// session; on stop the queue is drained before the goroutine ends.
type worker struct {
	*env
	queue    chan *session
	stop     chan struct{} // closed by requestStop
	stopOnce sync.Once
	wg       sync.WaitGroup // the goroutine
	sumWG    sync.WaitGroup // summaries
	sumSem   chan struct{}

	reg    *registry
	jrn    *sessionJournal
	recall *retriever
	know   *learner
	lists  *userlist.Lists
	// holdUserFor holds the session's user memory (users.go).
	holdUserFor func(sess *session, requested string) *userMem
}

// start starts the worker's goroutine.
func (wk *worker) start() {
	wk.wg.Add(1)
	go wk.run()
}

// requestStop asks the goroutine to drain its queue and end (once).
func (wk *worker) requestStop() { wk.stopOnce.Do(func() { close(wk.stop) }) }

// wait waits for the goroutine and the summaries until ctx ends; it
// reports whether they ended.
func (wk *worker) wait(ctx context.Context) bool {
	return waitGroup(ctx, &wk.wg) && waitGroup(ctx, &wk.sumWG)
}

// trimBatch bounds the sessions and user indexes one trim unloads, so the
// worker goes back to its queue between batches.
const trimBatch = 64

// run is the worker's goroutine: it syncs dirty sessions and, for
// FsyncInterval, fsyncs logs periodically. It drains the queue on Close.
func (wk *worker) run() {
	defer wk.wg.Done()
	var tick <-chan time.Time
	if wk.opts.Fsync == FsyncInterval {
		t := time.NewTicker(wk.opts.FsyncInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case sess := <-wk.queue:
			sess.queued.Store(false)
			wk.sync(sess)
			wk.lists.Sync()
			wk.reg.noteSession(sess)
			if wk.reg.overBudget() {
				wk.reg.trim(trimBatch)
			}
		case <-wk.reg.trimC:
			if wk.reg.trim(trimBatch) == trimBatch {
				wk.reg.signalTrim() // more, after the queue's next session
			}
		case <-tick:
			wk.syncLogs()
		case <-wk.stop:
			for {
				select {
				case sess := <-wk.queue:
					sess.queued.Store(false)
					wk.sync(sess)
				default:
					return
				}
			}
		}
	}
}

// syncLogs fsyncs every dirty log (FsyncInterval).
func (wk *worker) syncLogs() {
	wk.reg.mu.Lock()
	logs := make([]*journal.Log, 0, len(wk.reg.sessions))
	for _, sess := range wk.reg.sessions {
		if sess.mu.TryLock() {
			if sess.log != nil {
				logs = append(logs, sess.log)
			}
			sess.mu.Unlock()
		}
	}
	wk.reg.mu.Unlock()
	for _, l := range logs {
		if err := l.Sync(); err != nil {
			wk.stats.writeErrors.Add(1)
			wk.opts.Logger.Warn("memory: interval fsync", "err", err)
		}
	}
}

// sync performs a session's background writes: decay, tier changes, new,
// changed and deleted units, access counts; starts a summary or an
// extraction if one is due; then brings the session's index up to date.
func (wk *worker) sync(sess *session) {
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
	now := wk.opts.Clock.Now()
	wk.know.maybeDecayLocked(sess, now)
	wk.demoteLocked(sess, now)
	for id := range sess.accessDirty {
		if u := sess.units[id]; u != nil {
			u.indexed = false // access count and recency changed
		}
	}
	wk.jrn.persistLocked(sess, now)
	wk.know.maybeCompressLocked(sess, now)
	wk.maybeSummarizeLocked(sess)
	wk.know.maybeExtractLocked(sess)
	wk.know.maybeReviewLocked(sess)
	wk.know.maybeToolCtxLocked(sess)
	sess.mu.Unlock()
	wk.recall.syncIndex(sess, false)
	wk.syncUser(sess)
}

// syncUser brings the session's documents in its user's index up to date
// and saves that index when due.
func (wk *worker) syncUser(sess *session) {
	if wk.opts.Recall.IndexDisabled {
		return
	}
	um := wk.holdUserFor(sess, "")
	defer wk.reg.releaseUser(um)
	wk.recall.syncUserDocs(sess, um)
	wk.recall.saveUser(um, false)
	if um.key != "" {
		wk.reg.noteUser(um)
	}
}

// demoteLocked moves working units to archive when they were not accessed
// for ArchiveAfter, and the least recently accessed ones beyond
// WorkingMaxUnits.
func (wk *worker) demoteLocked(sess *session, now time.Time) {
	var working []*Unit
	for _, u := range sess.units {
		if u.Tier != PlaceWorking {
			continue
		}
		last := u.LastAccess
		if u.CreatedAt.After(last) {
			last = u.CreatedAt
		}
		if now.Sub(last) >= wk.opts.Decay.ArchiveAfter {
			u.Tier, u.UpdatedAt, u.persisted = PlaceArchive, now, false
			sess.unitsChanged()
			continue
		}
		working = append(working, u)
	}
	if over := len(working) - wk.opts.Decay.WorkingMaxUnits; over > 0 {
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
func (wk *worker) maybeSummarizeLocked(sess *session) {
	if wk.opts.Window.Strategy != StrategySummary || wk.opts.Extraction.Summarizer == nil || sess.summarizing ||
		wk.ctx.Err() != nil || sess.turns == sess.summaryTurn {
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
	es = newestThatFit(es, wk.opts.Extraction.PromptBytes)
	from := es[0].seq
	msgs := make([]Message, len(es))
	for i, e := range es {
		msgs[i] = e.msg
	}
	select {
	case wk.sumSem <- struct{}{}:
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
	wk.stats.calls[callSummary].Add(1)
	wk.sumWG.Add(1)
	go wk.summarize(sess, req, from, to, sess.lastEnc)
}

func (wk *worker) summarize(sess *session, req SummaryRequest, from, to uint64, enc Encoding) {
	defer wk.sumWG.Done()
	defer func() { <-wk.sumSem }()
	ctx, cancel := context.WithTimeout(wk.ctx, wk.opts.Extraction.SummaryTimeout)
	sum, err := wk.opts.Extraction.Summarizer.Summarize(ctx, req)
	cancel()
	sess.mu.Lock()
	defer sess.mu.Unlock()
	sess.summarizing = false
	if sess.gone.Load() || !sess.exists {
		return
	}
	if err != nil || sum.Text == "" {
		wk.stats.summaryErrors.Add(1)
		wk.logBackground(err, "memory: summarize", "err", err, "empty", err == nil)
		return
	}
	now := wk.opts.Clock.Now()
	u := &Unit{ID: sumUnitID(to), Type: UnitSummary, Tier: PlaceWorking, Role: "system", Content: sum.Text,
		Tokens: wk.tok.Count(enc, sum.Text), CreatedAt: now, UpdatedAt: now, LastAccess: now, FromSeq: from, ToSeq: to, Importance: 1}
	sess.units[u.ID] = u
	sess.noteUnit(u)
	sess.unitsChanged()
	for i, f := range sum.Facts {
		if f == "" {
			continue
		}
		fu := &Unit{ID: factUnitID(to, i), Type: UnitFact, Tier: PlaceWorking, Role: "fact", Content: f,
			Tokens: wk.tok.Count(enc, f), CreatedAt: now, UpdatedAt: now, LastAccess: now, FromSeq: from, ToSeq: to, Importance: 0.8}
		sess.units[fu.ID] = fu
	}
	wk.stats.summaries.Add(1)
	wk.jrn.persistLocked(sess, now)
}
