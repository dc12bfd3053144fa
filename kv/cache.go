package kv

import (
	"container/heap"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Errors of the package. Classify them with errors.Is.
var (
	// ErrNotFound means no block or blob is stored under the key.
	ErrNotFound = errors.New("kv: not found")
	// ErrTooLarge means a blob exceeds Options.MaxBlobBytes (HTTP 413).
	ErrTooLarge = errors.New("kv: too large")
	// ErrClosed means the cache was closed.
	ErrClosed = errors.New("kv: closed")
)

// Options configure a Cache. The zero value is a memory-only cache with the
// tiers' default budgets and strategy and a one-day TTL (Open applies
// EnsureDefaults and Validate; tiers.Open and tiers.NewTuner those of Store
// and Tuner).
type Options struct {
	// Store configures the tiers: Store.Dir is the Archive's directory
	// (for example DATA_DIR/kv; empty means memory only, and the blob API
	// then refuses writes), Store.Strategy the eviction strategy, budgets,
	// device. Store.Clock is set from Clock when nil.
	Store tiers.Options
	// TTL is how long a cached block lives after its Put. Zero means 24 h.
	// Expired blocks are deleted by a goroutine the Cache owns and are
	// never served, even before it gets to them. Blobs do not expire.
	TTL time.Duration
	// Lossy lets the Archive keep cached fp16/bf16 blocks quantised to q8,
	// halving their size at a small loss of precision. Blobs are never
	// stored lossy.
	Lossy bool
	// MaxBlobBytes caps one blob. Zero means 256 MiB.
	MaxBlobBytes int64
	// Clock tells time. Nil means the system clock.
	Clock clock.Clock
	// Tuner, when set, runs an AdaptiveTuner on the tiers (tiers.Tuner:
	// eviction balance, promotion threshold, Archive zstd level from the
	// live hit rate, latencies and storage pressure), owned by the Cache.
	// Its Clock is set from Clock when nil. Nil: the parameters stay as
	// Store sets them.
	Tuner *tiers.TunerOptions
}

// EnsureDefaults fills every zero field with its documented default (Store's
// and Tuner's Clock with Clock; Tuner is copied, not written through) and
// returns o. Open calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.TTL == 0 {
		o.TTL = 24 * time.Hour
	}
	if o.MaxBlobBytes == 0 {
		o.MaxBlobBytes = 256 << 20
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	if o.Store.Clock == nil {
		o.Store.Clock = o.Clock
	}
	if o.Tuner != nil && o.Tuner.Clock == nil {
		t := *o.Tuner
		t.Clock = o.Clock
		o.Tuner = &t
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *Options) Validate() error {
	if o.TTL < 0 {
		return fmt.Errorf("kv: negative TTL")
	}
	if o.MaxBlobBytes < 0 {
		return fmt.Errorf("kv: negative MaxBlobBytes")
	}
	return nil
}

// Cache is the session KV cache: blocks keyed by a memory id (a session,
// usually) and the query (the stable prefix) they were computed for, kept
// in the fastest tier that holds them. It also serves the namespaced blob
// API (PutBlob and friends) from the same tiers.
//
// A Cache owns its tiers.Store, one expiry goroutine and, with
// Options.Tuner, an AdaptiveTuner; Close stops them all.
// All methods are safe for concurrent use.
type Cache struct {
	opts  Options
	store *tiers.Store
	tuner *tiers.Tuner // nil without Options.Tuner

	hits, misses atomic.Int64
	amort        amortization

	// mu protects the fields below.
	mu       sync.Mutex
	byMemory map[string]map[uint64]struct{} // memory id → query hashes
	expires  map[string]time.Time           // store key → expiry
	expHeap  expiryHeap
	gens     map[string]uint64 // memory id → invalidations, to drop stale computes
	flights  map[string]*flight
	// landed counts finished flights (incremented under mu, after the
	// value was stored), so a caller whose lookup missed can tell that a
	// flight ended before it took mu and look again.
	landed atomic.Uint64

	kick   chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
}

// Open opens the tiers (indexing the Archive under opts.Store.Dir when
// set), rebuilds the cache's index from what they hold, and starts the
// expiry goroutine.
func Open(opts Options) (*Cache, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	st, err := tiers.Open(opts.Store)
	if err != nil {
		return nil, fmt.Errorf("kv: open: %w", err)
	}
	c := &Cache{
		opts:     opts,
		store:    st,
		byMemory: make(map[string]map[uint64]struct{}),
		expires:  make(map[string]time.Time),
		gens:     make(map[string]uint64),
		flights:  make(map[string]*flight),
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	st.Range(func(key string, m tiers.Meta, _ tiers.Tier) bool {
		id, h, ok := parseCacheKey(key)
		if !ok {
			return true
		}
		created, _, ok := parseAux(m.Aux)
		if !ok {
			return true
		}
		c.indexLocked(key, id, h, created.Add(opts.TTL))
		return true
	})
	if opts.Tuner != nil {
		if c.tuner, err = tiers.NewTuner(st, *opts.Tuner); err != nil {
			st.Close()
			return nil, fmt.Errorf("kv: open: %w", err)
		}
	}
	c.wg.Add(1)
	go c.expiryLoop()
	return c, nil
}

// Tuner returns the cache's AdaptiveTuner, nil without Options.Tuner.
func (c *Cache) Tuner() *tiers.Tuner { return c.tuner }

// Store returns the tiers the cache runs on, for stats and tools.
func (c *Cache) Store() *tiers.Store { return c.store }

// QueryHash is the 64-bit hash of a whole query that keys a block together
// with its memory id: the first 8 bytes of its SHA-256, stable across
// processes and versions.
func QueryHash(query string) uint64 {
	sum := sha256.Sum256([]byte(query))
	return binary.BigEndian.Uint64(sum[:8])
}

// Store keys: 'c' uvarint(len(id)) id hash[8] for cached blocks,
// 'b' uvarint(len(ns)) ns key for blobs.
func cacheKey(memoryID string, h uint64) string {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(memoryID)+8)
	b = append(b, 'c')
	b = binary.AppendUvarint(b, uint64(len(memoryID)))
	b = append(b, memoryID...)
	b = binary.BigEndian.AppendUint64(b, h)
	return string(b)
}

func parseCacheKey(k string) (string, uint64, bool) {
	if len(k) < 1 || k[0] != 'c' {
		return "", 0, false
	}
	n, w := binary.Uvarint([]byte(k[1:min(len(k), 1+binary.MaxVarintLen64)]))
	if w <= 0 || uint64(len(k)) != 1+uint64(w)+n+8 {
		return "", 0, false
	}
	id := k[1+w : 1+w+int(n)]
	return id, binary.BigEndian.Uint64([]byte(k[len(k)-8:])), true
}

// Aux of a cached block: version byte (1), created unix nanos, model id.
func appendAux(dst []byte, created time.Time, modelID string) []byte {
	dst = append(dst, 1)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(created.UnixNano()))
	return append(dst, modelID...)
}

func parseAux(aux []byte) (time.Time, string, bool) {
	if len(aux) < 9 || aux[0] != 1 {
		return time.Time{}, "", false
	}
	return time.Unix(0, int64(binary.LittleEndian.Uint64(aux[1:]))), string(aux[9:]), true
}

func blockToValue(b *Block, created time.Time) tiers.Value {
	data := make([]byte, 0, b.SizeBytes())
	for l := range b.K {
		data = append(data, b.K[l]...)
		data = append(data, b.V[l]...)
	}
	return tiers.Value{
		Meta: tiers.Meta{
			DType:  b.DType,
			Shape:  []int64{int64(len(b.K)), 2, int64(b.KVHeads), int64(b.Tokens), int64(b.HeadDim)},
			Tokens: int64(b.Tokens),
			Aux:    appendAux(nil, created, b.ModelID),
		},
		Data: data,
	}
}

func valueToBlock(v tiers.Value) (*Block, error) {
	_, model, ok := parseAux(v.Aux)
	if !ok || len(v.Shape) != 5 || v.Shape[1] != 2 {
		return nil, fmt.Errorf("%w: stored value is not a KV block", ErrInvalid)
	}
	b := &Block{ModelID: model, DType: v.DType, KVHeads: int(v.Shape[2]), Tokens: int(v.Shape[3]), HeadDim: int(v.Shape[4])}
	layers := v.Shape[0]
	if layers <= 0 || layers > MaxLayers || b.KVHeads <= 0 || b.HeadDim <= 0 || b.Tokens < 0 ||
		b.KVHeads > MaxDim || b.HeadDim > MaxDim || b.Tokens > MaxDim {
		return nil, fmt.Errorf("%w: stored block shape %v", ErrInvalid, v.Shape)
	}
	lb := b.LayerBytes()
	if int64(len(v.Data)) != 2*layers*int64(lb) {
		return nil, fmt.Errorf("%w: stored block of %d bytes for shape %v", ErrInvalid, len(v.Data), v.Shape)
	}
	b.K, b.V = splitLayers(v.Data, int(layers), lb)
	return b, nil
}

// indexLocked records a cached key. The caller holds mu (or owns c alone).
func (c *Cache) indexLocked(key, id string, h uint64, exp time.Time) {
	set, ok := c.byMemory[id]
	if !ok {
		set = make(map[uint64]struct{})
		c.byMemory[id] = set
	}
	set[h] = struct{}{}
	c.expires[key] = exp
	heap.Push(&c.expHeap, expiryItem{at: exp, key: key})
}

func (c *Cache) unindexLocked(key, id string, h uint64) {
	delete(c.expires, key)
	if set, ok := c.byMemory[id]; ok {
		delete(set, h)
		if len(set) == 0 {
			delete(c.byMemory, id)
		}
	}
}

// expired reports whether key is past its TTL.
func (c *Cache) expired(key string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.expires[key]
	return ok && !now.Before(exp)
}

// Get returns the block cached for memoryID and query and the tier that
// served it, or ErrNotFound. The block shares memory with the cache.
func (c *Cache) Get(memoryID, query string) (*Block, tiers.Tier, error) {
	b, t, _, err := c.get(cacheKey(memoryID, QueryHash(query)))
	if err != nil {
		c.misses.Add(1)
		return nil, tiers.TierNone, err
	}
	c.hits.Add(1)
	return b, t, nil
}

func (c *Cache) get(key string) (*Block, tiers.Tier, time.Duration, error) {
	if c.closed.Load() {
		return nil, tiers.TierNone, 0, ErrClosed
	}
	start := time.Now()
	if c.expired(key, c.opts.Clock.Now()) {
		return nil, tiers.TierNone, 0, ErrNotFound
	}
	v, t, err := c.store.Get(key)
	switch {
	case errors.Is(err, durable.ErrCorrupt):
		return nil, tiers.TierNone, 0, fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, tiers.ErrNotFound):
		return nil, tiers.TierNone, 0, ErrNotFound
	case err != nil:
		return nil, tiers.TierNone, 0, fmt.Errorf("kv: get: %w", err)
	}
	b, err := valueToBlock(v)
	if err != nil {
		return nil, tiers.TierNone, 0, fmt.Errorf("kv: get: %w", err)
	}
	return b, t, time.Since(start), nil
}

// Contains reports in O(1), without I/O, whether a live block is cached
// for memoryID and query.
func (c *Cache) Contains(memoryID, query string) bool {
	key := cacheKey(memoryID, QueryHash(query))
	return !c.expired(key, c.opts.Clock.Now()) && c.store.Contains(key)
}

// Put caches b for memoryID and query, replacing any older block, until
// the TTL passes. The cache copies b's tensors; b stays the caller's.
func (c *Cache) Put(memoryID, query string, b *Block) error {
	return c.put(memoryID, QueryHash(query), b, tiers.Hint{})
}

func (c *Cache) put(id string, h uint64, b *Block, hint tiers.Hint) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if err := b.Validate(); err != nil {
		return fmt.Errorf("kv: put: %w", err)
	}
	now := c.opts.Clock.Now()
	key := cacheKey(id, h)
	if err := c.store.Put(key, blockToValue(b, now), tiers.PutOptions{Lossy: c.opts.Lossy, Hint: hint}); err != nil {
		return fmt.Errorf("kv: put: %w", err)
	}
	c.mu.Lock()
	c.indexLocked(key, id, h, now.Add(c.opts.TTL))
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return nil
}

// Invalidate removes every block cached for memoryID, whatever its query.
// A compute for memoryID in flight meanwhile is not cached.
func (c *Cache) Invalidate(memoryID string) error {
	c.mu.Lock()
	c.gens[memoryID]++
	hashes := make([]uint64, 0, len(c.byMemory[memoryID]))
	for h := range c.byMemory[memoryID] {
		hashes = append(hashes, h)
	}
	for _, h := range hashes {
		c.unindexLocked(cacheKey(memoryID, h), memoryID, h)
	}
	c.mu.Unlock()
	var errs []error
	for _, h := range hashes {
		if err := c.store.Delete(cacheKey(memoryID, h)); err != nil && !errors.Is(err, tiers.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kv: invalidate: %w", err)
	}
	return nil
}

// Stats describes the cache.
type Stats struct {
	// Size is the number of cached blocks (blobs not counted).
	Size int `json:"size"`
	// MaxBytes is the byte budget of the memory tiers (Focus + Working).
	MaxBytes int64   `json:"max_bytes"`
	Hits     int64   `json:"hits"`
	Misses   int64   `json:"misses"`
	HitRate  float64 `json:"hit_rate"`
	Strategy string  `json:"strategy"`
	// Tiers has usage and counters per tier, fastest first.
	Tiers []tiers.TierStats `json:"tiers"`
	// Tuning is the tiers' parameters now; Tuner what the AdaptiveTuner
	// did (nil without one).
	Tuning tiers.Tuning      `json:"tuning"`
	Tuner  *tiers.TunerStats `json:"tuner,omitempty"`
}

// Stats returns a snapshot of the cache's counters and tiers.
func (c *Cache) Stats() Stats {
	st := c.store.Stats()
	c.mu.Lock()
	n := len(c.expires)
	c.mu.Unlock()
	s := Stats{Size: n, Hits: c.hits.Load(), Misses: c.misses.Load(), Strategy: st.Strategy, Tiers: st.Tiers, Tuning: st.Tuning}
	if c.tuner != nil {
		ts := c.tuner.Stats()
		s.Tuner = &ts
	}
	for _, t := range st.Tiers {
		if t.Tier != tiers.TierArchive.String() {
			s.MaxBytes += t.MaxBytes
		}
	}
	if s.Hits+s.Misses > 0 {
		s.HitRate = float64(s.Hits) / float64(s.Hits+s.Misses)
	}
	return s
}

// Close stops the expiry goroutine and closes the tiers, which write what
// only memory holds to the Archive. Close is idempotent.
func (c *Cache) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	close(c.done)
	c.wg.Wait()
	if c.tuner != nil {
		c.tuner.Close()
	}
	if err := c.store.Close(); err != nil {
		return fmt.Errorf("kv: close: %w", err)
	}
	return nil
}
