package reviewlog

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

// Review is one outcome of the memory reviewer, as its decisions log keeps
// it. Only promote, keep and delete changed the fact.
type Review struct {
	FactID  string `json:"fact_id"`
	Session string `json:"session"`
	// Decision is one of memory's Review… constants.
	Decision string `json:"decision"`
	// Trigger is "promote" (importance reached PromoteAt) or "demote"
	// (importance fell below DemoteBelow).
	Trigger string    `json:"trigger"`
	Rounds  int       `json:"rounds"`
	At      time.Time `json:"at"`
	// Reason is the model's reason, or why nothing was applied.
	Reason string `json:"reason"`
}

// Options configure Logs.
type Options struct {
	// Dir is memory's root folder.
	Dir string
	// Journal opens and creates the logs.
	Journal *journal.Journal
	// Size is how many decisions a scope's log keeps (> 0).
	Size int
}

// Logs are the decisions logs, loaded on first use. Safe for concurrent
// use.
type Logs struct {
	o Options
	// mu protects the fields below.
	mu     sync.Mutex
	logs   map[string]*scopeLog // by tenant "\x00" user
	closed bool
}

// New returns the logs under o.Dir.
func New(o Options) *Logs { return &Logs{o: o} }

// scopeLog is one tenant and user's decisions log.
type scopeLog struct {
	tenant, user, path string
	journal.Lazy

	// mu protects the fields below.
	mu      sync.Mutex
	log     *journal.Log // nil until the first decision is written
	entries []Review     // oldest first, at most Options.Size
	records int          // decision records in the file
	closed  bool
}

type record struct {
	K      string  `json:"k"` // "meta" or "review"
	V      int     `json:"v,omitempty"`
	Tenant string  `json:"tenant,omitempty"`
	User   string  `json:"user,omitempty"`
	Review *Review `json:"review,omitempty"`
}

func logPath(root, tenant, user string) string {
	h := sha256.Sum256([]byte("review\x00" + tenant + "\x00" + user))
	return filepath.Join(journal.TenantDir(root, tenant), "users", hex.EncodeToString(h[:16])+".rev")
}

// get returns the scope's loaded log.
func (ls *Logs) get(tenant, user string) (*scopeLog, error) {
	ls.mu.Lock()
	closed := ls.closed
	ls.mu.Unlock()
	if closed {
		return nil, memerr.ErrClosed
	}
	return journal.LoadedIn(&ls.mu, &ls.logs, tenant+"\x00"+user, func() *scopeLog {
		return &scopeLog{tenant: tenant, user: user, path: logPath(ls.o.Dir, tenant, user)}
	}, ls.load)
}

func (ls *Logs) load(l *scopeLog) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	first, foreign, rejected := true, false, 0
	lf, rep, err := ls.o.Journal.Open(l.path, func(b []byte) {
		isFirst := first
		first = false
		var r record
		if foreign || json.Unmarshal(b, &r) != nil {
			rejected++
			return
		}
		switch {
		case r.K == "meta":
			foreign = isFirst && (r.Tenant != l.tenant || r.User != l.user)
		case r.K == "review" && r.Review != nil:
			l.add(*r.Review, ls.o.Size)
			l.records++
		default:
			rejected++
		}
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if use, err := ls.o.Journal.Settle(lf, rep, rejected, foreign, l.path, "review"); !use {
		l.entries, l.records = nil, 0
		return err
	}
	l.log = lf
	return nil
}

// add appends a decision, keeping the newest max.
func (l *scopeLog) add(r Review, max int) {
	l.entries = append(l.entries, r)
	if over := len(l.entries) - max; over > 0 {
		l.entries = append(l.entries[:0], l.entries[over:]...)
	}
}

// Append writes a decision to its scope's log (tenant, user).
func (ls *Logs) Append(tenant, user string, rev Review) error {
	l, err := ls.get(tenant, user)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return memerr.ErrClosed
	}
	b, err := json.Marshal(&record{K: "review", Review: &rev})
	if err != nil {
		return fmt.Errorf("memory: encode review: %w", err)
	}
	if l.log == nil {
		meta, err := json.Marshal(&record{K: "meta", V: 1, Tenant: l.tenant, User: l.user})
		if err != nil {
			return err
		}
		if l.log, err = ls.o.Journal.Create(l.path, durable.AppendRecord(nil, meta)); err != nil {
			return err
		}
	}
	if err := l.log.Append(durable.AppendRecord(nil, b)); err != nil {
		return err
	}
	l.add(rev, ls.o.Size)
	l.records++
	if l.records > 2*ls.o.Size {
		return ls.compactLocked(l)
	}
	return nil
}

// compactLocked rewrites the log with the decisions kept, atomically; on
// error the old log stays in use.
func (ls *Logs) compactLocked(l *scopeLog) error {
	meta, err := json.Marshal(&record{K: "meta", V: 1, Tenant: l.tenant, User: l.user})
	if err != nil {
		return err
	}
	image := journal.Image(meta)
	for i := range l.entries {
		b, err := json.Marshal(&record{K: "review", Review: &l.entries[i]})
		if err != nil {
			return err
		}
		image = durable.AppendRecord(image, b)
	}
	nl, err := ls.o.Journal.Rewrite(l.log, l.path, image)
	l.log = nl
	if err != nil {
		return err
	}
	l.records = len(l.entries)
	return nil
}

// List returns the scope's decisions, newest first, at most limit (≤ 0:
// Options.Size), as a copy. A scope without decisions has none.
func (ls *Logs) List(tenant, user string, limit int) ([]Review, error) {
	if limit <= 0 {
		limit = ls.o.Size
	}
	l, err := ls.get(tenant, user)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Review, 0, min(limit, len(l.entries)))
	for i := len(l.entries) - 1; i >= 0 && len(out) < limit; i-- {
		out = append(out, l.entries[i])
	}
	return out, nil
}

// Each calls fn with each decision the scope's log keeps, oldest first,
// holding the log's lock (fn must not call Logs).
func (ls *Logs) Each(tenant, user string, fn func(*Review)) error {
	l, err := ls.get(tenant, user)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.entries {
		fn(&l.entries[i])
	}
	return nil
}

// Close closes every log; later calls fail with memerr.ErrClosed.
func (ls *Logs) Close() error {
	ls.mu.Lock()
	ls.closed = true
	logs := make([]*scopeLog, 0, len(ls.logs))
	for _, l := range ls.logs {
		logs = append(logs, l)
	}
	ls.mu.Unlock()
	var errs []error
	for _, l := range logs {
		l.mu.Lock()
		l.closed = true
		if l.log != nil {
			errs = append(errs, l.log.Close())
			l.log = nil
		}
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}
