package userlist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

var magic = []byte("KVSUSES1")

// listedMarker, in a tenant's users folder, says every session of the
// tenant that has a user index is in its user's list.
const listedMarker = "listed.v1"

var errCorrupt = durable.NewCorrupt("memory: corrupt user session list")

// Path is the session list of the user whose index is at indexPath.
func Path(indexPath string) string { return strings.TrimSuffix(indexPath, ".uidx") + ".usess" }

// MarkerPath is the listed marker of the tenant whose folder is tdir.
func MarkerPath(tdir string) string { return filepath.Join(tdir, "users", listedMarker) }

// Options configure Lists.
type Options struct {
	// Journal reads the meta records of session logs (ListTenant, Scan)
	// and bounds a record.
	Journal *journal.Journal
	// NoSync never fsyncs (memory's FsyncNever).
	NoSync bool
	// Logger reports what could not be written.
	Logger *slog.Logger
}

// Lists serialises the rewrites of session lists with the appends (an
// append never needs it against another append: O_APPEND), and keeps the
// lists appended to since their last fsync. Safe for concurrent use.
type Lists struct {
	o       Options
	mu      sync.RWMutex
	tenants sync.Map // tenant dir → *sync.Once of its first scan

	// dirtyMu protects dirty: list path → whether the file was created.
	dirtyMu sync.Mutex
	dirty   map[string]bool
}

// New returns the lists.
func New(o Options) *Lists { return &Lists{o: o} }

// Add appends id to the list at path without waiting for an fsync (Sync
// does it later), creating the list (and its folder) when missing.
func (l *Lists) Add(path, id string) error {
	created, err := l.append(path, id, false)
	if err != nil || l.o.NoSync {
		return err
	}
	l.dirtyMu.Lock()
	if l.dirty == nil {
		l.dirty = map[string]bool{}
	}
	l.dirty[path] = l.dirty[path] || created
	l.dirtyMu.Unlock()
	return nil
}

// append adds id to the session list at path, creating it (and its
// folder) when missing, and reports whether it created the file. With sync
// the record is fsynced, and a new file's folder too.
func (l *Lists) append(path, id string, sync bool) (bool, error) {
	p, err := json.Marshal(id)
	if err != nil {
		return false, err
	}
	rec := durable.AppendRecord(nil, p)
	l.mu.RLock()
	defer l.mu.RUnlock()
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
			rec = append(bytes.Clone(magic), rec...)
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

// Sync fsyncs the lists appended to since the last call, and the folders
// of those it created (the owner's worker, and Shutdown).
func (l *Lists) Sync() {
	l.dirtyMu.Lock()
	dirty := l.dirty
	l.dirty = nil
	l.dirtyMu.Unlock()
	dirs := map[string]bool{}
	for path, created := range dirty {
		if err := syncFile(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			l.o.Logger.Warn("memory: fsync user session list", "err", err)
		}
		if created {
			dirs[filepath.Dir(path)] = true
		}
	}
	for dir := range dirs {
		if err := durable.SyncDir(dir); err != nil {
			l.o.Logger.Warn("memory: fsync user session lists' folder", "err", err)
		}
	}
}

// Read returns the ids of the list at path in order, each once. A missing
// file is an empty list.
func (l *Lists) Read(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("memory: user session list: %w", err)
	}
	if !bytes.HasPrefix(data, magic) {
		return nil, fmt.Errorf("memory: user session list %s: bad magic: %w", filepath.Base(path), errCorrupt)
	}
	var ids []string
	seen := map[string]bool{}
	durable.ScanRecords(data[len(magic):], l.o.Journal.MaxRecord(), func(_ int, p []byte) {
		var id string
		if json.Unmarshal(p, &id) == nil && id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	})
	return ids, nil
}

// Replace replaces the list at path with ids (atomically).
func (l *Lists) Replace(path string, ids []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return write(path, ids)
}

// Drop rewrites the list at path without the ids in drop (atomically;
// appends wait meanwhile, none is lost).
func (l *Lists) Drop(path string, drop map[string]bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids, err := l.Read(path)
	if err != nil {
		return err
	}
	return write(path, slices.DeleteFunc(ids, func(id string) bool { return drop[id] }))
}

func write(path string, ids []string) error {
	image := bytes.Clone(magic)
	for _, id := range ids {
		p, err := json.Marshal(id)
		if err != nil {
			return err
		}
		image = durable.AppendRecord(image, p)
	}
	return durable.WriteFile(path, image)
}

// ListTenant makes sure, once per tenant and process, that the tenant's
// sessions (its logs are under tdir) are in their users' lists: when its
// users folder has no listedMarker, every log of the tenant is read once
// and listed. listPath names a user's list.
func (l *Lists) ListTenant(tdir, tenant string, listPath func(user string) string) {
	v, _ := l.tenants.LoadOrStore(tdir, new(sync.Once))
	v.(*sync.Once).Do(func() {
		marker := MarkerPath(tdir)
		if _, err := os.Stat(marker); err == nil {
			return
		}
		byUser := map[string][]string{}
		var users []string
		l.forEachMeta(tdir, func(m meta) {
			if m.Tenant != tenant {
				return
			}
			if _, ok := byUser[m.User]; !ok {
				users = append(users, m.User)
			}
			byUser[m.User] = append(byUser[m.User], m.Session)
		})
		sync := !l.o.NoSync
		for _, u := range users {
			path := listPath(u)
			for _, id := range byUser[u] {
				if _, err := l.append(path, id, false); err != nil {
					l.o.Logger.Warn("memory: list the tenant's sessions", "err", err)
					return // no marker: the next start lists again
				}
			}
			if sync {
				if err := syncFile(path); err != nil {
					l.o.Logger.Warn("memory: list the tenant's sessions", "err", err)
					return
				}
			}
		}
		if err := durable.MkdirAll(filepath.Dir(marker), 0o755); err == nil {
			err = durable.WriteFile(marker, []byte("every session with a user index is in its user's .usess list\n"))
			if err != nil {
				l.o.Logger.Warn("memory: write the tenant's listed marker", "err", err)
			}
		}
	})
}

// Scan lists the ids of the user's sessions from the meta records of
// every log of the tenant under tdir (linear in the tenant's sessions:
// only for a list that cannot be read).
func (l *Lists) Scan(tdir, tenant, user string) []string {
	var ids []string
	l.forEachMeta(tdir, func(m meta) {
		if m.Tenant == tenant && m.User == user {
			ids = append(ids, m.Session)
		}
	})
	return ids
}

// meta is what a session log's meta record (package memory's record, kind
// "meta") says of its session.
type meta struct {
	K       string `json:"k"`
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	User    string `json:"user"`
}

// forEachMeta calls fn with the meta record of every session log under
// the tenant folder tdir.
func (l *Lists) forEachMeta(tdir string, fn func(meta)) {
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
			first, err := l.o.Journal.ReadFirst(filepath.Join(dir, f.Name()))
			var m meta
			if err == nil && json.Unmarshal(first, &m) == nil && m.K == "meta" && m.Session != "" {
				fn(m)
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
