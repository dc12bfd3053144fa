package memory

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The shared pool seen from outside its API: its events, which clients
// follow (PoolSubscribe; the proxy serves them as server-sent events), and
// the view a request that opts in gets in its stable block (poolContext).
//
// Every write and delete of a tenant's pool is published, after its record
// is written, to the tenant's subscribers whose prefix matches its key, in
// version order. A subscriber has a bounded buffer (Pool.EventBuffer); one
// that falls behind is ended (Lagged) rather than slowing writers, and
// lists the pool again. The pool remembers its newest Pool.EventHistory
// events (keys and versions only), so a subscriber that reconnects after
// version v is replayed what followed, with each put's current entry, or
// told of a gap. In a fleet (Options.SharedLog) the other replicas' writes
// are published when this replica next brings the pool up to date (any
// pool call or a turn that shows the pool); a rebuild from the shared log
// ends every subscriber (Lagged), since what changed is not known event by
// event.

// Pool event types.
const (
	PoolEventPut    = "put"
	PoolEventDelete = "delete"
)

// ErrTooManySubscribers: the store already has Pool.MaxSubscribers event
// subscribers, or the tenant Pool.MaxTenantSubscribers. The proxy answers
// 429.
var ErrTooManySubscribers = errors.New("memory: too many pool event subscribers")

// PoolEvent is one change of a tenant's pool.
type PoolEvent struct {
	// Type is PoolEventPut or PoolEventDelete.
	Type string `json:"type"`
	Key  string `json:"key"`
	// Version is the pool's revision after the change (a put's entry
	// version): it grows with every change of the tenant's pool, so it
	// orders and names events.
	Version uint64 `json:"version"`
	// Entry is the entry a put wrote, nil for a delete. It is shared by
	// every subscriber: read-only.
	Entry *PoolEntry `json:"entry,omitempty"`
	At    time.Time  `json:"at"`
}

// PoolSubscription is one subscriber of a tenant's pool events, from
// PoolSubscribe until Close.
type PoolSubscription struct {
	// Rev is the pool's revision when the subscription began.
	Rev uint64
	// Replay are the events after the version PoolSubscribe was given that
	// the pool remembers, oldest first, puts with their current entry (a
	// put overwritten since is left out: what overwrote it follows).
	Replay []PoolEvent
	// Gap is set when the pool no longer remembers every event after that
	// version: the subscriber should list the pool again.
	Gap bool
	// C delivers the events after Rev, in order. It is closed when the
	// subscription ends: Close, the store closing, or the subscriber
	// falling Pool.EventBuffer events behind (then Lagged reports true).
	C <-chan PoolEvent

	ch     chan PoolEvent
	prefix string
	p      *pool
	s      *Store
	lagged atomic.Bool
	once   sync.Once
}

// Lagged reports whether the subscription ended because the subscriber
// fell behind (or the pool was rebuilt from a fleet's shared log): events
// were lost, and the subscriber should list the pool again.
func (sub *PoolSubscription) Lagged() bool { return sub.lagged.Load() }

// Close ends the subscription; C is closed. Safe to call more than once
// and concurrently with the store's writes.
func (sub *PoolSubscription) Close() {
	sub.p.mu.Lock()
	defer sub.p.mu.Unlock()
	sub.endLocked(false)
}

// endLocked removes the subscription and closes C, once. Called with the
// pool's mu held.
func (sub *PoolSubscription) endLocked(lagged bool) {
	sub.once.Do(func() {
		if lagged {
			sub.lagged.Store(true)
			sub.s.poolEv.lagged.Add(1)
		}
		delete(sub.p.subs, sub)
		sub.s.poolEv.subscribers.Add(-1)
		close(sub.ch)
	})
}

// poolEvents is the store's event state; counters for Stats.
type poolEvents struct {
	subscribers atomic.Int64 // open subscriptions, all tenants
	published   atomic.Int64 // events delivered to subscribers
	lagged      atomic.Int64 // subscriptions ended for falling behind
	refused     atomic.Int64 // PoolSubscribe refused: too many
	ctxTurns    atomic.Int64 // windows whose stable block showed pool entries
	ctxErrors   atomic.Int64 // pool views that failed (the turn went without)
}

// PoolEventStats count the pool's events and context (Stats embeds them).
type PoolEventStats struct {
	PoolSubscribers       int64 // open event subscriptions now
	PoolEventsPublished   int64 // events delivered to subscribers
	PoolSubscribersLagged int64 // subscriptions ended because they fell behind
	PoolSubscribeRefused  int64 // subscriptions refused: too many
	PoolContextTurns      int64 // windows whose stable block showed pool entries
	PoolContextErrors     int64 // pool views that failed: the turn went without them
}

func (e *poolEvents) stats() PoolEventStats {
	return PoolEventStats{PoolSubscribers: e.subscribers.Load(), PoolEventsPublished: e.published.Load(),
		PoolSubscribersLagged: e.lagged.Load(), PoolSubscribeRefused: e.refused.Load(),
		PoolContextTurns: e.ctxTurns.Load(), PoolContextErrors: e.ctxErrors.Load()}
}

// validPoolPrefix checks a prefix of pool keys: "" (every key) or a
// string a key could start with.
func validPoolPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return validPoolString("prefix", prefix, maxPoolKeyBytes, false)
}

// PoolSubscribe subscribes to the events of the tenant's pool whose key
// starts with prefix ("" or PoolPrefixAll: every key). With after > 0 (the last version the
// subscriber saw, e.g. an SSE Last-Event-ID), Replay holds what the pool
// remembers since, and Gap tells whether that is everything. The caller
// must Close the subscription. Errors: ErrInvalid (bad prefix),
// ErrTooManySubscribers, ErrClosed, or loading the pool's log.
func (s *Store) PoolSubscribe(tenant, prefix string, after uint64) (*PoolSubscription, error) {
	if prefix == PoolPrefixAll {
		prefix = ""
	}
	if err := validPoolPrefix(prefix); err != nil {
		return nil, err
	}
	p, err := s.pool(tenant)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if err := s.syncPoolShared(p); err != nil {
		return nil, err
	}
	o := &s.opts.Pool
	if len(p.subs) >= o.MaxTenantSubscribers {
		s.poolEv.refused.Add(1)
		return nil, fmt.Errorf("%w: %d for this tenant", ErrTooManySubscribers, len(p.subs))
	}
	if n := s.poolEv.subscribers.Add(1); n > int64(o.MaxSubscribers) {
		s.poolEv.subscribers.Add(-1)
		s.poolEv.refused.Add(1)
		return nil, fmt.Errorf("%w: %d in all", ErrTooManySubscribers, n-1)
	}
	ch := make(chan PoolEvent, o.EventBuffer)
	sub := &PoolSubscription{Rev: p.rev, C: ch, ch: ch, prefix: prefix, p: p, s: s}
	if after > 0 && after != p.rev {
		sub.Replay, sub.Gap = p.replayLocked(after, prefix)
	}
	if p.subs == nil {
		p.subs = map[*PoolSubscription]struct{}{}
	}
	p.subs[sub] = struct{}{}
	return sub, nil
}

// replayLocked returns the remembered events after version after whose
// key starts with prefix, and whether some were forgotten.
func (p *pool) replayLocked(after uint64, prefix string) ([]PoolEvent, bool) {
	h := p.history
	if after > p.rev || len(h) == 0 || h[0].Version > after+1 {
		return nil, true
	}
	var out []PoolEvent
	for _, ev := range h {
		if ev.Version <= after || !strings.HasPrefix(ev.Key, prefix) {
			continue
		}
		if ev.Type == PoolEventPut {
			cur := p.entries[ev.Key]
			if cur == nil || cur.Version != ev.Version {
				continue // overwritten or deleted since: a later event says so
			}
			e := cur.clone()
			ev.Entry = &e
		}
		out = append(out, ev)
	}
	return out, false
}

// publishLocked remembers a change of the pool and delivers it to the
// matching subscribers; one whose buffer is full is ended (Lagged). e is
// the entry a put wrote (never changed afterwards: the pool replaces
// entries, it does not edit them). Called with p.mu held, after the
// change's record was written.
func (s *Store) publishLocked(p *pool, typ, key string, version uint64, e *PoolEntry, at time.Time) {
	p.history = append(p.history, PoolEvent{Type: typ, Key: key, Version: version, At: at})
	if n := len(p.history) - s.opts.Pool.EventHistory; n > 0 {
		p.history = slices.Delete(p.history, 0, n)
	}
	if len(p.subs) == 0 {
		return
	}
	ev := PoolEvent{Type: typ, Key: key, Version: version, At: at}
	if e != nil {
		c := e.clone()
		ev.Entry = &c // one copy for every subscriber
	}
	for sub := range p.subs {
		if !strings.HasPrefix(key, sub.prefix) {
			continue
		}
		select {
		case sub.ch <- ev:
			s.poolEv.published.Add(1)
		default:
			sub.endLocked(true)
		}
	}
}

// publishRecordLocked publishes a record another replica wrote (taken from
// the fleet's shared log).
func (s *Store) publishRecordLocked(p *pool, r *poolRecord) {
	switch r.K {
	case "put":
		if r.Entry != nil && r.Entry.Key != "" {
			s.publishLocked(p, PoolEventPut, r.Entry.Key, r.Entry.Version, p.entries[r.Entry.Key], r.Entry.UpdatedAt)
		}
	case "del":
		s.publishLocked(p, PoolEventDelete, r.Key, r.Rev, nil, s.opts.Clock.Now())
	}
}

// resetSubsLocked ends every subscriber of the pool as lagged and forgets
// its event history: the pool changed in a way not known event by event.
func (p *pool) resetSubsLocked() {
	p.history = nil
	for sub := range p.subs {
		sub.endLocked(true)
	}
}

// The pool in the context. A request that names a pool prefix
// (TurnRequest.PoolPrefix) gets the tenant's entries under it in its stable
// block (block.go), newest first (by version), as "[SHARED:key] value"
// lines within Pool.ContextTokens: a string value as its text, any other
// JSON compacted, each folded onto one line and cut at maxPoolShownBytes.
// The view is made once per pool revision and prefix and shared (immutable),
// and its fingerprint (keys and versions) is part of the stable block's, so
// the block stays byte for byte the same until the pool under the prefix
// changes.

// PoolPrefixAll is the pool prefix naming every key of the pool.
const PoolPrefixAll = "*"

// Bounds of the pool in the context.
const (
	maxPoolShownBytes = 1000 // one entry's value as shown
	maxPoolViews      = 32   // views cached per tenant pool
	poolBlockHeader   = "## Shared pool (newest first)\n"
)

// poolView is what a prefix shows of a pool at one revision.
type poolView struct {
	rev   uint64
	fp    uint64     // keys and versions of items; 0 for none
	items []poolItem // newest first, at most Pool.ContextMaxEntries
}

type poolItem struct {
	key     string
	version uint64
	seg     string // "[SHARED:key] value\n"
}

// poolSegment renders an entry as a stable block segment.
func poolSegment(e *PoolEntry) string {
	var v string
	if json.Unmarshal(e.Value, &v) != nil {
		v = string(e.Value) // stored compacted
	}
	return "[SHARED:" + sanitizeText(e.Key, maxPoolKeyBytes) + "] " + sanitizeText(v, maxPoolShownBytes) + "\n"
}

// poolContext returns the view of the tenant's pool under prefix
// (PoolPrefixAll: every key); nil when no entry matches.
func (s *Store) poolContext(tenant, prefix string) (*poolView, error) {
	p, err := s.pool(tenant)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := s.syncPoolShared(p); err != nil {
		return nil, err
	}
	if v, ok := p.views[prefix]; ok && v.rev == p.rev {
		return v, nil
	}
	match := prefix
	if prefix == PoolPrefixAll {
		match = ""
	}
	var es []*PoolEntry
	for k, e := range p.entries {
		if strings.HasPrefix(k, match) {
			es = append(es, e)
		}
	}
	slices.SortFunc(es, func(a, b *PoolEntry) int {
		switch {
		case a.Version > b.Version:
			return -1
		case a.Version < b.Version:
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	es = es[:min(len(es), s.opts.Pool.ContextMaxEntries)]
	v := &poolView{rev: p.rev}
	if len(es) > 0 {
		var h maphash.Hash
		h.SetSeed(keySeed)
		for _, e := range es {
			v.items = append(v.items, poolItem{key: e.Key, version: e.Version, seg: poolSegment(e)})
			h.WriteString(e.Key)
			h.WriteByte(0)
			h.WriteString(strconv.FormatUint(e.Version, 10))
			h.WriteByte(0)
		}
		v.fp = h.Sum64() | 1
	}
	if len(p.views) >= maxPoolViews {
		clear(p.views)
	}
	if p.views == nil {
		p.views = map[string]*poolView{}
	}
	p.views[prefix] = v
	if len(v.items) == 0 {
		return nil, nil
	}
	return v, nil
}

// ValidPoolPrefix checks a TurnRequest.PoolPrefix: PoolPrefixAll or a
// non-empty string a pool key could start with (at most 512 bytes of
// UTF-8, no control characters). Errors wrap ErrInvalid.
func ValidPoolPrefix(prefix string) error {
	if prefix == PoolPrefixAll {
		return nil
	}
	return validPoolString("prefix", prefix, maxPoolKeyBytes, false)
}
