package memory

import (
	"github.com/kvsidecar/kvsidecar/memory/internal/pool"
)

// The shared pool is a small key-value store per tenant that every session
// of the tenant can read and write (shared notes, task state, hand-offs
// between agents), with events clients follow and a view a request can
// opt in to. Package memory/internal/pool owns it (its doc states the
// invariants); these are its names as memory's callers know them.

// Pool types (package pool's).
type (
	// PoolEntry is one entry of a tenant's shared pool.
	PoolEntry = pool.Entry
	// PoolWrite is a write to the pool.
	PoolWrite = pool.Write
	// PoolEvent is one change of a tenant's pool.
	PoolEvent = pool.Event
	// PoolSubscription is one subscriber of a tenant's pool events, from
	// PoolSubscribe until Close.
	PoolSubscription = pool.Subscription
)

// Pool errors (package pool's).
var (
	// ErrConflict: a pool write or delete gave an expected version that is
	// not the key's current one. The proxy answers 409.
	ErrConflict = pool.ErrConflict
	// ErrKeyNotFound: no pool entry with that key. It also matches
	// ErrNotFound.
	ErrKeyNotFound = pool.ErrKeyNotFound
	// ErrTooManySubscribers: the store already has Pool.MaxSubscribers
	// event subscribers, or the tenant Pool.MaxTenantSubscribers. The proxy
	// answers 429.
	ErrTooManySubscribers = pool.ErrTooManySubscribers
)

// Pool constants.
const (
	// PoolEventPut and PoolEventDelete are PoolEvent types.
	PoolEventPut    = pool.EventPut
	PoolEventDelete = pool.EventDelete
	// DefaultPoolListLimit and MaxPoolListLimit bound PoolList.
	DefaultPoolListLimit = pool.DefaultListLimit
	MaxPoolListLimit     = pool.MaxListLimit
	// PoolPrefixAll is the pool prefix naming every key of the pool.
	PoolPrefixAll = "*"
)

// poolBlockHeader heads the pool's entries in a stable block (block.go).
const poolBlockHeader = "## Shared pool (newest first)\n"

// PoolEventStats count the pool's events and context (Stats embeds them).
type PoolEventStats struct {
	PoolSubscribers       int64 // open event subscriptions now
	PoolEventsPublished   int64 // events delivered to subscribers
	PoolSubscribersLagged int64 // subscriptions ended because they fell behind
	PoolSubscribeRefused  int64 // subscriptions refused: too many
	PoolContextTurns      int64 // windows whose stable block showed pool entries
	PoolContextErrors     int64 // pool views that failed: the turn went without them
}

func newPools(s *Store) *pool.Pools {
	o := &s.opts
	return pool.New(pool.Options{Dir: o.Dir, Journal: s.j, Shared: o.SharedLog, SharedTimeout: o.SharedLogTimeout,
		Context: s.ctx, MaxValueBytes: o.Pool.MaxValueBytes, MaxEntries: o.Pool.MaxEntries,
		ViewMaxEntries: o.Pool.ContextMaxEntries, MaxSubscribers: o.Pool.MaxSubscribers,
		MaxTenantSubscribers: o.Pool.MaxTenantSubscribers, EventBuffer: o.Pool.EventBuffer,
		EventHistory: o.Pool.EventHistory, Now: o.Clock.Now, Logger: o.Logger})
}

// poolPath is the log of tenant's pool under root.
func poolPath(root, tenant string) string { return pool.Path(root, tenant) }

// PoolPut writes key in the tenant's pool and returns the new entry. With
// w.ExpectedVersion set and not matching it fails with ErrConflict and
// returns the current entry (zero if none). Errors: ErrInvalid (bad key,
// value, metadata or session id, pool full), ErrConflict, ErrClosed, I/O.
func (s *Store) PoolPut(tenant, key string, w PoolWrite) (PoolEntry, error) {
	return s.pools.Put(tenant, key, w)
}

// PoolGet returns the entry for key; ErrKeyNotFound when there is none.
func (s *Store) PoolGet(tenant, key string) (PoolEntry, error) { return s.pools.Get(tenant, key) }

// PoolList returns the tenant's entries whose key starts with prefix ("":
// all), sorted by key, at most limit (≤ 0: DefaultPoolListLimit; capped at
// MaxPoolListLimit). Never nil.
func (s *Store) PoolList(tenant, prefix string, limit int) ([]PoolEntry, error) {
	return s.pools.List(tenant, prefix, limit)
}

// PoolDelete deletes key. expectedVersion 0 deletes unconditionally;
// otherwise the key must be at that version (ErrConflict). A missing key is
// ErrKeyNotFound.
func (s *Store) PoolDelete(tenant, key string, expectedVersion uint64) error {
	return s.pools.Delete(tenant, key, expectedVersion)
}

// PoolSubscribe subscribes to the events of the tenant's pool whose key
// starts with prefix ("" or PoolPrefixAll: every key). With after > 0 (the
// last version the subscriber saw, e.g. an SSE Last-Event-ID), Replay holds
// what the pool remembers since, and Gap tells whether that is everything.
// The caller must Close the subscription. Errors: ErrInvalid (bad prefix),
// ErrTooManySubscribers, ErrClosed, or loading the pool's log.
func (s *Store) PoolSubscribe(tenant, prefix string, after uint64) (*PoolSubscription, error) {
	if prefix == PoolPrefixAll {
		prefix = ""
	}
	return s.pools.Subscribe(tenant, prefix, after)
}

// ValidPoolPrefix checks a TurnRequest.PoolPrefix: PoolPrefixAll or a
// non-empty string a pool key could start with (at most 512 bytes of
// UTF-8, no control characters). Errors wrap ErrInvalid.
func ValidPoolPrefix(prefix string) error {
	if prefix == PoolPrefixAll {
		return nil
	}
	return pool.ValidPrefix(prefix, false)
}

// poolView returns the view of the tenant's pool under a request's prefix
// (PoolPrefixAll: every key) for its stable block; nil when none.
func (s *Store) poolView(tenant, prefix string) (*pool.View, error) {
	if prefix == PoolPrefixAll {
		prefix = ""
	}
	return s.pools.View(tenant, prefix)
}
