package memory

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/durable"
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
	path         string
	tenantDir    string

	once sync.Once
	x    *index.Index // set by once; nil when recall across sessions is off

	// mu protects the fields below.
	mu       sync.Mutex
	ver      uint64 // changes
	saved    uint64 // ver last written
	lastSave time.Time
	lastUsed time.Time
	docs     map[string]int // documents in the index by session hash
	// The user's knowledge graph (usergraph.go): links by session hash,
	// their count, their version and the version last attached.
	links    map[string][]userLink
	nLinks   int
	linksVer uint64
	graphVer uint64
	graphSet bool
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
	return um.x
}

func (um *userMem) changed() {
	um.mu.Lock()
	um.ver++
	um.mu.Unlock()
}

func tenantDir(root, tenant string) string {
	th := sha256.Sum256([]byte("tenant\x00" + tenant))
	return filepath.Join(root, hex.EncodeToString(th[:12]))
}

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
func (s *Store) userFor(sess *session, requested string) *userMem {
	sess.mu.Lock()
	user := requested
	if sess.exists {
		user = sess.user
	}
	sess.mu.Unlock()
	if s.private(user) {
		return &userMem{tenant: sess.tenant, tenantDir: tenantDir(s.opts.Dir, sess.tenant)}
	}
	return s.userMem(sess.tenant, user)
}

// private reports whether sessions of user keep their memory to
// themselves: the sessions that name no end user, unless the tenant is
// one user scope (Recall.TenantUserScope).
func (s *Store) private(user string) bool {
	return user == "" && !s.opts.Recall.TenantUserScope
}

func (s *Store) userMem(tenant, user string) *userMem {
	key := tenant + "\x00" + user
	now := s.opts.Clock.Now()
	s.mu.Lock()
	um := s.users[key]
	if um == nil {
		um = &userMem{tenant: tenant, user: user, path: userIndexPath(s.opts.Dir, tenant, user), tenantDir: tenantDir(s.opts.Dir, tenant)}
		s.users[key] = um
		s.shrinkUsersLocked(now)
	}
	closed := s.closed
	s.mu.Unlock()
	um.mu.Lock()
	um.lastUsed = now
	um.mu.Unlock()
	if !s.opts.Recall.IndexDisabled && !closed {
		um.once.Do(func() { s.loadUser(um) })
		if s.opts.SharedLog != nil {
			// A fleet: the user's sessions served on other replicas.
			s.syncUserShared(um)
		}
	}
	return um
}

// shrinkUsersLocked drops saved, idle user indexes from memory beyond
// MaxLoadedSessions. Called with s.mu held.
func (s *Store) shrinkUsersLocked(now time.Time) {
	over := len(s.users) - s.opts.MaxLoadedSessions
	for k, um := range s.users {
		if over <= 0 {
			return
		}
		if !um.mu.TryLock() {
			continue
		}
		idle := um.ver == um.saved && now.Sub(um.lastUsed) > time.Minute
		um.mu.Unlock()
		if idle {
			delete(s.users, k)
			over--
		}
	}
}

// loadUser loads the user's index and reconciles it with the logs.
func (s *Store) loadUser(um *userMem) {
	var since time.Time // logs changed after this are reconciled; zero: all
	x, err := index.Load(um.path, s.ixOpts)
	if err == nil {
		if fi, err := os.Stat(um.path); err == nil {
			since = fi.ModTime()
		}
		// The graph is saved after the index: the older of the two.
		switch gt, err := um.loadLinks(); {
		case err != nil:
			if !errors.Is(err, fs.ErrNotExist) {
				s.opts.Logger.Warn("memory: user graph unusable, rebuilding from the logs", "err", err)
			}
			since = time.Time{}
		case gt.Before(since):
			since = gt
		}
	} else {
		if !errors.Is(err, fs.ErrNotExist) {
			s.opts.Logger.Warn("memory: user index unusable, rebuilding from the logs", "file", um.path, "err", err)
			s.stats.indexRebuilds.Add(1)
		}
		if x, err = index.New(s.ixOpts); err != nil {
			s.opts.Logger.Error("memory: new user index", "err", err) // options were validated at Open
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
	um.x = x
	for _, id := range s.userSessions(um, since) {
		sess, err := s.session(um.tenant, id, false)
		if err != nil {
			continue
		}
		s.syncUserDocs(sess, um)
	}
}

// userSessions lists the ids of the user's sessions whose log changed after
// since (all of them when since is zero), from the logs' meta records.
func (s *Store) userSessions(um *userMem, since time.Time) []string {
	shards, err := os.ReadDir(um.tenantDir)
	if err != nil {
		return nil
	}
	var ids []string
	for _, sh := range shards {
		if !sh.IsDir() || len(sh.Name()) != 2 {
			continue
		}
		dir := filepath.Join(um.tenantDir, sh.Name())
		files, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, f := range files {
			if !strings.HasSuffix(f.Name(), ".log") {
				continue
			}
			if !since.IsZero() {
				if fi, err := f.Info(); err != nil || !fi.ModTime().After(since) {
					continue
				}
			}
			meta, err := readLogMeta(filepath.Join(dir, f.Name()), s.opts.MaxRecordBytes)
			if err == nil && meta.K == "meta" && meta.Tenant == um.tenant && meta.User == um.user && meta.Session != "" {
				ids = append(ids, meta.Session)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// readLogMeta reads a log's first record (its meta record) without opening
// the log for writing: the first intact record of the file's head.
func readLogMeta(path string, maxPayload int) (record, error) {
	var rec record
	f, err := os.Open(path)
	if err != nil {
		return rec, err
	}
	defer f.Close()
	head, err := io.ReadAll(io.LimitReader(f, int64(len(logMagic)+min(maxPayload, 1<<16)+durable.RecordHeaderSize)))
	if err != nil {
		return rec, err
	}
	if len(head) < len(logMagic) {
		return rec, errCorrupt
	}
	var first []byte
	switch magic, body := head[:len(logMagic)], head[len(logMagic):]; {
	case bytes.Equal(magic, logMagic):
		durable.ScanRecords(body, maxPayload, func(_ int, p []byte) {
			if first == nil {
				first = p
			}
		})
	case bytes.Equal(magic, legacyMagic):
		if ps, _ := legacyRecords(body, maxPayload); len(ps) > 0 {
			first = ps[0]
		}
	}
	if first == nil {
		return rec, errCorrupt
	}
	err = json.Unmarshal(first, &rec)
	return rec, err
}

// saveUser writes the user's index if it changed and the last save is
// Recall.IndexSaveInterval old (always when force).
func (s *Store) saveUser(um *userMem, force bool) {
	x := um.index()
	if x == nil {
		return
	}
	now := s.opts.Clock.Now()
	um.mu.Lock()
	due := um.ver != um.saved && (force || now.Sub(um.lastSave) >= s.opts.Recall.IndexSaveInterval)
	ver := um.ver
	if due {
		um.lastSave = now
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
		err = um.saveLinks()
	}
	if err != nil {
		s.stats.indexErrors.Add(1)
		s.opts.Logger.Warn("memory: save user index", "err", err)
		return
	}
	s.stats.indexSaves.Add(1)
	um.mu.Lock()
	um.saved = max(um.saved, ver)
	um.mu.Unlock()
}
