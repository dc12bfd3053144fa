package memory

import (
	"errors"
	"sync/atomic"
)

type storeStats struct {
	prepares, appended, appendBytes     atomic.Int64
	summaries, summaryErrors, queueFull atomic.Int64
	writeErrors, completes, orphan      atomic.Int64
	repliesCut, undone                  atomic.Int64
	userMismatch, asSent                atomic.Int64

	fullRecalls, probeReuses, recallByWords  atomic.Int64
	indexRebuilds, indexErrors, indexSaves   atomic.Int64
	decayed, expired, boosts, boostsLimited  atomic.Int64
	extractJobs, extractDropped, extractErrs atomic.Int64
	factOps, factOpsRejected, episodes       atomic.Int64
	triples, triplesRejected                 atomic.Int64
	poolCtxTurns, poolCtxErrors              atomic.Int64
	logPushed, logPulled, logRebuilds        atomic.Int64
	logUploads, logConflicts                 atomic.Int64

	// modes counts prepared turns by mode taken (full, append) and by
	// whether it was detected (ModeAuto) or named by the client.
	modes [2][2]atomic.Int64
	// calls counts the sidecar's own model calls by kind (callFacts,
	// callEpisode, callSummary).
	calls [3]atomic.Int64
}

func (st *storeStats) countMode(m Mode, detected bool) {
	i, j := 0, 0
	if m == ModeAppend {
		i = 1
	}
	if detected {
		j = 1
	}
	st.modes[i][j].Add(1)
}

// Stats are cumulative counters for metrics.
type Stats struct {
	Sessions int // sessions loaded in memory
	// What loaded sessions and user indexes hold (resident.go): user
	// indexes loaded, the estimated bytes of both against MemoryBudget,
	// and how many of each were unloaded to stay within it (or within
	// MaxLoadedSessions).
	Users                           int
	ResidentBytes, MemoryBudget     int64
	SessionsUnloaded, UsersUnloaded int64
	Prepares                        int64 // Prepare calls that returned a window
	Appended                        int64 // messages appended to logs
	AppendBytes                     int64 // framed bytes appended on the request path
	Evicted                         int64 // messages that left the window
	Completes                       int64 // turns completed with a reply
	Orphans                         int64 // replies that arrived after the history moved on (kept as units)
	Summaries                       int64 // summaries made
	SummaryErrors                   int64
	QueueFull                       int64 // background syncs deferred because the queue was full
	Quarantined                     int64 // logs repaired or quarantined on open (damage skipped, torn tail cut)
	RecordsLost                     int64 // damaged log records skipped on open (every intact one is kept)
	RepliesCut                      int64 // replies recorded cut to Storage.MaxReplyBytes
	// Undone counts messages of failed turns taken out of the history
	// again (Turn.Fail); UserMismatch requests refused (ErrUserMismatch)
	// because they named another end user than the session's.
	Undone, UserMismatch int64
	// AsSent counts turns whose client messages alone did not fit the
	// limit, forwarded as sent (TurnStats.AsSent).
	AsSent int64

	// Disk and files (see StorageOptions). DiskBytes and SharedDiskBytes
	// are as of the last retention sweep.
	DiskBytes         int64 // bytes under Options.Dir
	SharedDiskBytes   int64 // bytes of Storage.Shared (the KV archive)
	MaxDiskBytes      int64 // Storage.MaxDiskBytes (0: no bound)
	SessionsExpired   int64 // sessions deleted by Storage.SessionTTL
	SessionsEvicted   int64 // sessions deleted to stay under MaxDiskBytes
	QuarantineRemoved int64 // quarantined files deleted (age or budget)
	SharedTrims       int64 // times the shared store was trimmed for the budget
	OpenFiles         int   // log files open now
	MaxOpenFiles      int   // Storage.MaxOpenFiles in effect
	FileReopens       int64 // idle logs reopened by a write
	WriteErrors       int64 // background writes that failed

	// Recall through the working memory: FullRecalls ran a full top-k
	// recall, ProbeReuses kept the recalled set because the light probe
	// found the same topic. FullRecallRate = FullRecalls / (FullRecalls +
	// ProbeReuses), 0 before any recall.
	FullRecalls    int64
	ProbeReuses    int64
	FullRecallRate float64
	IndexRebuilds  int64 // session indexes rebuilt from units (file missing or corrupt)
	IndexErrors    int64 // index updates, searches or saves that failed
	// RecallByWords counts searches of an index whose embedding failed
	// (a remote embedder down, slow or answering in a new space) and that
	// recalled by words instead: the session's Recaller, or nothing from
	// the user's other sessions. Also counted in IndexErrors.
	RecallByWords int64
	IndexSaves    int64 // index files written

	Decayed       int64 // decay periods applied to memories
	Expired       int64 // episodes deleted by decay
	Boosts        int64 // boosts applied
	BoostsLimited int64 // boosts refused by the cooldown or the daily cap

	ExtractJobs     int64 // extraction jobs run (facts and episodes)
	ExtractDropped  int64 // jobs dropped because the extraction queue was full
	ExtractErrors   int64 // Extractor calls that failed
	FactOps         int64 // fact operations applied
	FactOpsRejected int64 // fact operations or lines rejected (malformed, hostile, unknown id, limits)
	Triples         int64 // triples extracted (new ones; merged supports not counted)
	TriplesRejected int64 // triple lines rejected (malformed, hostile, unresolved support, limits)
	Episodes        int64 // episodic summaries made

	PoolWrites    int64 // pool puts and deletes written
	PoolConflicts int64 // pool writes refused with ErrConflict

	// The shared log of a fleet (Options.SharedLog): records written to
	// it, records taken from it (other replicas'), sessions rebuilt from
	// it, sessions uploaded to it, and writes that found it moved on.
	SharedLogPushed, SharedLogPulled, SharedLogRebuilds int64
	SharedLogUploads, SharedLogConflicts                int64

	// Turns by the mode taken: Full and Append, each split into those the
	// client named (X-Session-Mode) and those detected (ModeAuto).
	FullNamed, FullDetected, AppendNamed, AppendDetected int64

	// The sidecar's own model calls, by kind: fact extraction, episodic
	// summaries, window summaries (StrategySummary). Background calls per
	// client turn = their sum / Completes.
	FactCalls, EpisodeCalls, SummaryCalls int64

	ReviewStats      // the memory reviewer (review.go)
	ToolContextStats // tool-result context (toolctx.go)
	L4Stats          // L4 compression (l4.go)
	PoolEventStats   // the pool's events and context (package pool)
}

// Stats returns cumulative counters.
func (s *Store) Stats() Stats {
	s.reg.mu.Lock()
	n, users := len(s.reg.sessions), len(s.reg.users)
	s.reg.mu.Unlock()
	st := &s.stats
	out := Stats{
		Sessions: n, Users: users, ResidentBytes: s.reg.res.bytes.Load(), MemoryBudget: s.opts.MemoryBudget,
		SessionsUnloaded: s.reg.res.sessionsUnloaded.Load(), UsersUnloaded: s.reg.res.usersUnloaded.Load(),
		Prepares: st.prepares.Load(), Appended: st.appended.Load(),
		AppendBytes: st.appendBytes.Load(), Evicted: s.win.evicted.Load(), Completes: st.completes.Load(),
		Orphans: st.orphan.Load(), Summaries: st.summaries.Load(), SummaryErrors: st.summaryErrors.Load(),
		QueueFull: st.queueFull.Load(), Quarantined: s.j.Stats().Quarantined, WriteErrors: st.writeErrors.Load(),
		RecordsLost: s.j.Stats().RecordsLost, RepliesCut: st.repliesCut.Load(), Undone: st.undone.Load(), UserMismatch: st.userMismatch.Load(), AsSent: st.asSent.Load(),
		MaxDiskBytes: s.opts.Storage.MaxDiskBytes,
	}
	rst := s.sweeper.Stats()
	out.DiskBytes, out.SharedDiskBytes = rst.DiskBytes, rst.SharedDiskBytes
	out.SessionsExpired, out.SessionsEvicted = rst.SessionsExpired, rst.SessionsEvicted
	out.QuarantineRemoved, out.SharedTrims = rst.QuarantineRemoved, rst.SharedTrims
	fst := s.files.Stats()
	out.OpenFiles, out.MaxOpenFiles, out.FileReopens = fst.Open, fst.Max, fst.Reopens
	out.FullRecalls, out.ProbeReuses = st.fullRecalls.Load(), st.probeReuses.Load()
	if n := out.FullRecalls + out.ProbeReuses; n > 0 {
		out.FullRecallRate = float64(out.FullRecalls) / float64(n)
	}
	out.IndexRebuilds, out.IndexErrors, out.IndexSaves = st.indexRebuilds.Load(), st.indexErrors.Load(), st.indexSaves.Load()
	out.RecallByWords = st.recallByWords.Load()
	out.Decayed, out.Expired, out.Boosts, out.BoostsLimited = st.decayed.Load(), st.expired.Load(), st.boosts.Load(), st.boostsLimited.Load()
	out.ExtractJobs, out.ExtractDropped, out.ExtractErrors = st.extractJobs.Load(), st.extractDropped.Load(), st.extractErrs.Load()
	out.FactOps, out.FactOpsRejected, out.Episodes = st.factOps.Load(), st.factOpsRejected.Load(), st.episodes.Load()
	out.Triples, out.TriplesRejected = st.triples.Load(), st.triplesRejected.Load()
	ps := s.pools.Stats()
	out.PoolWrites, out.PoolConflicts = ps.Writes, ps.Conflicts
	out.SharedLogPushed, out.SharedLogPulled = st.logPushed.Load()+ps.SharedPushed, st.logPulled.Load()+ps.SharedPulled
	out.SharedLogRebuilds, out.SharedLogUploads = st.logRebuilds.Load()+ps.SharedRebuilds, st.logUploads.Load()+ps.SharedUploads
	out.SharedLogConflicts = st.logConflicts.Load() + ps.SharedConflicts
	out.FullNamed, out.FullDetected = st.modes[0][0].Load(), st.modes[0][1].Load()
	out.AppendNamed, out.AppendDetected = st.modes[1][0].Load(), st.modes[1][1].Load()
	out.FactCalls, out.EpisodeCalls, out.SummaryCalls = st.calls[callFacts].Load(), st.calls[callEpisode].Load(), st.calls[callSummary].Load()
	out.ReviewStats, out.ToolContextStats, out.L4Stats = s.know.rev.stats(), s.know.tcs.stats(s.win.toolShown.Load()), s.know.l4c.Stats()
	out.PoolEventStats = PoolEventStats{PoolSubscribers: ps.Subscribers, PoolEventsPublished: ps.EventsPublished,
		PoolSubscribersLagged: ps.SubscribersLagged, PoolSubscribeRefused: ps.SubscribeRefused,
		PoolContextTurns: st.poolCtxTurns.Load(), PoolContextErrors: st.poolCtxErrors.Load()}
	return out
}

// logBackground logs a failed background call: at debug level when it was
// deferred for clients (ErrDeferred, by design), else as a warning.
func (e *env) logBackground(err error, msg string, args ...any) {
	if errors.Is(err, ErrDeferred) {
		e.opts.Logger.Debug(msg, args...)
		return
	}
	e.opts.Logger.Warn(msg, args...)
}
