package memory

import (
	"container/list"
	"fmt"
	"sync"
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
// Both kinds are kept in least-recently-used lists under the registry's
// mu: a lookup
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

// registry owns what is loaded (this file, with session, unpin and forget): the
// sessions and user memories by key, in least-recently-used lists with
// their estimated sizes, and the store's closed flag, under its mu; it
// unloads idle entries (trim, in the worker) and deletes the sessions the
// retention sweep names (retention.go). Lock order: a session's mu, then
// registry.mu (listSession looks its user up under the session's lock);
// under registry.mu a session's mu is only ever tried (TryLock).
//
// Invariants: a session looked up (session) stays loaded until unpin; one
// with a turn in flight, background work queued or running, or unwritten
// units is never unloaded; a key maps to at most one live session (a gone
// one is replaced on its next lookup); nothing is loaded after Shutdown.
type registry struct {
	*env
	// mu protects the fields below.
	mu       sync.Mutex
	sessions map[string]*session
	sessGen  uint64 // counts sessions added to the map (retention.go)
	closed   bool
	// byPath indexes sessions by log path for the retention sweep, rebuilt
	// when sessGen moved past byPathGen.
	byPath    map[string]*session
	byPathGen uint64
	// users are the loaded user memories, by tenant "\x00" user.
	users   map[string]*userMem
	userGen uint64 // counts the user memories loaded (userMem.gen)
	// res orders the loaded sessions and user indexes by last use and
	// sums their estimated sizes.
	res residentSet

	// trimC wakes the worker to unload idle entries (trim).
	trimC chan struct{}

	// What the registry asks of the others: the sessions' logs (load,
	// delete), the indexes (save before unloading, sizes, a deleted
	// session's user documents), the worker's sync of a session before it
	// leaves, and loading a user's index (users.go ensureUser).
	jrn        *sessionJournal
	recall     *retriever
	sync       func(sess *session)
	ensureUser func(um *userMem, asking string)
}

// residentSet orders the loaded sessions and user indexes by last use.
type residentSet struct {
	// sessions and users are protected by the registry's mu; front is the
	// most recently used.
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
func (rg *registry) docSize() int64 {
	dim := 0
	if e := rg.recall.ixOpts.Embedder; e != nil {
		dim = e.Dim()
	}
	if dim <= 0 {
		dim = 512 // the offline embedder's default
	}
	return docBytes + int64(dim)*4
}

// sessionBytesLocked estimates what sess holds in memory. Called with
// sess.mu held.
func (rg *registry) sessionBytesLocked(sess *session) int64 {
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
		n += int64(sess.ix.Len()) * rg.docSize()
	}
	n += int64(len(sess.uidx)) * 64
	return n
}

// userBytes estimates what a user index holds in memory.
func (rg *registry) userBytes(um *userMem) int64 {
	n := int64(userBaseBytes)
	if x := um.index(); x != nil {
		n += int64(x.Len()) * (rg.docSize() + 256) // the texts: a message and its context
	}
	um.mu.Lock()
	n += int64(um.nLinks)*256 + int64(len(um.docs))*64 + int64(len(um.listed))*48
	um.mu.Unlock()
	return n
}

// setSize records an entry's new estimate in the total.
func (rg *registry) setSize(size *atomic.Int64, n int64) {
	rg.res.bytes.Add(n - size.Swap(n))
}

// noteSession refreshes the session's estimate (worker).
func (rg *registry) noteSession(sess *session) {
	sess.mu.Lock()
	n := int64(0)
	if !sess.gone.Load() {
		n = rg.sessionBytesLocked(sess)
	}
	sess.mu.Unlock()
	rg.mu.Lock()
	if sess.lru != nil { // still resident
		rg.setSize(&sess.size, n)
	}
	rg.mu.Unlock()
}

// noteUser refreshes the user index's estimate.
func (rg *registry) noteUser(um *userMem) {
	n := rg.userBytes(um)
	rg.mu.Lock()
	if um.lru != nil {
		rg.setSize(&um.size, n)
	}
	rg.mu.Unlock()
}

// overBudget reports whether the store holds more than it may.
func (rg *registry) overBudget() bool {
	if b := rg.opts.MemoryBudget; b > 0 && rg.res.bytes.Load() > b {
		return true
	}
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return rg.res.sessions.Len() > rg.opts.MaxLoadedSessions || rg.res.users.Len() > rg.opts.MaxLoadedSessions
}

// signalTrim asks the worker to trim, without waiting.
func (rg *registry) signalTrim() {
	select {
	case rg.trimC <- struct{}{}:
	default:
	}
}

// addSessionLocked makes sess resident (front of the list). Called with
// rg.mu held.
func (rg *registry) addSessionLocked(sess *session) {
	sess.lru = rg.res.sessions.PushFront(sess)
	rg.sessions[sess.key] = sess
	rg.sessGen++
}

// dropSessionLocked takes sess out of memory's lists and map (when it is
// still there) and marks it gone. Called with rg.mu held.
func (rg *registry) dropSessionLocked(sess *session) {
	sess.gone.Store(true)
	if rg.sessions[sess.key] == sess {
		delete(rg.sessions, sess.key)
	}
	if sess.lru != nil {
		rg.res.sessions.Remove(sess.lru)
		sess.lru = nil
		rg.res.bytes.Add(-sess.size.Swap(0))
	}
}

// dropUserLocked takes um out of the map and list. Called with rg.mu held.
func (rg *registry) dropUserLocked(um *userMem) {
	if rg.users[um.key] == um {
		delete(rg.users, um.key)
	}
	if um.lru != nil {
		rg.res.users.Remove(um.lru)
		um.lru = nil
		rg.res.bytes.Add(-um.size.Swap(0))
	}
}

// idleLocked reports whether the session can leave memory now: no turn in
// flight, no background work queued or running, nothing unwritten, its
// index saved (unless saved is false). Called with sess.mu held.
func (rg *registry) idleLocked(sess *session, saved bool) bool {
	if sess.refs.Load() > 0 || sess.pending != nil || sess.summarizing || sess.queued.Load() || sess.syncing || sess.hasUnpersisted() {
		return false
	}
	return !saved || sess.ix == nil || sess.ixVer == sess.ixSaved
}

// shrinkSessionsLocked enforces MaxLoadedSessions on the request path:
// idle sessions whose index is saved leave from the back of the list,
// down to 7/8 of the bound, without waiting for any lock (a busy one is
// skipped; the worker's trim finishes the job). Called with rg.mu held; the
// caller closes the logs it returns once it let go of rg.mu.
func (rg *registry) shrinkSessionsLocked(keep *session) []*journal.Log {
	over := rg.res.sessions.Len() - rg.opts.MaxLoadedSessions
	if over <= 0 {
		return nil
	}
	over += rg.opts.MaxLoadedSessions / 8
	var logs []*journal.Log
	tries := 0
	for e := rg.res.sessions.Back(); e != nil && over > 0 && tries < 4*over+64; tries++ {
		prev := e.Prev()
		sess := e.Value.(*session)
		if sess != keep && sess.mu.TryLock() {
			if rg.idleLocked(sess, true) {
				if sess.log != nil {
					logs = append(logs, sess.log)
					sess.log = nil
				}
				rg.dropSessionLocked(sess)
				rg.res.sessionsUnloaded.Add(1)
				over--
			}
			sess.mu.Unlock()
		}
		e = prev
	}
	if over > 0 {
		rg.signalTrim()
	}
	return logs
}

// closeLogs closes the logs of sessions that left memory.
func (rg *registry) closeLogs(logs []*journal.Log) {
	for _, l := range logs {
		if err := l.Close(); err != nil {
			rg.opts.Logger.Warn("memory: close idle session log", "err", err)
		}
	}
}

// shrinkUsersLocked enforces MaxLoadedSessions on user indexes on the
// request path: saved, unused ones leave from the back of the list. Called
// with rg.mu held.
func (rg *registry) shrinkUsersLocked(keep *userMem) {
	over := rg.res.users.Len() - rg.opts.MaxLoadedSessions
	if over <= 0 {
		return
	}
	over += rg.opts.MaxLoadedSessions / 8
	tries := 0
	for e := rg.res.users.Back(); e != nil && over > 0 && tries < 4*over+64; tries++ {
		prev := e.Prev()
		um := e.Value.(*userMem)
		if um != keep && rg.userIdleLocked(um) {
			rg.dropUserLocked(um)
			rg.res.usersUnloaded.Add(1)
			over--
		}
		e = prev
	}
	if over > 0 {
		rg.signalTrim()
	}
}

// userIdleLocked reports whether the user index can leave memory: nobody
// is loading or using it, and it is saved. Called with rg.mu held.
func (rg *registry) userIdleLocked(um *userMem) bool {
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
func (rg *registry) trim(max int) (done int) {
	skipS, skipU := 0, 0 // busy entries at the back, walked past
	for done < max && skipS+skipU < 256 && rg.overBudget() {
		rg.mu.Lock()
		sess := nthFromBack[*session](&rg.res.sessions, skipS)
		um := nthFromBack[*userMem](&rg.res.users, skipU)
		var sessUsed, userUsed time.Time
		if sess != nil {
			sessUsed = sess.lastUse
		}
		if um != nil {
			userUsed = um.lastUse
		}
		rg.mu.Unlock()
		switch {
		case sess == nil && um == nil:
			return done
		case um == nil || sess != nil && !sessUsed.After(userUsed):
			if rg.unloadSession(sess) {
				done++
			} else {
				skipS++
			}
		default:
			if rg.unloadUser(um) {
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
func (rg *registry) unloadSession(sess *session) bool {
	sess.mu.Lock()
	// Left unwritten when its sync did not fit in a full queue: write it.
	unwritten := sess.pending == nil && !sess.queued.Load() && !sess.extracting && sess.hasUnpersisted()
	sess.mu.Unlock()
	if unwritten {
		rg.sync(sess)
	}
	sess.mu.Lock()
	dirty := sess.ix != nil && sess.ixVer != sess.ixSaved
	sess.mu.Unlock()
	if dirty {
		rg.recall.syncIndex(sess, true)
	}
	rg.mu.Lock()
	if sess.lru == nil || !sess.mu.TryLock() {
		rg.mu.Unlock()
		return false
	}
	if !rg.idleLocked(sess, true) {
		sess.mu.Unlock()
		rg.mu.Unlock()
		return false
	}
	l := sess.log
	sess.log = nil
	rg.dropSessionLocked(sess)
	rg.mu.Unlock()
	sess.mu.Unlock()
	rg.res.sessionsUnloaded.Add(1)
	if l != nil {
		rg.closeLogs([]*journal.Log{l})
	}
	return true
}

// unloadUser saves the user index if it changed, then drops it from
// memory if nobody uses it. Worker only.
func (rg *registry) unloadUser(um *userMem) bool {
	rg.recall.saveUser(um, true)
	rg.mu.Lock()
	defer rg.mu.Unlock()
	if um.lru == nil || !rg.userIdleLocked(um) {
		return false
	}
	rg.dropUserLocked(um)
	rg.res.usersUnloaded.Add(1)
	return true
}

// session returns the loaded session, loading it from disk on first use,
// pinned in memory: the caller unpins it (unpin) when done with it. With
// create false a session without a log is ErrNotFound.
func (rg *registry) session(tenant, id string, create bool) (*session, error) {
	key := sessionKey(tenant, id)
	now := rg.opts.Clock.Now()
	rg.mu.Lock()
	if rg.closed {
		rg.mu.Unlock()
		return nil, ErrClosed
	}
	sess := rg.sessions[key]
	added := sess == nil || sess.gone.Load()
	var idled []*journal.Log
	if added {
		if sess != nil {
			rg.dropSessionLocked(sess)
		}
		sess = newSession(rg.opts.Dir, tenant, id)
		rg.addSessionLocked(sess)
		idled = rg.shrinkSessionsLocked(sess)
	} else {
		rg.res.sessions.MoveToFront(sess.lru)
	}
	sess.lastUse = now
	sess.refs.Add(1) // under rg.mu: never unloaded while looked up (resident.go)
	rg.mu.Unlock()
	rg.closeLogs(idled)
	sess.loadOnce.Do(func() { sess.loadErr = rg.jrn.load(sess) })
	if sess.loadErr != nil {
		rg.unpin(sess)
		rg.forget(sess, true)
		return nil, sess.loadErr
	}
	sess.mu.Lock()
	exists := sess.exists
	sess.mu.Unlock()
	if !create && !exists {
		rg.unpin(sess)
		rg.forget(sess, false)
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if added {
		rg.noteSession(sess)
		if rg.opts.MemoryBudget > 0 && rg.res.bytes.Load() > rg.opts.MemoryBudget {
			rg.signalTrim()
		}
	}
	return sess, nil
}

// unpin ends a session lookup (see session).
func (rg *registry) unpin(sess *session) { sess.refs.Add(-1) }

// forget drops sess from memory if it is idle (always when failed).
func (rg *registry) forget(sess *session, failed bool) {
	if !failed {
		if !sess.mu.TryLock() {
			return
		}
		idle := !sess.exists && sess.log == nil && sess.pending == nil
		if idle {
			sess.gone.Store(true)
		}
		sess.mu.Unlock()
		if !idle {
			return
		}
	}
	rg.mu.Lock()
	rg.dropSessionLocked(sess)
	rg.mu.Unlock()
}
