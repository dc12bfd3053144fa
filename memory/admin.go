package memory

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// Accessors for the operator's console (proxy's admin API): listing what
// is stored, and editing one memory. They read the same logs and take the
// same locks as the request path; none of them creates a session.

// SessionInfo is one stored session as the console lists it.
type SessionInfo struct {
	Tenant string `json:"tenant"`
	ID     string `json:"id"`
	// User is the user scope the session was created with ("" for the
	// tenant's default user).
	User string `json:"user"`
	// Bytes is the size of the session's log; UpdatedAt its last write.
	Bytes     int64     `json:"bytes"`
	UpdatedAt time.Time `json:"updated_at"`
}

// TenantInfo is one tenant with stored sessions.
type TenantInfo struct {
	Tenant    string    `json:"tenant"`
	Sessions  int       `json:"sessions"`
	UpdatedAt time.Time `json:"updated_at"`
}

// storedLog is a session log found on disk, before its meta record is read.
type storedLog struct {
	path  string
	bytes int64
	mtime time.Time
}

// logsUnder lists the session logs of one tenant folder.
func logsUnder(dir string) []storedLog {
	shards, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []storedLog
	for _, sh := range shards {
		if !sh.IsDir() || len(sh.Name()) != 2 {
			continue // users/, the pool log, files the store does not own
		}
		files, err := os.ReadDir(filepath.Join(dir, sh.Name()))
		if err != nil {
			continue
		}
		for _, f := range files {
			if !strings.HasSuffix(f.Name(), ".log") {
				continue
			}
			fi, err := f.Info()
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			out = append(out, storedLog{filepath.Join(dir, sh.Name(), f.Name()), fi.Size(), fi.ModTime()})
		}
	}
	return out
}

// newestFirst sorts logs by last write, newest first (path breaks ties, so
// the order is stable).
func newestFirst(logs []storedLog) {
	slices.SortFunc(logs, func(a, b storedLog) int {
		if c := b.mtime.Compare(a.mtime); c != 0 {
			return c
		}
		return cmp.Compare(a.path, b.path)
	})
}

// tenantDirs lists the tenant folders under root (memory's folder), the
// quarantine folder left out.
func tenantDirs(root, quarantine string) []string {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && e.Name() != quarantine {
			out = append(out, filepath.Join(root, e.Name()))
		}
	}
	return out
}

// Sessions lists the stored sessions of tenant (of every tenant when
// tenant is ""), of user only when user is not nil, newest first, at most
// limit of them (limit ≤ 0: 1000). Names come from each log's meta record;
// a log whose meta cannot be read is left out. It reads this machine's
// disk: in a fleet, sessions only other replicas served are not listed.
func (s *Store) Sessions(tenant string, user *string, limit int) ([]SessionInfo, error) {
	if limit <= 0 {
		limit = 1000
	}
	s.reg.mu.Lock()
	closed := s.reg.closed
	s.reg.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	var logs []storedLog
	if tenant != "" {
		logs = logsUnder(tenantDir(s.opts.Dir, tenant))
	} else {
		for _, d := range tenantDirs(s.opts.Dir, filepath.Base(s.j.Quarantine())) {
			logs = append(logs, logsUnder(d)...)
		}
	}
	newestFirst(logs)
	out := []SessionInfo{}
	for _, l := range logs {
		if len(out) >= limit {
			break
		}
		meta, err := readLogMeta(s.j, l.path)
		if err != nil || meta.K != "meta" || meta.Session == "" {
			continue
		}
		if tenant != "" && meta.Tenant != tenant || user != nil && meta.User != *user {
			continue
		}
		out = append(out, SessionInfo{Tenant: meta.Tenant, ID: meta.Session, User: meta.User, Bytes: l.bytes, UpdatedAt: l.mtime})
	}
	return out, nil
}

// Tenants lists the tenants that have stored sessions on this machine,
// most recently written first. A tenant is named by the newest of its
// logs whose meta record reads.
func (s *Store) Tenants() ([]TenantInfo, error) {
	s.reg.mu.Lock()
	closed := s.reg.closed
	s.reg.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	out := []TenantInfo{}
	for _, d := range tenantDirs(s.opts.Dir, filepath.Base(s.j.Quarantine())) {
		logs := logsUnder(d)
		newestFirst(logs)
		for _, l := range logs {
			meta, err := readLogMeta(s.j, l.path)
			if err == nil && meta.K == "meta" && meta.Tenant != "" && tenantDir(s.opts.Dir, meta.Tenant) == d {
				out = append(out, TenantInfo{Tenant: meta.Tenant, Sessions: len(logs), UpdatedAt: logs[0].mtime})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b TenantInfo) int {
		if c := b.UpdatedAt.Compare(a.UpdatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.Tenant, b.Tenant)
	})
	return out, nil
}

// MemoryEdit is a change to one memory; nil fields keep their value.
type MemoryEdit struct {
	Text       *string
	Category   *Category
	Importance *float64
}

// UpdateMemory changes a categorized memory of the session (a fact, an
// episode, a core or system memory): its text, category or importance.
// Setting the text or the importance counts as a touch (decay restarts).
// The conversation record (messages, replies, summaries) cannot be edited:
// ErrInvalid. Unknown ids are ErrMemoryNotFound. The change is written by
// the background worker, like every unit.
func (s *Store) UpdateMemory(tenant, sessionID, unitID string, e MemoryEdit) (Unit, error) {
	var text string
	if e.Text != nil {
		if text = sanitize.Text(*e.Text, maxMemoryBytes); text == "" {
			return Unit{}, fmt.Errorf("%w: empty memory text", ErrInvalid)
		}
	}
	if e.Category != nil {
		c, err := ParseCategory(string(*e.Category))
		if err != nil {
			return Unit{}, err
		}
		e.Category = &c
	}
	if e.Importance != nil {
		if v := *e.Importance; math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 100 {
			return Unit{}, fmt.Errorf("%w: importance %v (want 0..100)", ErrInvalid, v)
		}
	}
	sess, err := s.reg.session(tenant, sessionID, false)
	if err != nil {
		return Unit{}, err
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	u := sess.units[unitID]
	if u == nil || !sess.exists || sess.gone.Load() {
		sess.mu.Unlock()
		return Unit{}, fmt.Errorf("%w: %q", ErrMemoryNotFound, unitID)
	}
	if u.Category == "" {
		sess.mu.Unlock()
		return Unit{}, fmt.Errorf("%w: %q is part of the conversation record, not a memory", ErrInvalid, unitID)
	}
	sess.edit(s.tok, u, e, text, s.opts.Clock.Now())
	out := u.clone()
	sess.mu.Unlock()
	s.wk.enqueue(sess)
	return out, nil
}

// edit applies a checked edit (text already sanitized, category
// canonical) to u, a categorized memory of sess. Called with sess.mu held.
func (sess *session) edit(tk *Tokenizer, u *Unit, e MemoryEdit, text string, now time.Time) {
	if e.Category != nil && *e.Category != u.Category {
		c := *e.Category
		// The user's index names documents by category: drop the old one.
		sess.userDel = append(sess.userDel, userDocID(sess, unitRole(u), u.ID))
		u.Category = c
		u.Type = UnitFact
		if c == CategoryEpisode {
			u.Type = UnitEpisode
		}
		if u.Role != "fact" && u.Role != "episode" {
			u.Role = string(c)
		}
	}
	if e.Text != nil && text != u.Content {
		u.Content, u.Tokens, u.bow = text, tk.Count(sess.lastEnc, text), nil
		touch(u, now)
	}
	if e.Importance != nil {
		u.Importance = *e.Importance
		touch(u, now)
	}
	u.UpdatedAt = now
	setReview(u)
	u.persisted, u.indexed = false, false
	sess.unitsChanged()
}
