package pool

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

// The pool seen from outside its API: its events, which clients follow
// (Subscribe; the proxy serves them as server-sent events).
//
// Every write and delete of a tenant's pool is published, after its record
// is written, to the tenant's subscribers whose prefix matches its key, in
// version order. A subscriber has a bounded buffer (Options.EventBuffer);
// one that falls behind is ended (Lagged) rather than slowing writers, and
// lists the pool again. The pool remembers its newest Options.EventHistory
// events (keys and versions only), so a subscriber that reconnects after
// version v is replayed what followed, with each put's current entry, or
// told of a gap. In a fleet (Options.Shared) the other replicas' writes are
// published when this replica next brings the pool up to date (any pool
// call or a turn that shows the pool); a rebuild from the shared log ends
// every subscriber (Lagged), since what changed is not known event by
// event.

// Event types.
const (
	EventPut    = "put"
	EventDelete = "delete"
)

// ErrTooManySubscribers: the pools already have Options.MaxSubscribers
// event subscribers, or the tenant Options.MaxTenantSubscribers. The proxy
// answers 429.
var ErrTooManySubscribers = errors.New("memory: too many pool event subscribers")

// Event is one change of a tenant's pool.
type Event struct {
	// Type is EventPut or EventDelete.
	Type string `json:"type"`
	Key  string `json:"key"`
	// Version is the pool's revision after the change (a put's entry
	// version): it grows with every change of the tenant's pool, so it
	// orders and names events.
	Version uint64 `json:"version"`
	// Entry is the entry a put wrote, nil for a delete. It is shared by
	// every subscriber: read-only.
	Entry *Entry    `json:"entry,omitempty"`
	At    time.Time `json:"at"`
}

// Subscription is one subscriber of a tenant's pool events, from Subscribe
// until Close.
type Subscription struct {
	// Rev is the pool's revision when the subscription began.
	Rev uint64
	// Replay are the events after the version Subscribe was given that the
	// pool remembers, oldest first, puts with their current entry (a put
	// overwritten since is left out: what overwrote it follows).
	Replay []Event
	// Gap is set when the pool no longer remembers every event after that
	// version: the subscriber should list the pool again.
	Gap bool
	// C delivers the events after Rev, in order. It is closed when the
	// subscription ends: Close, the pools closing, or the subscriber
	// falling Options.EventBuffer events behind (then Lagged reports true).
	C <-chan Event

	ch     chan Event
	prefix string
	p      *pool
	st     *counters
	lagged atomic.Bool
	once   sync.Once
}

// Lagged reports whether the subscription ended because the subscriber
// fell behind (or the pool was rebuilt from a fleet's shared log): events
// were lost, and the subscriber should list the pool again.
func (sub *Subscription) Lagged() bool { return sub.lagged.Load() }

// Close ends the subscription; C is closed. Safe to call more than once
// and concurrently with the pool's writes.
func (sub *Subscription) Close() {
	sub.p.mu.Lock()
	defer sub.p.mu.Unlock()
	sub.endLocked(false)
}

// endLocked removes the subscription and closes C, once. Called with the
// pool's mu held.
func (sub *Subscription) endLocked(lagged bool) {
	sub.once.Do(func() {
		if lagged {
			sub.lagged.Store(true)
			sub.st.lagged.Add(1)
		}
		delete(sub.p.subs, sub)
		sub.st.subscribers.Add(-1)
		close(sub.ch)
	})
}

// ValidPrefix checks a prefix of keys: a string a key could start with (at
// most 512 bytes of UTF-8, no control characters), or "" (every key) when
// empty is true. Errors wrap memerr.ErrInvalid.
func ValidPrefix(prefix string, empty bool) error {
	if prefix == "" && empty {
		return nil
	}
	return validString("prefix", prefix, maxKeyBytes, false)
}

// Subscribe subscribes to the events of the tenant's pool whose key starts
// with prefix ("": every key). With after > 0 (the last version the
// subscriber saw, e.g. an SSE Last-Event-ID), Replay holds what the pool
// remembers since, and Gap tells whether that is everything. The caller
// must Close the subscription. Errors: ErrInvalid (bad prefix),
// ErrTooManySubscribers, ErrClosed, or loading the pool's log.
func (ps *Pools) Subscribe(tenant, prefix string, after uint64) (*Subscription, error) {
	if err := ValidPrefix(prefix, true); err != nil {
		return nil, err
	}
	p, err := ps.get(tenant)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, memerr.ErrClosed
	}
	if err := ps.syncShared(p); err != nil {
		return nil, err
	}
	o := &ps.o
	if len(p.subs) >= o.MaxTenantSubscribers {
		ps.st.refused.Add(1)
		return nil, fmt.Errorf("%w: %d for this tenant", ErrTooManySubscribers, len(p.subs))
	}
	if n := ps.st.subscribers.Add(1); n > int64(o.MaxSubscribers) {
		ps.st.subscribers.Add(-1)
		ps.st.refused.Add(1)
		return nil, fmt.Errorf("%w: %d in all", ErrTooManySubscribers, n-1)
	}
	ch := make(chan Event, o.EventBuffer)
	sub := &Subscription{Rev: p.rev, C: ch, ch: ch, prefix: prefix, p: p, st: &ps.st}
	if after > 0 && after != p.rev {
		sub.Replay, sub.Gap = p.replayLocked(after, prefix)
	}
	if p.subs == nil {
		p.subs = map[*Subscription]struct{}{}
	}
	p.subs[sub] = struct{}{}
	return sub, nil
}

// replayLocked returns the remembered events after version after whose
// key starts with prefix, and whether some were forgotten.
func (p *pool) replayLocked(after uint64, prefix string) ([]Event, bool) {
	h := p.history
	if after > p.rev || len(h) == 0 || h[0].Version > after+1 {
		return nil, true
	}
	var out []Event
	for _, ev := range h {
		if ev.Version <= after || !strings.HasPrefix(ev.Key, prefix) {
			continue
		}
		if ev.Type == EventPut {
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
func (ps *Pools) publishLocked(p *pool, typ, key string, version uint64, e *Entry, at time.Time) {
	p.history = append(p.history, Event{Type: typ, Key: key, Version: version, At: at})
	if n := len(p.history) - ps.o.EventHistory; n > 0 {
		p.history = slices.Delete(p.history, 0, n)
	}
	if len(p.subs) == 0 {
		return
	}
	ev := Event{Type: typ, Key: key, Version: version, At: at}
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
			ps.st.published.Add(1)
		default:
			sub.endLocked(true)
		}
	}
}

// publishRecordLocked publishes a record another replica wrote (taken from
// the fleet's shared log).
func (ps *Pools) publishRecordLocked(p *pool, r *record) {
	switch r.K {
	case "put":
		if r.Entry != nil && r.Entry.Key != "" {
			ps.publishLocked(p, EventPut, r.Entry.Key, r.Entry.Version, p.entries[r.Entry.Key], r.Entry.UpdatedAt)
		}
	case "del":
		ps.publishLocked(p, EventDelete, r.Key, r.Rev, nil, ps.o.Now())
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
