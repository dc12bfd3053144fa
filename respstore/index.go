package respstore

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrQuota marks a value larger than its tenant's (or its salt's) whole
// quota: no eviction can make room for it.
var ErrQuota = errors.New("respstore: value exceeds the quota")

// index keeps, per tenant, the keys the store holds with their sizes,
// expiries and recency, so that each tenant's quota (and each salt's,
// within it) is enforced by evicting that tenant's least recently used
// keys, never another's. The tiers below keep their own budgets and
// order; the index only decides what a tenant must give up.
//
// The index may list a key the tiers lost (the Archive's disk budget
// deleted it, or its file failed its checks): a lookup that misses
// forgets it (forget), and the scrape's scan forgets what it no longer
// finds (reconcile).
type index struct {
	// mu protects the fields below and every tenant's and salt's fields
	// except their atomic counters.
	mu      sync.Mutex
	tenants map[string]*tenant
	quota   func(tenant string) int64 // 0: none
	saltCap int64                     // per (tenant, salt); 0: none
}

type tenant struct {
	name  string
	bytes int64
	keys  map[string]*entry // by blob key
	lru   list.List         // *entry, most recently used first
	salts map[string]*salt
	stats tenantStats
}

type salt struct {
	bytes int64
	lru   list.List // *entry of this salt
}

type entry struct {
	bk       string
	tenant   *tenant
	salt     *salt
	saltName string
	db       int
	size     int64
	expiryMs int64 // 0: none
	at       time.Time
	elem     *list.Element
	saltElem *list.Element
}

// tenantStats are a tenant's counters, updated without the index lock.
type tenantStats struct {
	hits, misses, sets, deletes  atomic.Int64
	evictions, evictedBytes      atomic.Int64
	bytesIn, bytesOut            atomic.Int64
	quotaRefusals, expired, lost atomic.Int64
}

func newIndex(quota func(string) int64, saltCap int64) *index {
	return &index{tenants: map[string]*tenant{}, quota: quota, saltCap: saltCap}
}

// tenant returns name's state, created on first use.
func (ix *index) tenant(name string) *tenant {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.tenantLocked(name)
}

func (ix *index) tenantLocked(name string) *tenant {
	t, ok := ix.tenants[name]
	if !ok {
		t = &tenant{name: name, keys: map[string]*entry{}, salts: map[string]*salt{}}
		ix.tenants[name] = t
	}
	return t
}

// victim is a key reserve evicted from the index; the caller deletes it
// from the tiers.
type victim struct {
	bk   string
	size int64
}

// reserve makes room within t's quota (and saltName's cap) for a value of
// size bytes under bk, which replaces what bk holds now. It evicts t's
// least recently used keys (of the same salt, for the salt's cap) from
// the index and returns them; bk itself is never one. ErrQuota when size
// alone is over a quota.
func (ix *index) reserve(t *tenant, bk, saltName string, size int64) ([]victim, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	quota := ix.quota(t.name)
	if quota > 0 && size > quota {
		t.stats.quotaRefusals.Add(1)
		return nil, fmt.Errorf("%w: %d bytes, the tenant's quota is %d", ErrQuota, size, quota)
	}
	if ix.saltCap > 0 && saltName != "" && size > ix.saltCap {
		t.stats.quotaRefusals.Add(1)
		return nil, fmt.Errorf("%w: %d bytes, a salt's quota is %d", ErrQuota, size, ix.saltCap)
	}
	var old int64
	if e, ok := t.keys[bk]; ok {
		old = e.size
	}
	var out []victim
	evict := func(e *entry) {
		ix.removeLocked(e)
		t.stats.evictions.Add(1)
		t.stats.evictedBytes.Add(e.size)
		out = append(out, victim{bk: e.bk, size: e.size})
	}
	if ix.saltCap > 0 && saltName != "" {
		if s := t.salts[saltName]; s != nil {
			for el := s.lru.Back(); el != nil && s.bytes-sameSalt(t, bk, saltName, old)+size > ix.saltCap; {
				e := el.Value.(*entry)
				el = el.Prev()
				if e.bk != bk {
					evict(e)
				}
			}
		}
	}
	if quota > 0 {
		for el := t.lru.Back(); el != nil && t.bytes-old+size > quota; {
			e := el.Value.(*entry)
			el = el.Prev()
			if e.bk != bk {
				evict(e)
			}
		}
	}
	return out, nil
}

// sameSalt is old when bk's current entry is of saltName (its bytes are
// replaced), else 0.
func sameSalt(t *tenant, bk, saltName string, old int64) int64 {
	if e, ok := t.keys[bk]; ok && e.saltName == saltName {
		return old
	}
	return 0
}

// commit records bk's new value, most recently used.
func (ix *index) commit(t *tenant, bk, saltName string, db int, size, expiryMs int64, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if e, ok := t.keys[bk]; ok {
		ix.removeLocked(e)
	}
	ix.insertLocked(t, bk, saltName, db, size, expiryMs, now)
}

func (ix *index) insertLocked(t *tenant, bk, saltName string, db int, size, expiryMs int64, now time.Time) {
	e := &entry{bk: bk, tenant: t, saltName: saltName, db: db, size: size, expiryMs: expiryMs, at: now}
	e.elem = t.lru.PushFront(e)
	t.keys[bk] = e
	t.bytes += size
	if saltName != "" {
		s := t.salts[saltName]
		if s == nil {
			s = &salt{}
			t.salts[saltName] = s
		}
		e.salt = s
		e.saltElem = s.lru.PushFront(e)
		s.bytes += size
	}
}

func (ix *index) removeLocked(e *entry) {
	t := e.tenant
	if cur, ok := t.keys[e.bk]; !ok || cur != e {
		return
	}
	delete(t.keys, e.bk)
	t.lru.Remove(e.elem)
	t.bytes -= e.size
	if s := e.salt; s != nil {
		s.lru.Remove(e.saltElem)
		s.bytes -= e.size
		if s.lru.Len() == 0 {
			delete(t.salts, e.saltName)
		}
	}
}

// lookup returns bk's expiry and whether the index lists it, and marks it
// most recently used.
func (ix *index) lookup(t *tenant, bk string) (expiryMs int64, ok bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	e, ok := t.keys[bk]
	if !ok {
		return 0, false
	}
	t.lru.MoveToFront(e.elem)
	if e.saltElem != nil {
		e.salt.lru.MoveToFront(e.saltElem)
	}
	return e.expiryMs, true
}

// remove drops bk from the index; it reports whether it was listed.
func (ix *index) remove(t *tenant, bk string) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	e, ok := t.keys[bk]
	if ok {
		ix.removeLocked(e)
	}
	return ok
}

// keysOf returns the blob keys of t's database db.
func (ix *index) keysOf(t *tenant, db int) []string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var out []string
	for bk, e := range t.keys {
		if e.db == db {
			out = append(out, bk)
		}
	}
	return out
}

// count returns how many keys t's database db holds, and how many of them
// expire.
func (ix *index) count(t *tenant, db int) (keys, expires int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, e := range t.keys {
		if e.db == db {
			keys++
			if e.expiryMs != 0 {
				expires++
			}
		}
	}
	return keys, expires
}

// expired returns every key whose expiry is at or before nowMs.
func (ix *index) expired(nowMs int64) []*entry {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var out []*entry
	for _, t := range ix.tenants {
		for _, e := range t.keys {
			if e.expiryMs != 0 && e.expiryMs <= nowMs {
				out = append(out, e)
			}
		}
	}
	return out
}

// usage is one tenant's figures for Stats.
func (ix *index) usage(t *tenant) (keys int, bytes int64, salts int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(t.keys), t.bytes, len(t.salts)
}

// all returns every tenant.
func (ix *index) all() []*tenant {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make([]*tenant, 0, len(ix.tenants))
	for _, t := range ix.tenants {
		out = append(out, t)
	}
	return out
}

// reconcile forgets every key committed before since that seen does not
// list: the tiers lost it.
func (ix *index) reconcile(since time.Time, seen map[string]bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, t := range ix.tenants {
		for bk, e := range t.keys {
			if !seen[bk] && e.at.Before(since) {
				ix.removeLocked(e)
				t.stats.lost.Add(1)
			}
		}
	}
}
