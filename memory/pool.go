package memory

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

// The shared pool is a small key-value store per tenant that every session
// of the tenant can read and write (shared notes, task state, hand-offs
// between agents). Each tenant's pool is one append-only log,
// Dir/<hash(tenant)>/pool-<hash(tenant)>.log, framed and checksummed like
// the session logs (a torn tail is cut on open); a write is acknowledged
// only once its record is written (and fsynced under FsyncAlways). The log
// is compacted on open when it holds more than twice the live entries.

// ErrConflict: a pool write or delete gave an expected version that is not
// the key's current one. The proxy answers 409.
var ErrConflict = errors.New("memory: version conflict")

// ErrKeyNotFound: no pool entry with that key. It also matches ErrNotFound.
var ErrKeyNotFound error = &notFoundError{"memory: pool key not found"}

// PoolEntry is one entry of a tenant's shared pool. Values returned by the
// Pool methods are copies; the caller owns them.
type PoolEntry struct {
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

func (e *PoolEntry) clone() PoolEntry {
	c := *e
	c.Value = slices.Clone(e.Value)
	c.Metadata = maps.Clone(e.Metadata)
	return c
}

// PoolWrite is a write to the pool.
type PoolWrite struct {
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

// Pool limits besides Options.PoolMaxValueBytes and PoolMaxEntries.
const (
	maxPoolKeyBytes  = 512
	maxPoolMetaKeys  = 64
	maxPoolMetaBytes = 16 << 10
	maxPoolSession   = 256
	// DefaultPoolListLimit and MaxPoolListLimit bound PoolList.
	DefaultPoolListLimit = 100
	MaxPoolListLimit     = 1000
)

type pool struct {
	tenant string
	path   string
	lazyLoad

	// mu protects the fields below.
	mu      sync.Mutex
	log     *journal.Log
	entries map[string]*PoolEntry
	rev     uint64
	records int // put and del records in the log
	closed  bool
	// sharedN is the length of the pool's shared log (Options.SharedLog)
	// that entries reflect; -1 when unknown.
	sharedN int64
	// Events and context (poolevents.go): the subscribers, the newest
	// events (Pool.EventHistory, without entries) and the views of
	// prefixes shown in stable blocks.
	subs    map[*PoolSubscription]struct{}
	history []PoolEvent
	views   map[string]*poolView
}

// poolRecord is one pool log record (JSON): meta (first), put, del, rev.
type poolRecord struct {
	K      string     `json:"k"`
	V      int        `json:"v,omitempty"`
	Tenant string     `json:"tenant,omitempty"`
	Entry  *PoolEntry `json:"e,omitempty"`
	Key    string     `json:"key,omitempty"`
	Rev    uint64     `json:"rev,omitempty"`
	// W names the write (the writing store's random id and a counter), so
	// two replicas that write the same entry at the same position of a
	// fleet's shared log never make byte-identical records: a positioned
	// append that finds an identical record there takes it for its own
	// retry, which would let both compare-and-sets succeed.
	W string `json:"w,omitempty"`
}

// writeID names one write of this store: unique across the replicas of a
// fleet (a random id per Store) and across its writes.
func (s *Store) writeID() string {
	return s.writer + "-" + strconv.FormatUint(s.writes.Add(1), 36)
}

func newWriterID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func poolPath(root, tenant string) string {
	th := sha256.Sum256([]byte("tenant\x00" + tenant))
	t := hex.EncodeToString(th[:12])
	return filepath.Join(root, t, "pool-"+t+".log")
}

// pool returns the tenant's pool, loading it on first use.
func (s *Store) pool(tenant string) (*pool, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return loadedIn(&s.poolMu, &s.pools, tenant, func() *pool {
		return &pool{tenant: tenant, path: poolPath(s.opts.Dir, tenant), entries: map[string]*PoolEntry{}, sharedN: -1}
	}, s.loadPool)
}

// lazyLoad is the load-once state of a value kept in a map (a pool, a
// review log).
type lazyLoad struct {
	once sync.Once
	err  error
}

func (l *lazyLoad) lazy() *lazyLoad { return l }

// loadedIn returns (*m)[key], made by mk when missing, after load ran once
// for it (outside mu, which protects the map). A load that failed takes it
// out of the map, so that the next call tries again, and returns its error.
func loadedIn[T interface{ lazy() *lazyLoad }](mu *sync.Mutex, m *map[string]T, key string, mk func() T, load func(T) error) (T, error) {
	mu.Lock()
	v, ok := (*m)[key]
	if !ok {
		if *m == nil {
			*m = map[string]T{}
		}
		v = mk()
		(*m)[key] = v
	}
	mu.Unlock()
	l := v.lazy()
	l.once.Do(func() { l.err = load(v) })
	if l.err != nil {
		mu.Lock()
		if cur, ok := (*m)[key]; ok && cur.lazy() == l {
			delete(*m, key)
		}
		mu.Unlock()
		var zero T
		return zero, l.err
	}
	return v, nil
}

func (s *Store) loadPool(p *pool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	first, foreign, meta, rejected := true, false, false, 0
	lf, rep, err := s.j.Open(p.path, func(b []byte) {
		isFirst := first
		first = false
		var r poolRecord
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
		if !applyPoolRecord(p, &r) {
			rejected++
		}
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if use, err := s.j.Settle(lf, rep, rejected, foreign, p.path, "pool"); !use {
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
		if err := s.compactPoolLocked(p); err != nil {
			s.opts.Logger.Warn("memory: compact pool log", "err", err)
		}
	}
	return nil
}

// applyPoolRecord applies a put, del or rev record; false for a malformed
// one.
func applyPoolRecord(p *pool, r *poolRecord) bool {
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

// compactPoolLocked rewrites the log with a meta record and the live
// entries only, atomically (durable.WriteFile). On error the old log stays
// in use.
func (s *Store) compactPoolLocked(p *pool) error {
	meta, err := json.Marshal(&poolRecord{K: "meta", V: 1, Tenant: p.tenant})
	if err != nil {
		return err
	}
	image := journal.Image(meta)
	image, err = encodePoolRecord(image, &poolRecord{K: "rev", Rev: p.rev})
	for _, k := range slices.Sorted(maps.Keys(p.entries)) {
		if err != nil {
			return err
		}
		image, err = encodePoolRecord(image, &poolRecord{K: "put", Entry: p.entries[k]})
	}
	if err != nil {
		return err
	}
	nl, err := s.j.Rewrite(p.log, p.path, image)
	p.log = nl
	if err != nil {
		return err
	}
	p.records = len(p.entries)
	return nil
}

func encodePoolRecord(dst []byte, r *poolRecord) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return dst, fmt.Errorf("memory: encode pool record: %w", err)
	}
	return appendRecord(dst, b), nil
}

// writeLocked appends one record, creating the log first if needed.
func (s *Store) writePoolLocked(p *pool, r *poolRecord) error {
	if p.closed {
		return ErrClosed
	}
	if r.K != "meta" {
		r.W = s.writeID()
	}
	framed, err := encodePoolRecord(nil, r)
	if err != nil {
		return err
	}
	if len(framed) > s.opts.MaxRecordBytes {
		return fmt.Errorf("%w: pool record of %d bytes", ErrInvalid, len(framed))
	}
	meta, err := json.Marshal(&poolRecord{K: "meta", V: 1, Tenant: p.tenant})
	if err != nil {
		return err
	}
	if s.opts.SharedLog != nil {
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.SharedLogTimeout)
		err := s.sharePoolLocked(ctx, p, meta, framed)
		cancel()
		if err != nil {
			return err
		}
	}
	if p.log == nil {
		if p.log, err = s.j.Create(p.path, appendRecord(nil, meta)); err != nil {
			return err
		}
	}
	if err := p.log.Append(framed); err != nil {
		return err
	}
	p.records++
	s.stats.poolWrites.Add(1)
	return nil
}

func (s *Store) closePools() error {
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	var errs []error
	for _, p := range s.pools {
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
	clear(s.pools)
	return errors.Join(errs...)
}

func validPoolString(what, v string, maxLen int, empty bool) error {
	if (!empty && v == "") || len(v) > maxLen || !utf8.ValidString(v) {
		return fmt.Errorf("%w: pool %s must be 1-%d bytes of UTF-8", ErrInvalid, what, maxLen)
	}
	for _, r := range v {
		if unsafeRune(r) {
			return fmt.Errorf("%w: pool %s has a control character", ErrInvalid, what)
		}
	}
	return nil
}

// PoolPut writes key in the tenant's pool and returns the new entry. With
// w.ExpectedVersion set and not matching it fails with ErrConflict and
// returns the current entry (zero if none). Errors: ErrInvalid (bad key,
// value, metadata or session id, pool full), ErrConflict, ErrClosed, I/O.
func (s *Store) PoolPut(tenant, key string, w PoolWrite) (PoolEntry, error) {
	if err := validPoolString("key", key, maxPoolKeyBytes, false); err != nil {
		return PoolEntry{}, err
	}
	if err := validPoolString("session", w.Session, maxPoolSession, true); err != nil {
		return PoolEntry{}, err
	}
	if len(w.Value) == 0 || len(w.Value) > s.opts.Pool.MaxValueBytes || !json.Valid(w.Value) {
		return PoolEntry{}, fmt.Errorf("%w: pool value must be 1-%d bytes of JSON", ErrInvalid, s.opts.Pool.MaxValueBytes)
	}
	var val bytes.Buffer
	if err := json.Compact(&val, w.Value); err != nil {
		return PoolEntry{}, fmt.Errorf("%w: pool value: %v", ErrInvalid, err)
	}
	if len(w.Metadata) > maxPoolMetaKeys {
		return PoolEntry{}, fmt.Errorf("%w: pool metadata has more than %d keys", ErrInvalid, maxPoolMetaKeys)
	}
	mb := 0
	for k, v := range w.Metadata {
		mb += len(k) + len(v)
		if err := validPoolString("metadata key", k, 256, false); err != nil {
			return PoolEntry{}, err
		}
		if !utf8.ValidString(v) {
			return PoolEntry{}, fmt.Errorf("%w: pool metadata value is not UTF-8", ErrInvalid)
		}
	}
	if mb > maxPoolMetaBytes {
		return PoolEntry{}, fmt.Errorf("%w: pool metadata over %d bytes", ErrInvalid, maxPoolMetaBytes)
	}
	p, err := s.pool(tenant)
	if err != nil {
		return PoolEntry{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for attempt := 0; ; attempt++ {
		e, err := s.poolPutLocked(p, key, w, val.Bytes())
		if errors.Is(err, ErrSharedConflict) && attempt < 3 {
			continue // another replica wrote the pool: decide again on its state
		}
		return e, err
	}
}

func (s *Store) poolPutLocked(p *pool, key string, w PoolWrite, val []byte) (PoolEntry, error) {
	if err := s.syncPoolShared(p); err != nil {
		return PoolEntry{}, err
	}
	cur := p.entries[key]
	if w.ExpectedVersion != nil {
		var have uint64
		if cur != nil {
			have = cur.Version
		}
		if have != *w.ExpectedVersion {
			s.stats.poolConflicts.Add(1)
			var out PoolEntry
			if cur != nil {
				out = cur.clone()
			}
			return out, fmt.Errorf("%w: pool key %q is at version %d, expected %d", ErrConflict, key, have, *w.ExpectedVersion)
		}
	}
	if cur == nil && len(p.entries) >= s.opts.Pool.MaxEntries {
		return PoolEntry{}, fmt.Errorf("%w: pool full (%d entries)", ErrInvalid, len(p.entries))
	}
	now := s.opts.Clock.Now()
	e := &PoolEntry{Key: key, Value: val, Version: p.rev + 1, Creator: w.Session, Updater: w.Session,
		CreatedAt: now, UpdatedAt: now, Metadata: maps.Clone(w.Metadata)}
	if len(e.Metadata) == 0 {
		e.Metadata = nil
	}
	if cur != nil {
		e.Creator, e.CreatedAt = cur.Creator, cur.CreatedAt
	}
	if err := s.writePoolLocked(p, &poolRecord{K: "put", Entry: e}); err != nil {
		return PoolEntry{}, err
	}
	p.rev++
	p.entries[key] = e
	s.publishLocked(p, PoolEventPut, key, e.Version, e, now)
	return e.clone(), nil
}

// PoolGet returns the entry for key; ErrKeyNotFound when there is none.
func (s *Store) PoolGet(tenant, key string) (PoolEntry, error) {
	p, err := s.pool(tenant)
	if err != nil {
		return PoolEntry{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := s.syncPoolShared(p); err != nil {
		return PoolEntry{}, err
	}
	e := p.entries[key]
	if e == nil {
		return PoolEntry{}, fmt.Errorf("%w: %q", ErrKeyNotFound, key)
	}
	return e.clone(), nil
}

// PoolList returns the tenant's entries whose key starts with prefix ("":
// all), sorted by key, at most limit (≤ 0: DefaultPoolListLimit; capped at
// MaxPoolListLimit). Never nil.
func (s *Store) PoolList(tenant, prefix string, limit int) ([]PoolEntry, error) {
	if limit <= 0 {
		limit = DefaultPoolListLimit
	}
	limit = min(limit, MaxPoolListLimit)
	p, err := s.pool(tenant)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := s.syncPoolShared(p); err != nil {
		return nil, err
	}
	var keys []string
	for k := range p.entries {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := make([]PoolEntry, 0, min(len(keys), limit))
	for _, k := range keys[:min(len(keys), limit)] {
		out = append(out, p.entries[k].clone())
	}
	return out, nil
}

// PoolDelete deletes key. expectedVersion 0 deletes unconditionally;
// otherwise the key must be at that version (ErrConflict). A missing key is
// ErrKeyNotFound.
func (s *Store) PoolDelete(tenant, key string, expectedVersion uint64) error {
	p, err := s.pool(tenant)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for attempt := 0; ; attempt++ {
		err := s.poolDeleteLocked(p, key, expectedVersion)
		if errors.Is(err, ErrSharedConflict) && attempt < 3 {
			continue
		}
		return err
	}
}

func (s *Store) poolDeleteLocked(p *pool, key string, expectedVersion uint64) error {
	if err := s.syncPoolShared(p); err != nil {
		return err
	}
	cur := p.entries[key]
	if cur == nil {
		return fmt.Errorf("%w: %q", ErrKeyNotFound, key)
	}
	if expectedVersion != 0 && cur.Version != expectedVersion {
		s.stats.poolConflicts.Add(1)
		return fmt.Errorf("%w: pool key %q is at version %d, expected %d", ErrConflict, key, cur.Version, expectedVersion)
	}
	if err := s.writePoolLocked(p, &poolRecord{K: "del", Key: key, Rev: p.rev + 1}); err != nil {
		return err
	}
	p.rev++
	delete(p.entries, key)
	s.publishLocked(p, PoolEventDelete, key, p.rev, nil, s.opts.Clock.Now())
	return nil
}

// syncPoolShared brings the pool up to date with a fleet's shared log,
// when there is one. Called with p.mu held.
func (s *Store) syncPoolShared(p *pool) error {
	if s.opts.SharedLog == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.SharedLogTimeout)
	defer cancel()
	return s.syncPoolLocked(ctx, p)
}
