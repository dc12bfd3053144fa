package pool

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// ErrConflict: a pool write or delete gave an expected version that is not
// the key's current one. The proxy answers 409.
var ErrConflict = errors.New("memory: version conflict")

// ErrKeyNotFound: no pool entry with that key. It also matches
// memerr.ErrNotFound.
var ErrKeyNotFound = memerr.NotFound("memory: pool key not found")

// Entry is one entry of a tenant's shared pool. Values returned by Pools
// are copies; the caller owns them.
type Entry struct {
	Key string `json:"key"`
	// Value is any JSON value, stored compacted.
	Value json.RawMessage `json:"value"`
	// Version is the pool's revision at the entry's last write: it grows on
	// every write of any key of the tenant (deletes included), so a key
	// deleted and written again never shows an old version.
	Version uint64 `json:"version"`
	// Creator and Updater are the session ids of the first and the last
	// writer ("" for writes without a session, e.g. the admin API).
	Creator   string            `json:"creator,omitempty"`
	Updater   string            `json:"updater,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
	Metadata  map[string]string `json:"metadata,omitempty"`
}

func (e *Entry) clone() Entry {
	c := *e
	c.Value = slices.Clone(e.Value)
	c.Metadata = maps.Clone(e.Metadata)
	return c
}

// Write is a write to the pool.
type Write struct {
	// Value is the new value, any JSON value (required).
	Value json.RawMessage `json:"value"`
	// Metadata replaces the entry's metadata (nil: none). At most 64 keys,
	// 16 KiB in all.
	Metadata map[string]string `json:"metadata,omitempty"`
	// ExpectedVersion makes the write conditional: nil writes
	// unconditionally (last writer wins); 0 creates only (the key must not
	// exist); n replaces only version n. A mismatch is ErrConflict.
	ExpectedVersion *uint64 `json:"expected_version,omitempty"`
	// Session is the writing session's id, recorded as creator or updater.
	Session string `json:"session,omitempty"`
}

// Pool limits besides Options.MaxValueBytes and MaxEntries.
const (
	maxKeyBytes  = 512
	maxMetaKeys  = 64
	maxMetaBytes = 16 << 10
	maxSession   = 256
	// DefaultListLimit and MaxListLimit bound List.
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// Options configure Pools. Package memory fills every field from its
// validated Options (memory.PoolOptions for the bounds).
type Options struct {
	// Dir is memory's root folder: a tenant's pool log is
	// Dir/<hash(tenant)>/pool-<hash(tenant)>.log.
	Dir string
	// Journal opens and creates the logs.
	Journal *journal.Journal
	// Shared is a fleet's shared log (nil: none), each call bounded by
	// SharedTimeout and ended when Context is.
	Shared        journal.Shared
	SharedTimeout time.Duration
	// Context is the owner's lifetime; cancelled when it starts closing.
	Context context.Context
	// MaxValueBytes bounds a value, MaxEntries a tenant's entries.
	MaxValueBytes, MaxEntries int
	// ViewMaxEntries bounds the entries a view shows (the newest).
	ViewMaxEntries int
	// MaxSubscribers bounds the subscriptions of all tenants,
	// MaxTenantSubscribers those of one; EventBuffer the events one may
	// have pending; EventHistory the events a pool remembers.
	MaxSubscribers, MaxTenantSubscribers, EventBuffer, EventHistory int
	// Now is the clock.
	Now func() time.Time
	// Logger reports what failed in the background of a call.
	Logger *slog.Logger
}

// Pools are the tenants' pools, loaded on first use. Safe for concurrent
// use.
type Pools struct {
	o Options
	// writer (fixed at New) and writes name this process's writes (see
	// record.W).
	writer string
	writes atomic.Uint64

	// mu protects the fields below.
	mu     sync.Mutex
	pools  map[string]*pool
	closed bool

	st counters
}

type counters struct {
	writes, conflicts                                  atomic.Int64
	pushed, pulled, rebuilds, uploads, sharedConflicts atomic.Int64
	subscribers, published, lagged, refused            atomic.Int64
}

// Stats count the pools' work.
type Stats struct {
	Writes    int64 // puts and deletes written
	Conflicts int64 // writes refused with ErrConflict
	// The shared log of a fleet: records written to it, records taken
	// from it (other replicas'), pools rebuilt from it, pools uploaded to
	// it, and writes that found it moved on.
	SharedPushed, SharedPulled, SharedRebuilds, SharedUploads, SharedConflicts int64
	Subscribers                                                                int64 // open event subscriptions now
	EventsPublished                                                            int64 // events delivered to subscribers
	SubscribersLagged                                                          int64 // subscriptions ended because they fell behind
	SubscribeRefused                                                           int64 // subscriptions refused: too many
}

// Stats returns the counters.
func (ps *Pools) Stats() Stats {
	c := &ps.st
	return Stats{Writes: c.writes.Load(), Conflicts: c.conflicts.Load(),
		SharedPushed: c.pushed.Load(), SharedPulled: c.pulled.Load(), SharedRebuilds: c.rebuilds.Load(),
		SharedUploads: c.uploads.Load(), SharedConflicts: c.sharedConflicts.Load(),
		Subscribers: c.subscribers.Load(), EventsPublished: c.published.Load(),
		SubscribersLagged: c.lagged.Load(), SubscribeRefused: c.refused.Load()}
}

// New returns the pools under o.Dir; nothing is read until a tenant's
// pool is first used.
func New(o Options) *Pools {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Pools{o: o, writer: hex.EncodeToString(b[:]), pools: map[string]*pool{}}
}

type pool struct {
	tenant string
	path   string
	journal.Lazy

	// mu protects the fields below.
	mu      sync.Mutex
	log     *journal.Log
	entries map[string]*Entry
	rev     uint64
	records int // put and del records in the log
	closed  bool
	// sharedN is the length of the pool's shared log (Options.Shared) that
	// entries reflect; -1 when unknown.
	sharedN int64
	// Events and views (events.go, view.go): the subscribers, the newest
	// events (Options.EventHistory, without entries) and the views of
	// prefixes shown in stable blocks.
	subs    map[*Subscription]struct{}
	history []Event
	views   map[string]*View
}

// record is one pool log record (JSON): meta (first), put, del, rev.
type record struct {
	K      string `json:"k"`
	V      int    `json:"v,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	Entry  *Entry `json:"e,omitempty"`
	Key    string `json:"key,omitempty"`
	Rev    uint64 `json:"rev,omitempty"`
	// W names the write (the writing process's random id and a counter),
	// so two replicas that write the same entry at the same position of a
	// fleet's shared log never make byte-identical records: a positioned
	// append that finds an identical record there takes it for its own
	// retry, which would let both compare-and-sets succeed.
	W string `json:"w,omitempty"`
}

// writeID names one write of this process: unique across the replicas of
// a fleet (a random id per Pools) and across its writes.
func (ps *Pools) writeID() string {
	return ps.writer + "-" + strconv.FormatUint(ps.writes.Add(1), 36)
}

// Path is the log of tenant's pool under root.
func Path(root, tenant string) string {
	dir := journal.TenantDir(root, tenant)
	return filepath.Join(dir, "pool-"+filepath.Base(dir)+".log")
}

// get returns the tenant's pool, loading it on first use.
func (ps *Pools) get(tenant string) (*pool, error) {
	ps.mu.Lock()
	closed := ps.closed
	ps.mu.Unlock()
	if closed {
		return nil, memerr.ErrClosed
	}
	return journal.LoadedIn(&ps.mu, &ps.pools, tenant, func() *pool {
		return &pool{tenant: tenant, path: Path(ps.o.Dir, tenant), entries: map[string]*Entry{}, sharedN: -1}
	}, ps.load)
}

func (ps *Pools) load(p *pool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	first, foreign, meta, rejected := true, false, false, 0
	lf, rep, err := ps.o.Journal.Open(p.path, func(b []byte) {
		isFirst := first
		first = false
		var r record
		if foreign || json.Unmarshal(b, &r) != nil {
			rejected++
			return
		}
		if r.K == "meta" {
			if r.Tenant != p.tenant {
				foreign = isFirst
				rejected++
			}
			meta = meta || !foreign
			return
		}
		if !p.apply(&r) {
			rejected++
		}
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if use, err := ps.o.Journal.Settle(lf, rep, rejected, foreign, p.path, "pool"); !use {
		clear(p.entries)
		p.rev, p.records = 0, 0
		return err
	}
	p.log = lf
	if !meta {
		// The meta record was damaged: compaction writes a new one.
		p.records = 2*len(p.entries) + 1025
	}
	if p.records > 2*len(p.entries)+1024 {
		if err := ps.compactLocked(p); err != nil {
			ps.o.Logger.Warn("memory: compact pool log", "err", err)
		}
	}
	return nil
}

// apply applies a put, del or rev record; false for a malformed one.
func (p *pool) apply(r *record) bool {
	switch r.K {
	case "put":
		if r.Entry == nil || r.Entry.Key == "" {
			return false
		}
		e := *r.Entry
		p.entries[e.Key] = &e
		p.rev = max(p.rev, e.Version)
		p.records++
	case "del":
		delete(p.entries, r.Key)
		p.rev = max(p.rev, r.Rev)
		p.records++
	case "rev":
		p.rev = max(p.rev, r.Rev)
	}
	return true
}

// compactLocked rewrites the log with a meta record and the live entries
// only, atomically. On error the old log stays in use.
func (ps *Pools) compactLocked(p *pool) error {
	meta, err := json.Marshal(&record{K: "meta", V: 1, Tenant: p.tenant})
	if err != nil {
		return err
	}
	image := journal.Image(meta)
	image, err = encodeRecord(image, &record{K: "rev", Rev: p.rev})
	for _, k := range slices.Sorted(maps.Keys(p.entries)) {
		if err != nil {
			return err
		}
		image, err = encodeRecord(image, &record{K: "put", Entry: p.entries[k]})
	}
	if err != nil {
		return err
	}
	nl, err := ps.o.Journal.Rewrite(p.log, p.path, image)
	p.log = nl
	if err != nil {
		return err
	}
	p.records = len(p.entries)
	return nil
}

func encodeRecord(dst []byte, r *record) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return dst, fmt.Errorf("memory: encode pool record: %w", err)
	}
	return durable.AppendRecord(dst, b), nil
}

// writeLocked appends one record, creating the log first if needed.
func (ps *Pools) writeLocked(p *pool, r *record) error {
	if p.closed {
		return memerr.ErrClosed
	}
	if r.K != "meta" {
		r.W = ps.writeID()
	}
	framed, err := encodeRecord(nil, r)
	if err != nil {
		return err
	}
	if len(framed) > ps.o.Journal.MaxRecord() {
		return fmt.Errorf("%w: pool record of %d bytes", memerr.ErrInvalid, len(framed))
	}
	meta, err := json.Marshal(&record{K: "meta", V: 1, Tenant: p.tenant})
	if err != nil {
		return err
	}
	if ps.o.Shared != nil {
		ctx, cancel := context.WithTimeout(ps.o.Context, ps.o.SharedTimeout)
		err := ps.shareLocked(ctx, p, meta, framed)
		cancel()
		if err != nil {
			return err
		}
	}
	if p.log == nil {
		if p.log, err = ps.o.Journal.Create(p.path, durable.AppendRecord(nil, meta)); err != nil {
			return err
		}
	}
	if err := p.log.Append(framed); err != nil {
		return err
	}
	p.records++
	ps.st.writes.Add(1)
	return nil
}

// Close ends every subscription and closes every pool's log; later calls
// fail with memerr.ErrClosed.
func (ps *Pools) Close() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.closed = true
	var errs []error
	for _, p := range ps.pools {
		p.mu.Lock()
		p.closed = true
		for sub := range p.subs {
			sub.endLocked(false)
		}
		if p.log != nil {
			errs = append(errs, p.log.Close())
			p.log = nil
		}
		p.mu.Unlock()
	}
	clear(ps.pools)
	return errors.Join(errs...)
}

func validString(what, v string, maxLen int, empty bool) error {
	if (!empty && v == "") || len(v) > maxLen || !utf8.ValidString(v) {
		return fmt.Errorf("%w: pool %s must be 1-%d bytes of UTF-8", memerr.ErrInvalid, what, maxLen)
	}
	for _, r := range v {
		if sanitize.Unsafe(r) {
			return fmt.Errorf("%w: pool %s has a control character", memerr.ErrInvalid, what)
		}
	}
	return nil
}

// Put writes key in the tenant's pool and returns the new entry. With
// w.ExpectedVersion set and not matching it fails with ErrConflict and
// returns the current entry (zero if none). Errors: ErrInvalid (bad key,
// value, metadata or session id, pool full), ErrConflict, ErrClosed, I/O.
func (ps *Pools) Put(tenant, key string, w Write) (Entry, error) {
	if err := validString("key", key, maxKeyBytes, false); err != nil {
		return Entry{}, err
	}
	if err := validString("session", w.Session, maxSession, true); err != nil {
		return Entry{}, err
	}
	if len(w.Value) == 0 || len(w.Value) > ps.o.MaxValueBytes || !json.Valid(w.Value) {
		return Entry{}, fmt.Errorf("%w: pool value must be 1-%d bytes of JSON", memerr.ErrInvalid, ps.o.MaxValueBytes)
	}
	var val bytes.Buffer
	if err := json.Compact(&val, w.Value); err != nil {
		return Entry{}, fmt.Errorf("%w: pool value: %v", memerr.ErrInvalid, err)
	}
	if len(w.Metadata) > maxMetaKeys {
		return Entry{}, fmt.Errorf("%w: pool metadata has more than %d keys", memerr.ErrInvalid, maxMetaKeys)
	}
	mb := 0
	for k, v := range w.Metadata {
		mb += len(k) + len(v)
		if err := validString("metadata key", k, 256, false); err != nil {
			return Entry{}, err
		}
		if !utf8.ValidString(v) {
			return Entry{}, fmt.Errorf("%w: pool metadata value is not UTF-8", memerr.ErrInvalid)
		}
	}
	if mb > maxMetaBytes {
		return Entry{}, fmt.Errorf("%w: pool metadata over %d bytes", memerr.ErrInvalid, maxMetaBytes)
	}
	p, err := ps.get(tenant)
	if err != nil {
		return Entry{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for attempt := 0; ; attempt++ {
		e, err := ps.putLocked(p, key, w, val.Bytes())
		if errors.Is(err, memerr.ErrSharedConflict) && attempt < 3 {
			continue // another replica wrote the pool: decide again on its state
		}
		return e, err
	}
}

func (ps *Pools) putLocked(p *pool, key string, w Write, val []byte) (Entry, error) {
	if err := ps.syncShared(p); err != nil {
		return Entry{}, err
	}
	cur := p.entries[key]
	if w.ExpectedVersion != nil {
		var have uint64
		if cur != nil {
			have = cur.Version
		}
		if have != *w.ExpectedVersion {
			ps.st.conflicts.Add(1)
			var out Entry
			if cur != nil {
				out = cur.clone()
			}
			return out, fmt.Errorf("%w: pool key %q is at version %d, expected %d", ErrConflict, key, have, *w.ExpectedVersion)
		}
	}
	if cur == nil && len(p.entries) >= ps.o.MaxEntries {
		return Entry{}, fmt.Errorf("%w: pool full (%d entries)", memerr.ErrInvalid, len(p.entries))
	}
	now := ps.o.Now()
	e := &Entry{Key: key, Value: val, Version: p.rev + 1, Creator: w.Session, Updater: w.Session,
		CreatedAt: now, UpdatedAt: now, Metadata: maps.Clone(w.Metadata)}
	if len(e.Metadata) == 0 {
		e.Metadata = nil
	}
	if cur != nil {
		e.Creator, e.CreatedAt = cur.Creator, cur.CreatedAt
	}
	if err := ps.writeLocked(p, &record{K: "put", Entry: e}); err != nil {
		return Entry{}, err
	}
	p.rev++
	p.entries[key] = e
	ps.publishLocked(p, EventPut, key, e.Version, e, now)
	return e.clone(), nil
}

// Get returns the entry for key; ErrKeyNotFound when there is none.
func (ps *Pools) Get(tenant, key string) (Entry, error) {
	p, err := ps.get(tenant)
	if err != nil {
		return Entry{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := ps.syncShared(p); err != nil {
		return Entry{}, err
	}
	e := p.entries[key]
	if e == nil {
		return Entry{}, fmt.Errorf("%w: %q", ErrKeyNotFound, key)
	}
	return e.clone(), nil
}

// List returns the tenant's entries whose key starts with prefix ("":
// all), sorted by key, at most limit (≤ 0: DefaultListLimit; capped at
// MaxListLimit). Never nil.
func (ps *Pools) List(tenant, prefix string, limit int) ([]Entry, error) {
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, MaxListLimit)
	p, err := ps.get(tenant)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := ps.syncShared(p); err != nil {
		return nil, err
	}
	var keys []string
	for k := range p.entries {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := make([]Entry, 0, min(len(keys), limit))
	for _, k := range keys[:min(len(keys), limit)] {
		out = append(out, p.entries[k].clone())
	}
	return out, nil
}

// Delete deletes key. expectedVersion 0 deletes unconditionally; otherwise
// the key must be at that version (ErrConflict). A missing key is
// ErrKeyNotFound.
func (ps *Pools) Delete(tenant, key string, expectedVersion uint64) error {
	p, err := ps.get(tenant)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for attempt := 0; ; attempt++ {
		err := ps.deleteLocked(p, key, expectedVersion)
		if errors.Is(err, memerr.ErrSharedConflict) && attempt < 3 {
			continue
		}
		return err
	}
}

func (ps *Pools) deleteLocked(p *pool, key string, expectedVersion uint64) error {
	if err := ps.syncShared(p); err != nil {
		return err
	}
	cur := p.entries[key]
	if cur == nil {
		return fmt.Errorf("%w: %q", ErrKeyNotFound, key)
	}
	if expectedVersion != 0 && cur.Version != expectedVersion {
		ps.st.conflicts.Add(1)
		return fmt.Errorf("%w: pool key %q is at version %d, expected %d", ErrConflict, key, cur.Version, expectedVersion)
	}
	if err := ps.writeLocked(p, &record{K: "del", Key: key, Rev: p.rev + 1}); err != nil {
		return err
	}
	p.rev++
	delete(p.entries, key)
	ps.publishLocked(p, EventDelete, key, p.rev, nil, ps.o.Now())
	return nil
}
