package memory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// The user's session list. Loading a user's memory (users.go, loadUser)
// needs the user's sessions; finding them by reading the meta record of
// every log of the tenant made loading cost linear in the tenant's
// sessions — with each session its own user, every new session read every
// log (issue 22). Each user that has a cross-session index therefore has a
// list of its session ids beside the index, <user hash>.usess: the magic
// "KVSUSES1", then one framed record (durable.AppendRecord) per session,
// its id as a JSON string, appended when the session is created and before
// its log is, so a session with a log is listed. Appends are single
// O_APPEND writes; the request path does not wait for their fsync: the
// worker fsyncs the lists appended to after the turn (unless FsyncNever),
// so only a power loss in between can lose an entry. A torn record is
// skipped when read (records resynchronise); an id may appear twice. A
// list names sessions that were deleted since: reading it checks each log,
// and a list whose dead ids outnumber the live ones is rewritten.
//
// Data written before the lists existed: the first user loaded in a tenant
// whose users folder holds no listedMarker lists every session of the
// tenant by its log's meta record (the old scan, once), then writes the
// marker. Sessions private when created (no end user, Recall.TenantUserScope
// off) are listed only by that first scan. A list that cannot be read is
// rebuilt the same way, for its user only.

var userListMagic = []byte("KVSUSES1")

// listedMarker, in a tenant's users folder, says every session of the
// tenant that has a user index is in its user's list.
const listedMarker = "listed.v1"

// userListPath is the user's session list, beside its index.
func userListPath(indexPath string) string { return strings.TrimSuffix(indexPath, ".uidx") + ".usess" }

// userLists serialises the rewrites of session lists with the appends
// (an append never needs it against another append: O_APPEND), and keeps
// the lists appended to since their last fsync.
type userLists struct {
	mu      sync.RWMutex
	tenants sync.Map // tenant dir → *sync.Once of its first scan

	// dirtyMu protects dirty: list path → whether the file was created.
	dirtyMu sync.Mutex
	dirty   map[string]bool
}

// appendUserList adds id to the session list at path, creating it (and
// its folder) when missing, and reports whether it created the file.
// With sync the record is fsynced, and a new file's folder too.
func (s *Store) appendUserList(path, id string, sync bool) (bool, error) {
	p, err := json.Marshal(id)
	if err != nil {
		return false, err
	}
	rec := durable.AppendRecord(nil, p)
	s.lists.mu.RLock()
	defer s.lists.mu.RUnlock()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	created := false
	if errors.Is(err, fs.ErrNotExist) {
		dir := filepath.Dir(path)
		if err = durable.MkdirAll(dir, 0o755); err != nil {
			return false, err
		}
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			created = true
			rec = append(append([]byte(nil), userListMagic...), rec...)
		} else if errors.Is(err, fs.ErrExist) {
			f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		}
	}
	if err != nil {
		return false, fmt.Errorf("memory: user session list: %w", err)
	}
	_, err = f.Write(rec)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && created && sync {
		err = durable.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		return created, fmt.Errorf("memory: user session list: %w", err)
	}
	return created, nil
}

// listSession adds a new session to its user's list, unless it is
// private. Called on the request path before the session's log is
// created: the write is not fsynced there (a crash of the process keeps
// it); the worker fsyncs it right after the turn (syncLists), unless
// FsyncNever.
func (s *Store) listSession(tenant, user, id string) error {
	if s.private(user) {
		return nil
	}
	path := userListPath(userIndexPath(s.opts.Dir, tenant, user))
	created, err := s.appendUserList(path, id, false)
	if err != nil {
		return err
	}
	s.mu.Lock()
	um := s.users[tenant+"\x00"+user]
	s.mu.Unlock()
	if um != nil {
		um.mu.Lock()
		um.listed = append(um.listed, id) // before listRead: merged by userListed
		um.mu.Unlock()
	}
	if s.opts.Fsync == FsyncNever {
		return nil
	}
	s.lists.dirtyMu.Lock()
	if s.lists.dirty == nil {
		s.lists.dirty = map[string]bool{}
	}
	s.lists.dirty[path] = s.lists.dirty[path] || created
	s.lists.dirtyMu.Unlock()
	return nil
}

// syncLists fsyncs the lists appended to since the last call, and the
// folders of those it created (worker, and Shutdown).
func (s *Store) syncLists() {
	s.lists.dirtyMu.Lock()
	dirty := s.lists.dirty
	s.lists.dirty = nil
	s.lists.dirtyMu.Unlock()
	dirs := map[string]bool{}
	for path, created := range dirty {
		if err := syncFile(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.opts.Logger.Warn("memory: fsync user session list", "err", err)
		}
		if created {
			dirs[filepath.Dir(path)] = true
		}
	}
	for dir := range dirs {
		if err := durable.SyncDir(dir); err != nil {
			s.opts.Logger.Warn("memory: fsync user session lists' folder", "err", err)
		}
	}
}

// readUserList returns the ids of the list at path in order, each once.
// A missing file is an empty list.
func readUserList(path string, maxRecord int) ([]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("memory: user session list: %w", err)
	}
	if !bytes.HasPrefix(data, userListMagic) {
		return nil, fmt.Errorf("memory: user session list %s: bad magic: %w", filepath.Base(path), errCorrupt)
	}
	var ids []string
	seen := map[string]bool{}
	durable.ScanRecords(data[len(userListMagic):], maxRecord, func(_ int, p []byte) {
		var id string
		if json.Unmarshal(p, &id) == nil && id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	})
	return ids, nil
}

// replaceUserList replaces the list at path with ids (atomically).
func (s *Store) replaceUserList(path string, ids []string) error {
	s.lists.mu.Lock()
	defer s.lists.mu.Unlock()
	return writeUserList(path, ids)
}

// dropFromUserList rewrites the list at path without the ids in drop
// (atomically; appends wait meanwhile, none is lost).
func (s *Store) dropFromUserList(path string, drop map[string]bool) error {
	s.lists.mu.Lock()
	defer s.lists.mu.Unlock()
	ids, err := readUserList(path, s.opts.MaxRecordBytes)
	if err != nil {
		return err
	}
	return writeUserList(path, slices.DeleteFunc(ids, func(id string) bool { return drop[id] }))
}

func writeUserList(path string, ids []string) error {
	image := append([]byte(nil), userListMagic...)
	for _, id := range ids {
		p, err := json.Marshal(id)
		if err != nil {
			return err
		}
		image = durable.AppendRecord(image, p)
	}
	return durable.WriteFile(path, image)
}

// userListed returns the ids of the user's session list, reading it on
// first use (after listing the tenant's sessions once, listTenant).
func (s *Store) userListed(um *userMem) []string {
	um.mu.Lock()
	ids, ok := um.listed, um.listRead
	um.mu.Unlock()
	if ok {
		return ids
	}
	s.listTenant(um.tenant)
	path := userListPath(um.path)
	ids, err := readUserList(path, s.opts.MaxRecordBytes)
	if err != nil {
		s.opts.Logger.Warn("memory: user session list unreadable, listing the tenant's logs", "err", err)
		ids = s.scanUserSessions(um.tenantDir, um.tenant, um.user)
		if err := s.replaceUserList(path, ids); err != nil {
			s.opts.Logger.Warn("memory: rewrite user session list", "err", err)
		}
	}
	um.mu.Lock()
	defer um.mu.Unlock()
	if !um.listRead {
		// Appends that raced with the read are in the file and, after
		// listRead, in listed: keep both, deduplicated.
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			seen[id] = true
		}
		for _, id := range um.listed {
			if !seen[id] {
				ids = append(ids, id)
			}
		}
		um.listed, um.listRead = ids, true
	}
	return um.listed
}

// listUserSessions returns the ids of the user's sessions whose log
// changed after since (all of them when since is zero), from the user's
// list; it rewrites a list that names more deleted sessions than live
// ones.
func (s *Store) listUserSessions(um *userMem, since time.Time) []string {
	ids := s.userListed(um)
	var live, changed []string
	for _, id := range ids {
		fi, err := os.Stat(sessionPath(s.opts.Dir, um.tenant, id))
		if err != nil {
			continue
		}
		live = append(live, id)
		if since.IsZero() || fi.ModTime().After(since) {
			changed = append(changed, id)
		}
	}
	if dead := len(ids) - len(live); dead > 16 && dead > len(live) {
		drop := map[string]bool{}
		for _, id := range ids {
			drop[id] = true
		}
		for _, id := range live {
			delete(drop, id)
		}
		if err := s.dropFromUserList(userListPath(um.path), drop); err != nil {
			s.opts.Logger.Warn("memory: rewrite user session list", "err", err)
		} else {
			um.mu.Lock()
			um.listed = slices.DeleteFunc(um.listed, func(id string) bool { return drop[id] })
			um.mu.Unlock()
		}
	}
	return changed
}

// listTenant makes sure, once per tenant and process, that the tenant's
// sessions are in their users' lists: when its users folder has no
// listedMarker, every log of the tenant is read once and listed.
func (s *Store) listTenant(tenant string) {
	dir := tenantDir(s.opts.Dir, tenant)
	v, _ := s.lists.tenants.LoadOrStore(dir, new(sync.Once))
	v.(*sync.Once).Do(func() {
		marker := filepath.Join(dir, "users", listedMarker)
		if _, err := os.Stat(marker); err == nil {
			return
		}
		byUser := map[string][]string{}
		var users []string
		s.forEachLogMeta(dir, func(meta record) {
			if meta.Tenant != tenant {
				return
			}
			if _, ok := byUser[meta.User]; !ok {
				users = append(users, meta.User)
			}
			byUser[meta.User] = append(byUser[meta.User], meta.Session)
		})
		sync := s.opts.Fsync != FsyncNever
		for _, u := range users {
			path := userListPath(userIndexPath(s.opts.Dir, tenant, u))
			for _, id := range byUser[u] {
				if _, err := s.appendUserList(path, id, false); err != nil {
					s.opts.Logger.Warn("memory: list the tenant's sessions", "err", err)
					return // no marker: the next start lists again
				}
			}
			if sync {
				if err := syncFile(path); err != nil {
					s.opts.Logger.Warn("memory: list the tenant's sessions", "err", err)
					return
				}
			}
		}
		if err := durable.MkdirAll(filepath.Dir(marker), 0o755); err == nil {
			err = durable.WriteFile(marker, []byte("every session with a user index is in its user's .usess list\n"))
			if err != nil {
				s.opts.Logger.Warn("memory: write the tenant's listed marker", "err", err)
			}
		}
	})
}

// scanUserSessions lists the ids of the user's sessions from the meta
// records of every log of the tenant (linear in the tenant's sessions:
// only for a list that cannot be read).
func (s *Store) scanUserSessions(tdir, tenant, user string) []string {
	var ids []string
	s.forEachLogMeta(tdir, func(meta record) {
		if meta.Tenant == tenant && meta.User == user {
			ids = append(ids, meta.Session)
		}
	})
	return ids
}

// forEachLogMeta calls fn with the meta record of every session log under
// the tenant folder tdir.
func (s *Store) forEachLogMeta(tdir string, fn func(meta record)) {
	shards, err := os.ReadDir(tdir)
	if err != nil {
		return
	}
	for _, sh := range shards {
		if !sh.IsDir() || len(sh.Name()) != 2 {
			continue
		}
		dir := filepath.Join(tdir, sh.Name())
		files, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, f := range files {
			if !strings.HasSuffix(f.Name(), ".log") {
				continue
			}
			meta, err := readLogMeta(s.j, filepath.Join(dir, f.Name()))
			if err == nil && meta.K == "meta" && meta.Session != "" {
				fn(meta)
			}
		}
	}
}

// syncFile fsyncs the file at path.
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
