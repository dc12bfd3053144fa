package tiers

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/internal/histogram"
	"github.com/kvsidecar/kvsidecar/internal/obs"
)

// Options configure a Store. The zero value is a store with Focus on a CPU
// device, Working and no Archive (Open applies EnsureDefaults and
// Validate).
type Options struct {
	// Dir is the Archive's directory. Empty means no Archive: blocks
	// demoted from Working are dropped and durable puts fail.
	Dir string
	// FS is the Archive's file system. Nil means OSFS.
	FS FS
	// Device backs the Focus tier. Nil means a CPU device sized to the
	// Focus budget, owned and closed by the store.
	Device gpu.Device
	// DisableFocus leaves out the Focus tier: puts land in Working.
	DisableFocus bool
	// Focus, Working and Archive bound the tiers. Zero MaxBytes means
	// 256 MiB, 1 GiB and 16 GiB.
	Focus, Working, Archive Budget
	// Strategy is the eviction policy of Focus and Working, a name
	// NewPolicy accepts. Empty means DefaultStrategy (w-tinylfu). The Archive
	// evicts least recently used blocks when over its disk budget.
	Strategy string
	// PromoteThreshold is the hot score at which an access moves a block
	// one tier up. Zero means 2: about two accesses within a half-life.
	PromoteThreshold float64
	// HotHalfLife is the half-life of hot scores. Zero means one minute.
	HotHalfLife time.Duration
	// Clock tells time. Nil means the system clock.
	Clock clock.Clock
	// ArchiveLevel, MaxBlockBytes and VerifyOnOpen are passed to the
	// Archive; see ArchiveOptions.
	ArchiveLevel  int
	MaxBlockBytes int64
	VerifyOnOpen  bool
	// NoFlushOnClose makes Close drop what only Focus and Working hold
	// instead of writing it to the Archive.
	NoFlushOnClose bool
	// Trace, when set, is told of every Get, Put and Delete after it ran,
	// on the caller's goroutine, to record access traces for hit-rate
	// replay (sidecar serve --kv-trace). It must be safe for concurrent
	// use and quick: Gets wait for it. Nil costs one comparison per call.
	Trace func(TraceEvent)
	// Metrics, when set, shows the promotion and demotion latencies at
	// /metrics: sidecar_kv_promotion_seconds by the tier a block came
	// from, sidecar_kv_demotion_seconds by the tier it left. Nil: they are
	// in Stats only.
	Metrics *obs.Registry
}

// TraceEvent is one access the store served: a Get (hit or miss), a
// successful Put or a Delete.
type TraceEvent struct {
	Op  TraceOp
	Key string
	// Size is the value's size in bytes; 0 for a Get that missed and for
	// a Delete.
	Size int64
	// Tier served a Get; TierNone for a miss, a Put or a Delete.
	Tier Tier
}

// TraceOp says what a TraceEvent did.
type TraceOp byte

// Operations of TraceEvent.
const (
	TraceGet    TraceOp = 'g'
	TracePut    TraceOp = 'p'
	TraceDelete TraceOp = 'd'
)

// EnsureDefaults fills every zero field with its documented default (the
// Focus and Working budgets' included; the Archive's are OpenArchive's) and
// returns o. Open calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	o.Focus.ensureDefaults(256 << 20)
	o.Working.ensureDefaults(1 << 30)
	if o.Strategy == "" {
		o.Strategy = DefaultStrategy
	}
	if o.PromoteThreshold == 0 {
		o.PromoteThreshold = 2
	}
	if o.HotHalfLife == 0 {
		o.HotHalfLife = time.Minute
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *Options) Validate() error {
	if err := o.Focus.validate("focus"); err != nil {
		return err
	}
	if err := o.Working.validate("working"); err != nil {
		return err
	}
	if _, err := NewPolicy(o.Strategy); err != nil {
		return err
	}
	if o.PromoteThreshold < 0 {
		return fmt.Errorf("tiers: negative PromoteThreshold")
	}
	if o.HotHalfLife < 0 {
		return fmt.Errorf("tiers: negative HotHalfLife")
	}
	return nil
}

// PutOptions qualify one Put. The zero value is a cached, not yet durable,
// lossless put.
type PutOptions struct {
	// Durable writes the value through to the Archive, fsynced, before Put
	// returns: it then survives a crash of the process.
	Durable bool
	// Lossy lets the Archive store 16-bit floats quantised to q8.
	Lossy bool
	// Hint feeds the weighted and hybrid strategies.
	Hint Hint
}

// Store is the tiered block store: Focus (device memory), Working (host
// RAM) and Archive (files). A value lives in exactly one of Focus and
// Working, or in neither; the Archive may also hold a copy, which is then
// identical to it. Puts land in the fastest tier with room; a background
// goroutine the store owns demotes blocks from a tier above its soft
// watermark (Focus→Working→Archive) in the order of the tier's policy; an
// access whose hot score reaches the threshold promotes the block one tier
// up if that tier has room under its hard watermark.
//
// Get never waits for demotion or promotion: it takes each tier's lock only
// to look up and record the access. Put, Delete and demotion of one key are
// serialised by a striped lock.
//
// Create a Store with Open and stop it with Close.
type Store struct {
	opts      Options
	focus     *memTier // nil when disabled
	working   *memTier
	archive   *Archive // nil without Dir
	ownDevice gpu.Device
	seed      maphash.Seed

	stripes [256]sync.Mutex
	// moves counts blocks moved between tiers, so a Get that misses
	// everywhere while a block moved can look again.
	moves atomic.Uint64
	// promoteAt is the promotion threshold (float64 bits): Options.
	// PromoteThreshold, then what SetPromoteThreshold sets.
	promoteAt atomic.Uint64

	// promoteLat and demoteLat time moves, by the tier a block left:
	// lookups served from Working or the Archive, demotions from Focus
	// or Working (TierStats.PromotionLatency, DemotionLatency).
	promoteLat, demoteLat [TierArchive + 1]histogram.Histogram

	maintMu sync.Mutex // one maintenance pass at a time
	kick    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
	closed  atomic.Bool
}

// Open opens the store: it opens (and indexes) the Archive under opts.Dir
// when set, and starts the maintenance goroutine.
func Open(opts Options) (*Store, error) {
	return open(opts, true)
}

func open(opts Options, background bool) (*Store, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Store{opts: opts, seed: maphash.MakeSeed(), kick: make(chan struct{}, 1), done: make(chan struct{})}
	s.promoteAt.Store(math.Float64bits(opts.PromoteThreshold))
	if r := opts.Metrics; r != nil {
		// Every series, empty ones too, so rules and dashboards find them.
		for _, t := range []Tier{TierWorking, TierArchive} {
			s.promoteLat[t].ExportTo(r.Histogram(fmt.Sprintf("sidecar_kv_promotion_seconds{tier=%q}", t),
				"Time to serve a lookup from below Focus, by the tier the block came from: read, decoding and checks, and the move up when the block is hot enough.", histogram.Bounds()))
		}
		for _, t := range []Tier{TierFocus, TierWorking} {
			s.demoteLat[t].ExportTo(r.Histogram(fmt.Sprintf("sidecar_kv_demotion_seconds{tier=%q}", t),
				"Time to move a block down one tier, by the tier it left (from Working: compression and a durable write to the Archive).", histogram.Bounds()))
		}
	}
	var err error
	if !opts.DisableFocus {
		dev := opts.Device
		if dev == nil {
			cpu, err := gpu.NewCPU(gpu.CPUOptions{Capacity: opts.Focus.MaxBytes})
			if err != nil {
				return nil, err
			}
			dev, s.ownDevice = cpu, cpu
		}
		if s.focus, err = newMemTier(TierFocus, opts.Focus, deviceBacking{dev}, opts.Strategy, opts.HotHalfLife); err != nil {
			return nil, err
		}
	}
	if s.working, err = newMemTier(TierWorking, opts.Working, hostBacking{}, opts.Strategy, opts.HotHalfLife); err != nil {
		return nil, err
	}
	if opts.Dir != "" {
		s.archive, err = OpenArchive(ArchiveOptions{
			Dir: opts.Dir, FS: opts.FS, Budget: opts.Archive, Level: opts.ArchiveLevel,
			MaxBlockBytes: opts.MaxBlockBytes, VerifyOnOpen: opts.VerifyOnOpen,
			HotHalfLife: opts.HotHalfLife, Clock: opts.Clock,
		})
		if err != nil {
			if s.ownDevice != nil {
				s.ownDevice.Close()
			}
			return nil, err
		}
	}
	if background {
		s.wg.Add(1)
		go s.loop()
	}
	return s, nil
}

func (s *Store) stripe(key string) *sync.Mutex {
	return &s.stripes[maphash.String(s.seed, key)%uint64(len(s.stripes))]
}

func (s *Store) checkKey(key string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("tiers: key of %d bytes, want 1 to %d", len(key), MaxKeyLen)
	}
	return nil
}

// Put stores v under key, replacing any older value in every tier. The
// store owns v afterwards. With o.Durable the value is in the Archive,
// fsynced, when Put returns nil.
func (s *Store) Put(key string, v Value, o PutOptions) error {
	err := s.put(key, v, o)
	if s.opts.Trace != nil && err == nil {
		s.opts.Trace(TraceEvent{Op: TracePut, Key: key, Size: int64(len(v.Data))})
	}
	return err
}

func (s *Store) put(key string, v Value, o PutOptions) error {
	if err := s.checkKey(key); err != nil {
		return fmt.Errorf("tiers: put: %w", err)
	}
	if err := v.Meta.validate(); err != nil {
		return fmt.Errorf("tiers: put: %w", err)
	}
	if o.Durable && s.archive == nil {
		return fmt.Errorf("tiers: put: %w", ErrNoArchive)
	}
	mu := s.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	if o.Durable {
		if err := s.archive.Put(key, v, o.Lossy); err != nil {
			return fmt.Errorf("tiers: put: %w", err)
		}
	} else if s.archive != nil && s.archive.Contains(key) {
		if err := s.archive.Delete(key); err != nil {
			return fmt.Errorf("tiers: put: drop stale archive copy: %w", err)
		}
	}
	if s.focus != nil {
		s.focus.remove(key)
	}
	s.working.remove(key)
	size := int64(len(v.Data))
	placed := false
	for _, t := range []*memTier{s.focus, s.working} {
		if t == nil || !t.fitsEmpty(size, v.Tokens) {
			continue
		}
		s.makeRoom(t, key, size, v.Tokens)
		if _, err := t.insert(key, v, o.Hint, o.Lossy, hotScore{}, false); err != nil {
			if t == s.focus {
				continue // e.g. the device is out of memory: use host RAM
			}
			return fmt.Errorf("tiers: put: %w", err)
		}
		placed = true
		break
	}
	if !placed && !o.Durable {
		if s.archive == nil {
			return fmt.Errorf("tiers: put %d bytes: %w", size, ErrTooLarge)
		}
		if err := s.archive.Put(key, v, o.Lossy); err != nil {
			return fmt.Errorf("tiers: put: %w", err)
		}
	}
	s.kickIfNeeded()
	return nil
}

// Persist writes key's value to the Archive, fsynced, when only Focus or
// Working holds it, so that it survives a crash of the process from then
// on; the value stays where it is. A value the Archive already holds costs
// a map lookup. It returns ErrNotFound when no tier holds key and
// ErrNoArchive without an Archive. A put of a newer value meanwhile is
// serialised with it by the key's stripe: the Archive's copy is always the
// value the memory tier holds (see the package invariants).
func (s *Store) Persist(key string) error {
	return s.persist(key, true)
}

// Stage is Persist without fsyncs (Archive.Stage): from when it returns
// nil the value survives kill -9 of the process, and a power loss once
// SyncArchive ran after it. It is for a caller that answers before the
// disk has the bytes and bounds what it has not staged yet.
func (s *Store) Stage(key string) error {
	return s.persist(key, false)
}

// SyncArchive fsyncs what Stage wrote (Archive.Sync); nothing without an
// Archive.
func (s *Store) SyncArchive() error {
	if s.archive == nil {
		return nil
	}
	return s.archive.Sync()
}

func (s *Store) persist(key string, sync bool) error {
	if err := s.checkKey(key); err != nil {
		return fmt.Errorf("tiers: persist: %w", err)
	}
	if s.archive == nil {
		return fmt.Errorf("tiers: persist: %w", ErrNoArchive)
	}
	mu := s.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	if s.archive.Contains(key) {
		return nil
	}
	for _, t := range []*memTier{s.focus, s.working} {
		if t == nil {
			continue
		}
		e, v, ok, err := t.take(key)
		if err != nil {
			return fmt.Errorf("tiers: persist: %w", err)
		}
		if !ok {
			continue
		}
		put := s.archive.Put
		if !sync {
			put = s.archive.Stage
		}
		if err := put(key, v, e.lossy); err != nil {
			return fmt.Errorf("tiers: persist: %w", err)
		}
		return nil
	}
	return fmt.Errorf("%w: %q", ErrNotFound, key)
}

// Get returns key's value and the tier that served it. The value is shared:
// do not modify it. A corrupt archive block is never served: the error then
// matches durable.ErrCorrupt as well as ErrNotFound.
func (s *Store) Get(key string) (Value, Tier, error) {
	v, t, err := s.get(key)
	if s.opts.Trace != nil {
		s.opts.Trace(TraceEvent{Op: TraceGet, Key: key, Size: int64(len(v.Data)), Tier: t})
	}
	return v, t, err
}

func (s *Store) get(key string) (Value, Tier, error) {
	if err := s.checkKey(key); err != nil {
		return Value{}, TierNone, fmt.Errorf("tiers: get: %w", err)
	}
	now := s.opts.Clock.Now()
	for range 3 {
		gen := s.moves.Load()
		if s.focus != nil {
			v, _, ok, err := s.focus.get(key, now)
			if err != nil {
				return Value{}, TierNone, fmt.Errorf("tiers: get: %w", err)
			}
			if ok {
				return v, TierFocus, nil
			}
		}
		v, hot, ok, _ := s.working.get(key, now)
		if ok {
			if s.focus != nil && hot >= s.PromoteThreshold() {
				s.promote(key)
			}
			s.promoteLat[TierWorking].Observe(s.opts.Clock.Now().Sub(now))
			return v, TierWorking, nil
		}
		if s.archive != nil {
			v, hot, agen, err := s.archive.get(key)
			if err == nil {
				if hot >= s.PromoteThreshold() {
					s.promoteFromArchive(key, v, agen)
				}
				s.promoteLat[TierArchive].Observe(s.opts.Clock.Now().Sub(now))
				return v, TierArchive, nil
			}
			if errors.Is(err, errCorrupt) {
				return Value{}, TierNone, err // "tiers: corrupt block: …", also ErrNotFound
			}
			if !errors.Is(err, ErrNotFound) {
				return Value{}, TierNone, fmt.Errorf("tiers: get %q: %w", key, err)
			}
		}
		if s.moves.Load() == gen {
			break
		}
	}
	return Value{}, TierNone, fmt.Errorf("%w: %q", ErrNotFound, key)
}

// Contains reports whether any tier holds key, in O(1) without I/O.
func (s *Store) Contains(key string) bool {
	if s.focus != nil && s.focus.contains(key) {
		return true
	}
	if s.working.contains(key) {
		return true
	}
	return s.archive != nil && s.archive.Contains(key)
}

// Stat returns key's metadata, its size in bytes and the fastest tier
// holding it, without reading the value.
func (s *Store) Stat(key string) (Meta, int64, Tier, error) {
	for range 3 {
		gen := s.moves.Load()
		if s.focus != nil {
			if m, n, ok := s.focus.stat(key); ok {
				return m, n, TierFocus, nil
			}
		}
		if m, n, ok := s.working.stat(key); ok {
			return m, n, TierWorking, nil
		}
		if s.archive != nil {
			if m, n, ok := s.archive.Stat(key); ok {
				return m, n, TierArchive, nil
			}
		}
		if s.moves.Load() == gen {
			break
		}
	}
	return Meta{}, 0, TierNone, fmt.Errorf("%w: %q", ErrNotFound, key)
}

// Delete removes key from every tier, durably for the Archive. It returns
// ErrNotFound when no tier held it.
func (s *Store) Delete(key string) error {
	if s.opts.Trace != nil {
		defer s.opts.Trace(TraceEvent{Op: TraceDelete, Key: key})
	}
	if err := s.checkKey(key); err != nil {
		return fmt.Errorf("tiers: delete: %w", err)
	}
	mu := s.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	found := s.working.remove(key)
	if s.focus != nil && s.focus.remove(key) {
		found = true
	}
	if s.archive != nil && s.archive.Contains(key) {
		found = true
		if err := s.archive.Delete(key); err != nil {
			return fmt.Errorf("tiers: delete %q: %w", key, err)
		}
	}
	if !found {
		return fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	return nil
}

// Range calls fn for every key with its metadata and fastest tier, until fn
// returns false. It sees a snapshot taken tier by tier: keys put or moved
// meanwhile may be missed or seen twice.
func (s *Store) Range(fn func(key string, m Meta, t Tier) bool) {
	seen := make(map[string]bool)
	for _, t := range []*memTier{s.focus, s.working} {
		if t == nil {
			continue
		}
		for _, k := range t.keys() {
			if seen[k] {
				continue
			}
			m, _, ok := t.stat(k)
			if !ok {
				continue
			}
			seen[k] = true
			if !fn(k, m, t.tier) {
				return
			}
		}
	}
	if s.archive != nil {
		s.archive.Keys(func(k string, m Meta) bool {
			if seen[k] {
				return true
			}
			return fn(k, m, TierArchive)
		})
	}
}

// Stats describes the store.
type Stats struct {
	Strategy string      `json:"strategy"`
	Tiers    []TierStats `json:"tiers"`
	// Tuning is the parameters an AdaptiveTuner moves, as they are now.
	Tuning Tuning `json:"tuning"`
}

// Tuning is what the store's parameters are now (see Tuner).
type Tuning struct {
	// Balance is the recency share of the eviction policy of Focus and
	// Working (Tunable: the recency weight of weighted and hybrid, the
	// admission window's share of w-tinylfu); -1 when the strategy has
	// none (lru, lfu, lru-k).
	Balance float64 `json:"balance"`
	// PromoteThreshold is the hot score that moves a block one tier up.
	PromoteThreshold float64 `json:"promote_threshold"`
	// ArchiveLevel is the zstd level (1 to 4) of new Archive blocks; 0
	// without an Archive.
	ArchiveLevel int `json:"archive_level"`
}

// PromoteThreshold returns the hot score at which an access moves a block
// one tier up.
func (s *Store) PromoteThreshold() float64 { return math.Float64frombits(s.promoteAt.Load()) }

// SetPromoteThreshold changes it (see Options.PromoteThreshold); it must be
// positive.
func (s *Store) SetPromoteThreshold(x float64) error {
	if !(x > 0) || math.IsInf(x, 0) {
		return fmt.Errorf("tiers: promote threshold %v, want > 0", x)
	}
	s.promoteAt.Store(math.Float64bits(x))
	return nil
}

// Balance returns the recency share of the eviction policy of Focus and
// Working; false when the strategy is not Tunable.
func (s *Store) Balance() (float64, bool) { return s.working.balance() }

// SetBalance sets the recency share of the eviction policies of Focus and
// Working; false (nothing changed) when the strategy is not Tunable.
func (s *Store) SetBalance(b float64) bool {
	if s.focus != nil {
		s.focus.setBalance(b)
	}
	return s.working.setBalance(b)
}

// ArchiveLevel returns the zstd level of new Archive blocks, 0 without an
// Archive.
func (s *Store) ArchiveLevel() int {
	if s.archive == nil {
		return 0
	}
	return s.archive.Level()
}

// SetArchiveLevel changes the zstd level (1 to 4) of new Archive blocks.
func (s *Store) SetArchiveLevel(level int) error {
	if s.archive == nil {
		return ErrNoArchive
	}
	return s.archive.SetLevel(level)
}

// Tuning returns the parameters as they are now.
func (s *Store) Tuning() Tuning {
	t := Tuning{Balance: -1, PromoteThreshold: s.PromoteThreshold(), ArchiveLevel: s.ArchiveLevel()}
	if b, ok := s.Balance(); ok {
		t.Balance = b
	}
	return t
}

// Stats returns per-tier usage and counters, fastest tier first.
func (s *Store) Stats() Stats {
	st := Stats{Strategy: s.opts.Strategy, Tuning: s.Tuning()}
	add := func(t Tier, ts TierStats) {
		ts.PromotionLatency, ts.DemotionLatency = s.promoteLat[t].Snapshot(), s.demoteLat[t].Snapshot()
		st.Tiers = append(st.Tiers, ts)
	}
	if s.focus != nil {
		add(TierFocus, s.focus.stats())
	}
	add(TierWorking, s.working.stats())
	if s.archive != nil {
		add(TierArchive, s.archive.Stats())
	}
	return st
}

// Strategy returns the eviction strategy of Focus and Working.
func (s *Store) Strategy() string { return s.opts.Strategy }

// DiskBytes returns the bytes of the archive's block files (0 without an
// archive). With TrimDisk it lets a disk budget shared with other data
// (the session store's) count and trim the archive.
func (s *Store) DiskBytes() int64 {
	if s.archive == nil {
		return 0
	}
	return s.archive.Bytes()
}

// TrimDisk deletes least recently used archive blocks until the archive
// takes at most maxBytes on disk. Blocks also held in Focus or Working stay
// there; those held only in the archive are gone (a later Get misses).
func (s *Store) TrimDisk(maxBytes int64) {
	if s.archive != nil {
		s.archive.TrimTo(maxBytes)
	}
}

// Quarantined reports the archive files quarantined since open.
func (s *Store) Quarantined() []Quarantine {
	if s.archive == nil {
		return nil
	}
	return s.archive.Quarantined()
}

// Close stops the maintenance goroutine and waits for it, writes every
// block only Focus or Working holds to the Archive (unless NoFlushOnClose),
// and releases memory and the device the store created. Callers stop using
// the store before closing it. Close is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.done)
	s.wg.Wait()
	var errs []error
	for _, t := range []*memTier{s.focus, s.working} {
		if t == nil {
			continue
		}
		if s.archive != nil && !s.opts.NoFlushOnClose {
			for _, k := range t.keys() {
				mu := s.stripe(k)
				mu.Lock()
				e, v, ok, err := t.take(k)
				if ok && err == nil && !s.archive.Contains(k) {
					err = s.archive.Put(k, v, e.lossy)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("tiers: close: flush: %w", err))
				}
				mu.Unlock()
			}
		}
		t.clear()
	}
	if s.archive != nil {
		errs = append(errs, s.archive.Close())
	}
	if s.ownDevice != nil {
		errs = append(errs, s.ownDevice.Close())
	}
	return errors.Join(errs...)
}
