package memory

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
	"github.com/kvsidecar/kvsidecar/memory/internal/userlist"
)

// User memory. A user is a scope inside a tenant (TurnRequest.UserID; the
// empty id names no user: such a session is private, see Store.private,
// unless Recall.TenantUserScope makes it the tenant's one shared user): a
// session of a user recalls what
// the user's other sessions hold — every message, facts, episodes, added
// memories — through the user's cross-session index, one per (tenant, user),
// <Dir>/<tenant hash>/users/<user hash>.idx. Nothing crosses tenants: the
// index lives under the tenant's folder, its key includes the tenant, and a
// session's user is fixed when it is created (its log's meta record names
// it).
//
// The index is derived data. Documents are named
// <session hash>|<role>|<unit id> ("msg-<seq>" for a message, whether in its
// session's window or evicted), so a document leads back to its session's
// log; their text is the memory's text, then "\x1e" and the message before
// it as context (see userDocText). The worker adds a session's new messages
// and units after each turn; deletions follow. When the index is loaded it
// is checked against the logs: documents of sessions whose log is gone are
// dropped, and sessions whose log changed after the index was saved (all of
// the user's sessions when the file is missing or corrupt) are loaded and
// reconciled. Beyond Recall.UserMaxDocs the oldest documents leave it.

// userMem is one user's cross-session memory.
type userMem struct {
	tenant, user string
	key          string // tenant "\x00" user: its key in Store.users
	gen          uint64 // distinguishes the copies loaded one after the other (never 0)
	path         string
	tenantDir    string

	// Protected by the registry's mu: lru is the index's place in the list
	// of loaded user indexes (nil: not resident), lastUse its last
	// lookup, busy the lookups still loading or syncing it. size is its
	// estimated resident bytes (resident.go).
	lru     *list.Element
	lastUse time.Time
	busy    int
	size    atomic.Int64

	// x is the user's index: nil until a session of the user asks while
	// the user has another session (ensureIndex; one session recalls only
	// its own memory, so it needs none), and when recall across sessions
	// is off. loadMu serialises its loading.
	loadMu sync.Mutex
	x      atomic.Pointer[index.Index]

	// mu protects the fields below.
	mu       sync.Mutex
	ver      uint64 // changes
	saved    uint64 // ver last written
	lastSave time.Time
	docs     map[string]int // documents in the index by session hash
	// The user's knowledge graph (usergraph.go): links by session hash,
	// their count, their version and the version last attached.
	links    map[string][]knowledge.Link
	nLinks   int
	linksVer uint64
	graphVer uint64
	// linksWritten is linksVer+1 when the graph file was last written or
	// read (0: not since loaded).
	linksWritten uint64
	graphSet     bool
	// listed are the ids in the user's session list (userlist.go), read
	// on first use (listRead) and kept up to date by listSession.
	listed   []string
	listRead bool
}

// countDocs adds n documents of the session hash h (n < 0 removes).
func (um *userMem) countDocs(h string, n int) {
	um.mu.Lock()
	defer um.mu.Unlock()
	if um.docs == nil {
		um.docs = map[string]int{}
	}
	if um.docs[h] += n; um.docs[h] <= 0 {
		delete(um.docs, h)
	}
}

// hasOthers reports whether the index holds documents of sessions other
// than the one hashed h.
func (um *userMem) hasOthers(h string) bool {
	um.mu.Lock()
	defer um.mu.Unlock()
	return len(um.docs) > 1 || (len(um.docs) == 1 && um.docs[h] == 0)
}

// docSession is the session hash of a document id.
func docSession(id string) string {
	h, _, _ := strings.Cut(id, "|")
	return h
}

// index returns the user's index, nil when there is none.
func (um *userMem) index() *index.Index {
	if um == nil {
		return nil
	}
	return um.x.Load()
}

func (um *userMem) changed() {
	um.mu.Lock()
	um.ver++
	um.mu.Unlock()
}

func tenantDir(root, tenant string) string { return journal.TenantDir(root, tenant) }

func userIndexPath(root, tenant, user string) string {
	uh := sha256.Sum256([]byte("user\x00" + tenant + "\x00" + user))
	// Not ".idx": the retention sweep removes an .idx without its .log.
	return filepath.Join(tenantDir(root, tenant), "users", hex.EncodeToString(uh[:16])+".uidx")
}

// userFor returns the memory of the session's user: the one the session was
// created with, else requested (a new session). It loads the user's index on
// first use, which may load other sessions of the user: call it without
// holding any session's lock.
//
// A session without an end user (user "") is private unless
// Recall.TenantUserScope: its userMem holds no index, so it recalls only
// its own memory and nothing of it reaches another session.
func (us *userScope) userFor(sess *session, requested string) *userMem {
	um := us.holdUserFor(sess, requested)
	us.reg.releaseUser(um)
	return um
}

// private reports whether sessions of user keep their memory to
// themselves: the sessions that name no end user, unless the tenant is
// one user scope (Recall.TenantUserScope).
func (e *env) private(user string) bool {
	return user == "" && !e.opts.Recall.TenantUserScope
}

func (rg *registry) userMem(tenant, user string) *userMem {
	um := rg.holdUser(tenant, user, "")
	rg.releaseUser(um)
	return um
}

// holdUser is userMem, keeping the user index resident until releaseUser.
// asking is the id of the session that asks ("" for none): the index
// loads only when the user has a session other than it.
func (rg *registry) holdUser(tenant, user, asking string) *userMem {
	key := tenant + "\x00" + user
	now := rg.opts.Clock.Now()
	rg.mu.Lock()
	um := rg.users[key]
	if um == nil {
		rg.userGen++
		um = &userMem{gen: rg.userGen, tenant: tenant, user: user, key: key, path: userIndexPath(rg.opts.Dir, tenant, user), tenantDir: tenantDir(rg.opts.Dir, tenant)}
		rg.users[key] = um
		um.lru = rg.res.users.PushFront(um)
		rg.shrinkUsersLocked(um)
	} else if um.lru != nil {
		rg.res.users.MoveToFront(um.lru)
	}
	um.lastUse = now
	um.busy++ // not unloaded while it loads or syncs (resident.go)
	closed := rg.closed
	rg.mu.Unlock()
	if !rg.opts.Recall.IndexDisabled && !closed {
		rg.ensureUser(um, asking)
	}
	return um
}

// ensureUser loads the user's index when it is needed (ensureIndex) and,
// in a fleet, brings the user's sessions served on other replicas up to
// date.
func (us *userScope) ensureUser(um *userMem, asking string) {
	us.ensureIndex(um, asking)
	if us.opts.SharedLog != nil {
		us.syncUserShared(um)
		us.ensureIndex(um, asking)
	}
}

// ensureIndex loads the user's index (loadUser) unless it is loaded or
// the user has no session but asking.
func (us *userScope) ensureIndex(um *userMem, asking string) {
	if um.index() != nil {
		return
	}
	um.loadMu.Lock()
	defer um.loadMu.Unlock()
	if um.index() != nil {
		return
	}
	need := false
	for _, id := range us.userListed(um) {
		if id != asking {
			need = true
			break
		}
	}
	if need {
		us.loadUser(um)
		us.reg.noteUser(um)
	}
}

// releaseUser ends a holdUser (nil: nothing to release).
func (rg *registry) releaseUser(um *userMem) {
	if um == nil || um.key == "" {
		return
	}
	rg.mu.Lock()
	um.busy--
	rg.mu.Unlock()
}

// holdUserFor is userFor, keeping a user index resident until releaseUser.
func (us *userScope) holdUserFor(sess *session, requested string) *userMem {
	sess.mu.Lock()
	user := requested
	if sess.exists {
		user = sess.user
	}
	sess.mu.Unlock()
	if us.private(user) {
		return &userMem{tenant: sess.tenant, tenantDir: tenantDir(us.opts.Dir, sess.tenant)}
	}
	return us.reg.holdUser(sess.tenant, user, sess.id)
}

// loadUser loads the user's index and reconciles it with the logs.
func (us *userScope) loadUser(um *userMem) {
	var since time.Time // logs changed after this are reconciled; zero: all
	x, err := index.Load(um.path, us.recall.ixOpts)
	if err == nil {
		if fi, err := os.Stat(um.path); err == nil {
			since = fi.ModTime()
		}
		// The graph is saved after the index: the older of the two.
		switch gt, err := um.loadLinks(); {
		case err != nil:
			if !errors.Is(err, fs.ErrNotExist) {
				us.opts.Logger.Warn("memory: user graph unusable, rebuilding from the logs", "err", err)
			}
			since = time.Time{}
		case gt.Before(since):
			since = gt
			fallthrough
		default:
			um.mu.Lock()
			um.linksWritten = um.linksVer + 1
			um.mu.Unlock()
		}
	} else {
		if !errors.Is(err, fs.ErrNotExist) {
			us.opts.Logger.Warn("memory: user index unusable, rebuilding from the logs", "file", um.path, "err", err)
			us.stats.indexRebuilds.Add(1)
		}
		if x, err = index.New(us.recall.ixOpts); err != nil {
			us.opts.Logger.Error("memory: new user index", "err", err) // options were validated at Open
			return
		}
	}
	// Documents of sessions whose log is gone (deleted while the index was
	// not loaded) leave.
	logs := map[string]bool{}
	x.Range(func(id string, _ index.Meta) bool {
		if h, _, ok := strings.Cut(id, "|"); ok {
			logs[h] = true
		}
		return true
	})
	for h := range um.links {
		logs[h] = true
	}
	var drop []string
	for h := range logs {
		if len(h) < 2 {
			continue
		}
		if _, err := os.Stat(filepath.Join(um.tenantDir, h[:2], h+".log")); errors.Is(err, fs.ErrNotExist) {
			drop = append(drop, h+"|")
			um.setLinks(h, nil)
		}
	}
	if len(drop) > 0 {
		var ids []string
		x.Range(func(id string, _ index.Meta) bool {
			for _, p := range drop {
				if strings.HasPrefix(id, p) {
					ids = append(ids, id)
				}
			}
			return true
		})
		for _, id := range ids {
			x.Delete(id)
		}
		um.ver++
	}
	x.Range(func(id string, _ index.Meta) bool {
		um.countDocs(docSession(id), 1)
		return true
	})
	um.x.Store(x)
	um.mu.Lock()
	um.lastSave = us.opts.Clock.Now() // what loaded is on disk: the next save waits IndexSaveInterval
	um.mu.Unlock()
	for _, id := range us.listUserSessions(um, since) {
		sess, err := us.reg.session(um.tenant, id, false)
		if err != nil {
			continue
		}
		sess.mu.Lock()
		mine := sess.user == um.user
		sess.mu.Unlock()
		if mine { // not an id reused by another user after a deletion
			us.recall.syncUserDocs(sess, um)
		}
		us.reg.unpin(sess)
	}
}

// readLogMeta reads a log's meta record (its first) without opening the
// log for writing (journal.ReadFirst).
func readLogMeta(j *journal.Journal, path string) (record, error) {
	var rec record
	first, err := j.ReadFirst(path)
	if err != nil {
		return rec, err
	}
	err = json.Unmarshal(first, &rec)
	return rec, err
}

// saveUser writes the user's index if it changed and the last save is
// Recall.IndexSaveInterval old (always when force).
func (rt *retriever) saveUser(um *userMem, force bool) {
	x := um.index()
	if x == nil {
		return
	}
	now := rt.opts.Clock.Now()
	um.mu.Lock()
	due := um.ver != um.saved && (force || now.Sub(um.lastSave) >= rt.opts.Recall.IndexSaveInterval)
	ver := um.ver
	if due {
		um.lastSave = now
	}
	if due && len(um.docs) <= 1 && len(um.links) <= 1 {
		// One session's documents at most: loading rebuilds them from that
		// session's log (listed, and changed after any older file), which
		// a returning session reads anyway; two files written per new user
		// would cost more than they save.
		um.saved = ver
		due = false
	}
	um.mu.Unlock()
	if !due {
		return
	}
	err := os.MkdirAll(filepath.Dir(um.path), 0o755)
	if err == nil {
		err = x.Save(um.path)
	}
	if err == nil {
		// The graph's file is rewritten only when its links changed since
		// it was last written; otherwise its time moves with the index's
		// (loadUser reconciles from the older of the two).
		um.mu.Lock()
		links, written := um.linksVer, um.linksWritten
		um.mu.Unlock()
		if written == 0 || written != links+1 || os.Chtimes(userGraphPath(um.path), now, now) != nil {
			if err = um.saveLinks(); err == nil {
				um.mu.Lock()
				um.linksWritten = links + 1
				um.mu.Unlock()
			}
		}
	}
	if err != nil {
		rt.stats.indexErrors.Add(1)
		rt.opts.Logger.Warn("memory: save user index", "err", err)
		return
	}
	rt.stats.indexSaves.Add(1)
	um.mu.Lock()
	um.saved = max(um.saved, ver)
	um.mu.Unlock()
}

// userScope owns the user scope of recall (users.go, userlist.go,
// shared.go syncUserShared): which user memory a session belongs to, the
// users' session lists, and loading a user's cross-session index from
// the logs of the user's sessions (and, in a fleet, the sessions other
// replicas served). The registry holds the loaded user memories; the
// retriever keeps their documents.
//
// Invariants: a session that names no end user is private (unless
// Recall.TenantUserScope): its userMem holds no index; a user's index
// loads only once the user has a second session; nothing crosses tenants.
type userScope struct {
	*env
	reg    *registry
	recall *retriever
	jrn    *sessionJournal
	lists  *userlist.Lists
}
