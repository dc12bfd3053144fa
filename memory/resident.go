package memory

import (
	"container/list"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

// What the Store keeps in memory (issue 22). Sessions and user indexes
// load on first use and stay resident while they are used; an idle one
// leaves RAM once the Store holds more than Options.MemoryBudget estimated
// bytes or more than Options.MaxLoadedSessions of its kind, least recently
// used first. Its state is on disk (the log; the index files, saved before
// it leaves), so its next turn loads it again: a returning session costs
// one read of its log and of its index files, whatever the number of
// sessions held.
//
// Both kinds are kept in least-recently-used lists under s.mu: a lookup
// moves its entry to the front (O(1)), and unloading walks from the back,
// so no work per turn depends on how many sessions are held. Sizes are
// estimates (resident bytes of messages, memory units and index documents,
// see sessionBytesLocked and userBytes), refreshed by the worker after each
// sync; their sum is compared with the budget.
//
// Who unloads: the request path only enforces the counts, without I/O
// (sessionLookup, userMem: an idle entry whose files are saved is dropped
// at once, with TryLock, never waiting). The byte budget is the worker's
// (trim): it saves a dirty index first, then drops the entry if it is
// still idle. Never unloaded: a session with a turn in flight, background
// work queued or running, unwritten units, or its lock held; a user index
// being loaded or not yet saved. A session unloaded keeps everything it
// wrote (history, units, triples, decay and extraction marks: the log);
// what lives only in memory starts afresh on reload, as after a restart:
// working memory's active set (recall gating), the cached stable block
// (rebuilt from the same units), a condensed tool context not yet shown.

// residentSet orders the loaded sessions and user indexes by last use.
type residentSet struct {
	// sessions and users are protected by s.mu; front is the most
	// recently used.
	sessions list.List // of *session
	users    list.List // of *userMem

	bytes                           atomic.Int64 // sum of the entries' estimates
	sessionsUnloaded, usersUnloaded atomic.Int64
}

// Size estimates (bytes). They price what a loaded entry keeps beyond its
// texts, measured on heap profiles of `sidecar bench scale`: a session's
// struct, maps, log handle and working memory; a message (entry, parsed
// Message, token counts, scoring features); a memory unit; an index
// document (BM25 terms and postings, graph links, id) besides its vector.
const (
	sessionBaseBytes = 3 << 10
	userBaseBytes    = 2 << 10
	entryBytes       = 512
	unitBytes        = 384
	docBytes         = 1 << 10
)

// docSize is the estimated resident size of one index document.
func (s *Store) docSize() int64 {
	dim := 0
	if e := s.recall.ixOpts.Embedder; e != nil {
		dim = e.Dim()
	}
	if dim <= 0 {
		dim = 512 // the offline embedder's default
	}
	return docBytes + int64(dim)*4
}

// sessionBytesLocked estimates what sess holds in memory. Called with
// sess.mu held.
func (s *Store) sessionBytesLocked(sess *session) int64 {
	n := int64(sessionBaseBytes)
	for _, es := range [][]*entry{sess.sys, sess.hist} {
		for _, e := range es {
			n += entryBytes + int64(len(e.msg.Raw)+len(e.msg.Content)+len(e.msg.toolText))
		}
	}
	for _, u := range sess.units {
		n += unitBytes + int64(len(u.Content))
	}
	if sess.ix != nil {
		n += int64(sess.ix.Len()) * s.docSize()
	}
	n += int64(len(sess.uidx)) * 64
	return n
}

// userBytes estimates what a user index holds in memory.
func (s *Store) userBytes(um *userMem) int64 {
	n := int64(userBaseBytes)
	if x := um.index(); x != nil {
		n += int64(x.Len()) * (s.docSize() + 256) // the texts: a message and its context
	}
	um.mu.Lock()
	n += int64(um.nLinks)*256 + int64(len(um.docs))*64 + int64(len(um.listed))*48
	um.mu.Unlock()
	return n
}

// setSize records an entry's new estimate in the total.
func (s *Store) setSize(size *atomic.Int64, n int64) {
	s.res.bytes.Add(n - size.Swap(n))
}

// noteSession refreshes the session's estimate (worker).
func (s *Store) noteSession(sess *session) {
	sess.mu.Lock()
	n := int64(0)
	if !sess.gone.Load() {
		n = s.sessionBytesLocked(sess)
	}
	sess.mu.Unlock()
	s.mu.Lock()
	if sess.lru != nil { // still resident
		s.setSize(&sess.size, n)
	}
	s.mu.Unlock()
}

// noteUser refreshes the user index's estimate.
func (s *Store) noteUser(um *userMem) {
	n := s.userBytes(um)
	s.mu.Lock()
	if um.lru != nil {
		s.setSize(&um.size, n)
	}
	s.mu.Unlock()
}

// overBudget reports whether the store holds more than it may.
func (s *Store) overBudget() bool {
	if b := s.opts.MemoryBudget; b > 0 && s.res.bytes.Load() > b {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res.sessions.Len() > s.opts.MaxLoadedSessions || s.res.users.Len() > s.opts.MaxLoadedSessions
}

// signalTrim asks the worker to trim, without waiting.
func (s *Store) signalTrim() {
	select {
	case s.trimC <- struct{}{}:
	default:
	}
}

// addSessionLocked makes sess resident (front of the list). Called with
// s.mu held.
func (s *Store) addSessionLocked(sess *session) {
	sess.lru = s.res.sessions.PushFront(sess)
	s.sessions[sess.key] = sess
	s.sessGen++
}

// dropSessionLocked takes sess out of memory's lists and map (when it is
// still there) and marks it gone. Called with s.mu held.
func (s *Store) dropSessionLocked(sess *session) {
	sess.gone.Store(true)
	if s.sessions[sess.key] == sess {
		delete(s.sessions, sess.key)
	}
	if sess.lru != nil {
		s.res.sessions.Remove(sess.lru)
		sess.lru = nil
		s.res.bytes.Add(-sess.size.Swap(0))
	}
}

// dropUserLocked takes um out of the map and list. Called with s.mu held.
func (s *Store) dropUserLocked(um *userMem) {
	if s.users[um.key] == um {
		delete(s.users, um.key)
	}
	if um.lru != nil {
		s.res.users.Remove(um.lru)
		um.lru = nil
		s.res.bytes.Add(-um.size.Swap(0))
	}
}

// idleLocked reports whether the session can leave memory now: no turn in
// flight, no background work queued or running, nothing unwritten, its
// index saved (unless saved is false). Called with sess.mu held.
func (s *Store) idleLocked(sess *session, saved bool) bool {
	if sess.refs.Load() > 0 || sess.pending != nil || sess.summarizing || sess.queued.Load() || sess.syncing || sess.hasUnpersisted() {
		return false
	}
	return !saved || sess.ix == nil || sess.ixVer == sess.ixSaved
}

// shrinkSessionsLocked enforces MaxLoadedSessions on the request path:
// idle sessions whose index is saved leave from the back of the list,
// down to 7/8 of the bound, without waiting for any lock (a busy one is
// skipped; the worker's trim finishes the job). Called with s.mu held; the
// caller closes the logs it returns once it let go of s.mu.
func (s *Store) shrinkSessionsLocked(keep *session) []*journal.Log {
	over := s.res.sessions.Len() - s.opts.MaxLoadedSessions
	if over <= 0 {
		return nil
	}
	over += s.opts.MaxLoadedSessions / 8
	var logs []*journal.Log
	tries := 0
	for e := s.res.sessions.Back(); e != nil && over > 0 && tries < 4*over+64; tries++ {
		prev := e.Prev()
		sess := e.Value.(*session)
		if sess != keep && sess.mu.TryLock() {
			if s.idleLocked(sess, true) {
				if sess.log != nil {
					logs = append(logs, sess.log)
					sess.log = nil
				}
				s.dropSessionLocked(sess)
				s.res.sessionsUnloaded.Add(1)
				over--
			}
			sess.mu.Unlock()
		}
		e = prev
	}
	if over > 0 {
		s.signalTrim()
	}
	return logs
}

// closeLogs closes the logs of sessions that left memory.
func (s *Store) closeLogs(logs []*journal.Log) {
	for _, l := range logs {
		if err := l.Close(); err != nil {
			s.opts.Logger.Warn("memory: close idle session log", "err", err)
		}
	}
}

// shrinkUsersLocked enforces MaxLoadedSessions on user indexes on the
// request path: saved, unused ones leave from the back of the list. Called
// with s.mu held.
func (s *Store) shrinkUsersLocked(keep *userMem) {
	over := s.res.users.Len() - s.opts.MaxLoadedSessions
	if over <= 0 {
		return
	}
	over += s.opts.MaxLoadedSessions / 8
	tries := 0
	for e := s.res.users.Back(); e != nil && over > 0 && tries < 4*over+64; tries++ {
		prev := e.Prev()
		um := e.Value.(*userMem)
		if um != keep && s.userIdleLocked(um) {
			s.dropUserLocked(um)
			s.res.usersUnloaded.Add(1)
			over--
		}
		e = prev
	}
	if over > 0 {
		s.signalTrim()
	}
}

// userIdleLocked reports whether the user index can leave memory: nobody
// is loading or using it, and it is saved. Called with s.mu held.
func (s *Store) userIdleLocked(um *userMem) bool {
	if um.busy > 0 || !um.mu.TryLock() {
		return false
	}
	defer um.mu.Unlock()
	return um.ver == um.saved
}

// trim unloads idle sessions and user indexes, least recently used first,
// while the store holds more than it may (overBudget), at most max of
// them, and returns how many left. A dirty index is saved before its
// owner leaves. Called by the worker only.
func (s *Store) trim(max int) (done int) {
	skipS, skipU := 0, 0 // busy entries at the back, walked past
	for done < max && skipS+skipU < 256 && s.overBudget() {
		s.mu.Lock()
		sess := nthFromBack[*session](&s.res.sessions, skipS)
		um := nthFromBack[*userMem](&s.res.users, skipU)
		var sessUsed, userUsed time.Time
		if sess != nil {
			sessUsed = sess.lastUse
		}
		if um != nil {
			userUsed = um.lastUse
		}
		s.mu.Unlock()
		switch {
		case sess == nil && um == nil:
			return done
		case um == nil || sess != nil && !sessUsed.After(userUsed):
			if s.unloadSession(sess) {
				done++
			} else {
				skipS++
			}
		default:
			if s.unloadUser(um) {
				done++
			} else {
				skipU++
			}
		}
	}
	return done
}

// nthFromBack returns the element n places from the back of l, or the
// zero value.
func nthFromBack[T any](l *list.List, n int) T {
	e := l.Back()
	for ; e != nil && n > 0; n-- {
		e = e.Prev()
	}
	var zero T
	if e == nil {
		return zero
	}
	return e.Value.(T)
}

// unloadSession writes what the session left unwritten and saves its
// index if it changed, then drops the session from memory if it is still
// idle and unused. Worker only.
func (s *Store) unloadSession(sess *session) bool {
	sess.mu.Lock()
	// Left unwritten when its sync did not fit in a full queue: write it.
	unwritten := sess.pending == nil && !sess.queued.Load() && !sess.extracting && sess.hasUnpersisted()
	sess.mu.Unlock()
	if unwritten {
		s.sync(sess)
	}
	sess.mu.Lock()
	dirty := sess.ix != nil && sess.ixVer != sess.ixSaved
	sess.mu.Unlock()
	if dirty {
		s.recall.syncIndex(sess, true)
	}
	s.mu.Lock()
	if sess.lru == nil || !sess.mu.TryLock() {
		s.mu.Unlock()
		return false
	}
	if !s.idleLocked(sess, true) {
		sess.mu.Unlock()
		s.mu.Unlock()
		return false
	}
	l := sess.log
	sess.log = nil
	s.dropSessionLocked(sess)
	s.mu.Unlock()
	sess.mu.Unlock()
	s.res.sessionsUnloaded.Add(1)
	if l != nil {
		s.closeLogs([]*journal.Log{l})
	}
	return true
}

// unloadUser saves the user index if it changed, then drops it from
// memory if nobody uses it. Worker only.
func (s *Store) unloadUser(um *userMem) bool {
	s.recall.saveUser(um, true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if um.lru == nil || !s.userIdleLocked(um) {
		return false
	}
	s.dropUserLocked(um)
	s.res.usersUnloaded.Add(1)
	return true
}
