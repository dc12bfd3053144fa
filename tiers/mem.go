package tiers

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/internal/histogram"
)

// backing is where a memory tier keeps bytes: host slices (Working) or
// device buffers (Focus).
type backing interface {
	store(data []byte) (memHandle, error)
	// load returns the bytes; the Working tier returns its own slice.
	load(h memHandle) ([]byte, error)
	free(h memHandle)
}

type memHandle struct {
	host []byte
	buf  gpu.Buffer
}

type hostBacking struct{}

func (hostBacking) store(data []byte) (memHandle, error) { return memHandle{host: data}, nil }
func (hostBacking) load(h memHandle) ([]byte, error)     { return h.host, nil }
func (hostBacking) free(memHandle)                       {}

type deviceBacking struct{ dev gpu.Device }

func (d deviceBacking) store(data []byte) (memHandle, error) {
	if len(data) == 0 {
		return memHandle{}, nil
	}
	b, err := d.dev.Alloc(len(data))
	if err != nil {
		return memHandle{}, err
	}
	if err := d.dev.CopyIn(b, data); err != nil {
		_ = d.dev.Free(b)
		return memHandle{}, err
	}
	return memHandle{buf: b}, nil
}

func (d deviceBacking) load(h memHandle) ([]byte, error) {
	out := make([]byte, h.buf.Size)
	if h.buf.Size == 0 {
		return out, nil
	}
	if err := d.dev.CopyOut(out, h.buf); err != nil {
		return nil, err
	}
	return out, nil
}

func (d deviceBacking) free(h memHandle) {
	if h.buf.Size > 0 {
		_ = d.dev.Free(h.buf)
	}
}

// memTier is a tier in memory: Focus or Working. It keeps entries in a map,
// an eviction Policy over their keys, and byte and token usage.
type memTier struct {
	tier     Tier
	budget   Budget
	back     backing
	halfLife time.Duration

	hits, misses, puts, demotions, promotions atomic.Int64

	// mu protects the fields below.
	mu     sync.Mutex
	items  map[string]*memEntry
	pol    Policy
	bytes  int64
	tokens int64
}

type memEntry struct {
	key   string
	meta  Meta
	size  int64
	h     memHandle
	hint  Hint
	lossy bool
	hot   hotScore
	// readers counts loads in progress; a removed entry is freed by the
	// last of them.
	readers int
	removed bool
}

func newMemTier(t Tier, b Budget, back backing, strategy string, halfLife time.Duration) (*memTier, error) {
	pol, err := NewPolicy(strategy)
	if err != nil {
		return nil, err
	}
	return &memTier{tier: t, budget: b, back: back, halfLife: halfLife, items: make(map[string]*memEntry), pol: pol}, nil
}

// get returns the value and its hot score after this access.
func (t *memTier) get(key string, now time.Time) (Value, float64, bool, error) {
	t.mu.Lock()
	e, ok := t.items[key]
	if !ok {
		t.mu.Unlock()
		t.misses.Add(1)
		return Value{}, 0, false, nil
	}
	t.pol.Access(key)
	hot := e.hot.bump(now, t.halfLife)
	data, err := t.loadUnlock(e)
	if err != nil {
		return Value{}, 0, false, fmt.Errorf("%s: load %q: %w", t.tier, key, err)
	}
	t.hits.Add(1)
	return Value{Meta: e.meta, Data: data}, hot, true, nil
}

// loadUnlock loads e's bytes outside t.mu, which the caller holds and
// which is released on return. e stays pinned meanwhile (readers): an
// entry removed during the load is freed by its last reader.
func (t *memTier) loadUnlock(e *memEntry) ([]byte, error) {
	e.readers++
	t.mu.Unlock()
	data, err := t.back.load(e.h)
	t.mu.Lock()
	e.readers--
	if e.removed && e.readers == 0 {
		t.back.free(e.h)
	}
	t.mu.Unlock()
	return data, err
}

func (t *memTier) contains(key string) bool {
	t.mu.Lock()
	_, ok := t.items[key]
	t.mu.Unlock()
	return ok
}

func (t *memTier) stat(key string) (Meta, int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.items[key]; ok {
		return e.meta, e.size, true
	}
	return Meta{}, 0, false
}

// fitsEmpty reports whether a value of this size fits the tier at all.
func (t *memTier) fitsEmpty(size, tokens int64) bool {
	return t.budget.fitsHard(size, tokens)
}

// fits reports whether the value fits under the hard watermark now.
func (t *memTier) fits(size, tokens int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.budget.fitsHard(t.bytes+size, t.tokens+tokens)
}

func (t *memTier) overSoft() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.budget.overSoft(t.bytes, t.tokens)
}

// insert stores v under key, replacing any entry. The caller made room.
// If onlyIfFits, it inserts only when the value fits under the hard
// watermark, and reports whether it did.
func (t *memTier) insert(key string, v Value, hint Hint, lossy bool, hot hotScore, onlyIfFits bool) (bool, error) {
	size := int64(len(v.Data))
	if onlyIfFits && !t.fits(size, v.Tokens) {
		return false, nil
	}
	h, err := t.back.store(v.Data)
	if err != nil {
		return false, fmt.Errorf("%s: store %q: %w", t.tier, key, err)
	}
	e := &memEntry{key: key, meta: v.Meta, size: size, h: h, hint: hint, lossy: lossy, hot: hot}
	t.mu.Lock()
	if onlyIfFits && !t.budget.fitsHard(t.bytes+size, t.tokens+v.Tokens) {
		t.mu.Unlock()
		t.back.free(h)
		return false, nil
	}
	if old, ok := t.items[key]; ok {
		t.removeLocked(old)
	}
	t.items[key] = e
	t.pol.Add(key, hint)
	t.bytes += size
	t.tokens += v.Tokens
	t.mu.Unlock()
	t.puts.Add(1)
	return true, nil
}

func (t *memTier) removeLocked(e *memEntry) {
	delete(t.items, e.key)
	t.pol.Remove(e.key)
	t.bytes -= e.size
	t.tokens -= e.meta.Tokens
	e.removed = true
	if e.readers == 0 {
		t.back.free(e.h)
	}
}

// remove drops key; it reports whether it was there.
func (t *memTier) remove(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.items[key]
	if ok {
		t.removeLocked(e)
	}
	return ok
}

// removeEntry drops e if it is still the entry under its key.
func (t *memTier) removeEntry(e *memEntry) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.items[e.key]; ok && cur == e {
		t.removeLocked(e)
		return true
	}
	return false
}

// balance returns the policy's recency share, false when it is not Tunable.
func (t *memTier) balance() (float64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.pol.(Tunable); ok {
		return p.Balance(), true
	}
	return 0, false
}

// setBalance sets the policy's recency share; false when it is not Tunable.
func (t *memTier) setBalance(b float64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.pol.(Tunable)
	if ok {
		p.SetBalance(b)
	}
	return ok
}

// victim names the policy's next victim.
func (t *memTier) victim() (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pol.Victim()
}

// take returns key's entry and its bytes for demotion, leaving it in place
// (and served) until removeEntry.
func (t *memTier) take(key string) (*memEntry, Value, bool, error) {
	t.mu.Lock()
	e, ok := t.items[key]
	if !ok {
		t.mu.Unlock()
		return nil, Value{}, false, nil
	}
	data, err := t.loadUnlock(e)
	if err != nil {
		return nil, Value{}, false, fmt.Errorf("%s: load %q: %w", t.tier, key, err)
	}
	return e, Value{Meta: e.meta, Data: data}, true, nil
}

func (t *memTier) keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.items))
	for k := range t.items {
		out = append(out, k)
	}
	return out
}

func (t *memTier) usage() (n int, bytes, tokens int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.items), t.bytes, t.tokens
}

func (t *memTier) clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.items {
		t.removeLocked(e)
	}
}

func (t *memTier) stats() TierStats {
	n, b, tok := t.usage()
	return TierStats{
		Tier: t.tier.String(), Entries: n, Bytes: b, MaxBytes: t.budget.MaxBytes,
		Tokens: tok, MaxTokens: t.budget.MaxTokens,
		Hits: t.hits.Load(), Misses: t.misses.Load(), Puts: t.puts.Load(),
		Demotions: t.demotions.Load(), Promotions: t.promotions.Load(),
	}
}

// TierStats describes one tier.
type TierStats struct {
	Tier    string `json:"tier"`
	Entries int    `json:"entries"`
	Bytes   int64  `json:"bytes"`
	// RawBytes is, for the Archive, what its blocks hold before
	// compression (Bytes is their files): 1 − Bytes/RawBytes is the
	// share compression saves. 0 for the memory tiers.
	RawBytes   int64 `json:"raw_bytes,omitempty"`
	MaxBytes   int64 `json:"max_bytes"`
	Tokens     int64 `json:"tokens"`
	MaxTokens  int64 `json:"max_tokens"`
	Hits       int64 `json:"hits"`
	Misses     int64 `json:"misses"`
	Puts       int64 `json:"puts"`
	Demotions  int64 `json:"demotions"`
	Promotions int64 `json:"promotions"`
	// Evictions counts entries dropped for good (archive budget).
	Evictions int64 `json:"evictions"`
	// Quarantined counts archive files that failed their checks.
	Quarantined int64 `json:"quarantined,omitempty"`
	// PromotionLatency times the lookups this tier served from below
	// Focus (Working, Archive): the read, decoding and checks, and the
	// move up when the block is hot enough. Empty for Focus.
	PromotionLatency histogram.Snapshot `json:"-"`
	// DemotionLatency times the blocks moved down from this tier (Focus
	// to Working, Working to the Archive: compression and a durable
	// write). Empty for the Archive, whose blocks are evicted, not moved.
	DemotionLatency histogram.Snapshot `json:"-"`
}
