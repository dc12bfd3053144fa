package respstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/remote"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Remote is the fleet's shared store under the local tiers;
// *remote.Store satisfies it. Values are written through to it in the
// background and read through from it when the local tiers miss.
type Remote interface {
	PutBlob(ctx context.Context, tenant, id string, data, aux []byte) error
	GetBlob(ctx context.Context, tenant, id string) ([]byte, remote.BlobInfo, error)
	StatBlob(ctx context.Context, tenant, id string) (remote.BlobInfo, error)
	DeleteBlob(ctx context.Context, tenant, id string) error
}

// store holds the values: the kv cache (Working in RAM, Archive on disk,
// Focus on a GPU) and, with a Remote, the fleet's store; the index of
// tenants' keys for their quotas; the persister that writes acknowledged
// values to the Archive behind the clients (FsyncBackground).
type store struct {
	cache  *kv.Cache
	ix     *index
	remote Remote
	clock  clock.Clock
	log    *slog.Logger
	sync   bool // FsyncAlways: a SET is answered once its value is on disk
	// readers bounds the GETs in the tiers at once (Options.MaxReaders).
	readers chan struct{}
	seed    maphash.Seed
	// stripes serialise SET, DEL and eviction of one key with the index.
	stripes [256]sync.Mutex

	// mu protects the persister's queue and its byte count.
	mu          sync.Mutex
	cond        *sync.Cond
	queue       []pending
	queued      int64 // bytes acknowledged and not yet on disk
	maxUnsynced int64
	closed      bool

	persisted, persistErrors, remoteErrors, remoteHits atomic.Int64
	// staged is set when a persister wrote a value the syncer has not
	// fsynced yet.
	staged atomic.Bool

	// missMu protects missAt: when a lookup last missed a key, so that the
	// SET that follows (the client computed the value: an engine's
	// prefill) measures the cost of a compute, C_compute.
	missMu              sync.Mutex
	missAt              map[string]time.Time
	computes, computeNs atomic.Int64

	done chan struct{}
	wg   sync.WaitGroup
}

type pending struct {
	bk       string
	size     int64
	tenant   string
	db       int
	key      string
	hasValue bool // with Remote: write it through once persisted
}

func newStore(cache *kv.Cache, ix *index, opts *Options) *store {
	s := &store{cache: cache, ix: ix, remote: opts.Remote, clock: opts.Clock, log: opts.Logger,
		sync: opts.Fsync == FsyncAlways, seed: maphash.MakeSeed(), maxUnsynced: opts.MaxUnsyncedBytes,
		done: make(chan struct{}), missAt: map[string]time.Time{}, readers: make(chan struct{}, opts.MaxReaders)}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// persisters is how many values are written at once: one compresses
// while another waits for the disk.
const persisters = 2

// syncEvery is how often what the persisters staged is fsynced, as Redis's
// appendfsync everysec.
const syncEvery = time.Second

// start launches the persisters, the syncer and the expiry sweeper.
func (s *store) start() {
	s.wg.Add(persisters + 2)
	for range persisters {
		go s.persister()
	}
	go s.syncer()
	go s.sweeper()
}

// syncer fsyncs what the persisters staged, every syncEvery and at close.
func (s *store) syncer() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			s.syncNow()
			return
		case <-time.After(syncEvery):
			s.syncNow()
		}
	}
}

func (s *store) syncNow() {
	if s.staged.Swap(false) {
		if err := s.cache.SyncBlobs(); err != nil {
			s.staged.Store(true)
			s.persistErrors.Add(1)
			s.log.Warn("resp: fsync", "err", err)
		}
	}
}

// close stops the goroutines after the persisters wrote what they hold and
// the syncer fsynced it.
func (s *store) close() {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	close(s.done)
	s.wg.Wait()
}

func (s *store) stripe(bk string) *sync.Mutex {
	return &s.stripes[maphash.String(s.seed, bk)%uint64(len(s.stripes))]
}

func (s *store) nowMs() int64 { return s.clock.Now().UnixMilli() }

// load rebuilds the index from the tiers: every value's tenant, database,
// size and expiry are in its key and header.
func (s *store) load() (n int, err error) {
	now := s.clock.Now()
	s.cache.RangeBlobs(blobNS, func(bk string, m kv.BlobMeta, _ tiers.Tier) bool {
		tn, db, key, ok := parseBlobKey(bk)
		size, exp, aerr := parseAux(m.Aux)
		if !ok || aerr != nil {
			return true
		}
		t := s.ix.tenant(tn)
		s.ix.mu.Lock()
		if _, dup := t.keys[bk]; !dup {
			s.ix.insertLocked(t, bk, SaltOf(key), db, size, exp, now)
			n++
		}
		s.ix.mu.Unlock()
		return true
	})
	return n, nil
}

// errStore wraps a failure of the tiers below.
var errStore = errors.New("respstore: storage")

// set stores value (owned by the store from now on) under t's key. It
// returns once the value is served to every client, and, with
// FsyncAlways, on disk; otherwise the persister writes it to disk behind
// the client, and set waits only while more than MaxUnsyncedBytes are
// acknowledged and not yet there.
func (s *store) set(t *tenant, db int, key, value []byte, expiryMs int64) error {
	p, err := s.put(t, db, key, value, expiryMs)
	if err != nil {
		return err
	}
	if p.size > 0 || p.hasValue {
		s.enqueue(p) // outside the stripe: it may wait for the disk
	}
	return nil
}

func (s *store) put(t *tenant, db int, key, value []byte, expiryMs int64) (pending, error) {
	bk := blobKey(t.name, db, key)
	saltName := SaltOf(string(key))
	mu := s.stripe(bk)
	mu.Lock()
	defer mu.Unlock()
	victims, err := s.ix.reserve(t, bk, saltName, int64(len(value)))
	if err != nil {
		return pending{}, err
	}
	s.evict(victims, mu)
	meta := kv.BlobMeta{DType: planeHint(len(value)), Aux: appendAux(nil, int64(len(value)), expiryMs)}
	if err := s.cache.PutBlobWith(blobNS, bk, meta, value, kv.PutBlobOptions{Cached: !s.sync, Owned: true}); err != nil {
		// The old value may be gone from the tiers too (a put replaces it
		// first): the index must not promise it.
		if !s.cache.ContainsBlob(blobNS, bk) {
			s.ix.remove(t, bk)
		}
		return pending{}, fmt.Errorf("%w: %w", errStore, err)
	}
	s.ix.commit(t, bk, saltName, db, int64(len(value)), expiryMs, s.clock.Now())
	s.computed(bk)
	t.stats.sets.Add(1)
	t.stats.bytesIn.Add(int64(len(value)))
	p := pending{bk: bk, tenant: t.name, db: db, key: string(key), hasValue: s.remote != nil}
	if !s.sync {
		p.size = int64(len(value))
	}
	return p, nil
}

// planeHint tells the Archive to compress a value as 16-bit elements
// split into byte planes (lossless whatever the bytes are; KV caches are
// fp16 or bf16 tensors, whose high bytes compress well).
func planeHint(n int) tiers.DType {
	if n%2 == 0 {
		return tiers.DTypeF16
	}
	return tiers.DTypeNone
}

// evict deletes the index's victims from the tiers. held is the stripe the
// caller holds; a victim under another stripe that is busy (a SET or DEL
// of that key in progress, which updates the index itself) is left alone.
func (s *store) evict(victims []victim, held *sync.Mutex) {
	for _, v := range victims {
		mu := s.stripe(v.bk)
		if mu != held {
			if !mu.TryLock() {
				continue
			}
		}
		if err := s.cache.DeleteBlob(blobNS, v.bk); err != nil && !errors.Is(err, kv.ErrNotFound) {
			s.log.Warn("resp: evict", "err", err)
		}
		if mu != held {
			mu.Unlock()
		}
	}
}

// get returns t's value under key, nil when there is none. The bytes are
// shared with the tiers: read-only. The caller holds a reader slot
// (acquireReader) from before get until it no longer needs a value that
// did not come from a memory tier: such a value is a buffer of its own.
func (s *store) get(t *tenant, db int, key []byte) ([]byte, tiers.Tier, error) {
	bk := blobKey(t.name, db, key)
	expiry, listed := s.ix.lookup(t, bk)
	if listed && expiry != 0 && expiry <= s.nowMs() {
		s.expire(t, bk)
		t.stats.misses.Add(1)
		return nil, tiers.TierNone, nil
	}
	_, data, tier, err := s.cache.LoadBlob(blobNS, bk)
	switch {
	case err == nil:
		t.stats.hits.Add(1)
		t.stats.bytesOut.Add(int64(len(data)))
		return data, tier, nil
	case !errors.Is(err, kv.ErrNotFound):
		return nil, tiers.TierNone, fmt.Errorf("%w: %w", errStore, err)
	}
	if listed {
		s.forget(t, bk)
	}
	if s.remote != nil {
		if data, ok := s.fetchRemote(t, db, key, bk); ok {
			t.stats.hits.Add(1)
			t.stats.bytesOut.Add(int64(len(data)))
			return data, tiers.TierNone, nil
		}
	}
	t.stats.misses.Add(1)
	s.missed(bk)
	return nil, tiers.TierNone, nil
}

// maxMissTimes bounds missAt; computeWindow is the longest miss-to-SET gap
// taken for a compute.
const (
	maxMissTimes  = 8192
	computeWindow = 10 * time.Minute
)

func (s *store) missed(bk string) {
	s.missMu.Lock()
	defer s.missMu.Unlock()
	if len(s.missAt) >= maxMissTimes {
		clear(s.missAt)
	}
	s.missAt[bk] = s.clock.Now()
}

// computed counts a SET of a key a lookup missed shortly before.
func (s *store) computed(bk string) {
	s.missMu.Lock()
	at, ok := s.missAt[bk]
	delete(s.missAt, bk)
	s.missMu.Unlock()
	if d := s.clock.Now().Sub(at); ok && d >= 0 && d < computeWindow {
		s.computes.Add(1)
		s.computeNs.Add(int64(d))
	}
}

// exists reports whether t holds key, without reading its value.
func (s *store) exists(t *tenant, db int, key []byte) bool {
	bk := blobKey(t.name, db, key)
	expiry, listed := s.ix.lookup(t, bk)
	if listed && expiry != 0 && expiry <= s.nowMs() {
		s.expire(t, bk)
		return false
	}
	if s.cache.ContainsBlob(blobNS, bk) {
		return true
	}
	if listed {
		s.forget(t, bk)
	}
	if s.remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := s.remote.StatBlob(ctx, remoteTenant(t.name), remoteID(db, key))
		if err == nil {
			_, exp, aerr := parseAux(info.Aux)
			if aerr == nil && (exp == 0 || exp > s.nowMs()) {
				return true
			}
		}
	}
	s.missed(bk)
	return false
}

// ttl returns key's expiry (0: none) and whether t holds it.
func (s *store) ttl(t *tenant, db int, key []byte) (int64, bool) {
	if !s.exists(t, db, key) {
		return 0, false
	}
	bk := blobKey(t.name, db, key)
	exp, listed := s.ix.lookup(t, bk)
	return exp, listed
}

// del deletes t's key; it reports whether it was there.
func (s *store) del(t *tenant, db int, key []byte) (bool, error) {
	bk := blobKey(t.name, db, key)
	mu := s.stripe(bk)
	mu.Lock()
	defer mu.Unlock()
	listed := s.ix.remove(t, bk)
	err := s.cache.DeleteBlob(blobNS, bk)
	found := err == nil
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		return listed, fmt.Errorf("%w: %w", errStore, err)
	}
	if s.remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rerr := s.remote.DeleteBlob(ctx, remoteTenant(t.name), remoteID(db, key))
		cancel()
		switch {
		case rerr == nil:
			found = true
		case !errors.Is(rerr, remote.ErrNotFound):
			s.remoteErrors.Add(1)
		}
	}
	if found {
		t.stats.deletes.Add(1)
	}
	return found, nil
}

// expire deletes an expired key, unless a SET of it is in progress.
func (s *store) expire(t *tenant, bk string) {
	mu := s.stripe(bk)
	if !mu.TryLock() {
		return
	}
	defer mu.Unlock()
	if exp, ok := s.ix.lookup(t, bk); !ok || exp == 0 || exp > s.nowMs() {
		return
	}
	s.ix.remove(t, bk)
	if err := s.cache.DeleteBlob(blobNS, bk); err != nil && !errors.Is(err, kv.ErrNotFound) {
		s.log.Warn("resp: expire", "err", err)
	}
	t.stats.expired.Add(1)
}

// forget drops an index entry whose value the tiers no longer hold.
func (s *store) forget(t *tenant, bk string) {
	mu := s.stripe(bk)
	if !mu.TryLock() {
		return
	}
	defer mu.Unlock()
	if !s.cache.ContainsBlob(blobNS, bk) && s.ix.remove(t, bk) {
		t.stats.lost.Add(1)
	}
}

// flush deletes every key of t's database db.
func (s *store) flush(t *tenant, db int) error {
	var errs []error
	for _, bk := range s.ix.keysOf(t, db) {
		_, _, key, _ := parseBlobKey(bk)
		if _, err := s.del(t, db, []byte(key)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// enqueue hands a key to the persisters. While more than maxUnsynced
// bytes are acknowledged and not yet written to the file system, it
// waits: that bound is what a kill -9 can lose (a power loss can also lose
// the last syncEvery of what was written).
func (s *store) enqueue(p pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.closed && s.queued > 0 && s.queued+p.size > s.maxUnsynced {
		s.cond.Wait()
	}
	s.queue = append(s.queue, p)
	s.queued += p.size
	s.cond.Broadcast()
}

// persister writes queued values to the Archive (and through to the
// Remote), oldest first, until the store closes; what is queued then is
// written first.
func (s *store) persister() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return
		}
		p := s.queue[0]
		s.queue[0] = pending{}
		s.queue = s.queue[1:]
		s.mu.Unlock()

		if p.size > 0 {
			// Staged: written to the file system without an fsync, so it
			// survives kill -9 from now on; the syncer fsyncs it within
			// syncEvery.
			err := s.cache.StageBlob(blobNS, p.bk)
			switch {
			case err == nil:
				s.persisted.Add(1)
				s.staged.Store(true)
			case errors.Is(err, kv.ErrNotFound):
				// Deleted or evicted meanwhile.
			default:
				s.persistErrors.Add(1)
				s.log.Warn("resp: persist", "err", err)
			}
		}
		if p.hasValue && s.remote != nil {
			s.writeThrough(p)
		}

		s.mu.Lock()
		s.queued -= p.size
		s.cond.Broadcast()
		s.mu.Unlock()
	}
}

// writeThrough copies a value to the Remote.
func (s *store) writeThrough(p pending) {
	meta, data, _, err := s.cache.GetBlob(blobNS, p.bk)
	if err != nil {
		return // deleted meanwhile
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+time.Duration(len(data)>>20)*time.Second)
	defer cancel()
	if err := s.remote.PutBlob(ctx, remoteTenant(p.tenant), remoteID(p.db, []byte(p.key)), data, meta.Aux); err != nil {
		s.remoteErrors.Add(1)
		s.log.Warn("resp: write through to --remote", "err", err)
	}
}

// fetchRemote reads a value the local tiers lack from the Remote and keeps
// it locally (within the tenant's quota).
func (s *store) fetchRemote(t *tenant, db int, key []byte, bk string) ([]byte, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data, info, err := s.remote.GetBlob(ctx, remoteTenant(t.name), remoteID(db, key))
	if err != nil {
		if !errors.Is(err, remote.ErrNotFound) {
			s.remoteErrors.Add(1)
		}
		return nil, false
	}
	size, exp, aerr := parseAux(info.Aux)
	if aerr != nil || size != int64(len(data)) || (exp != 0 && exp <= s.nowMs()) {
		return nil, false
	}
	s.remoteHits.Add(1)
	mu := s.stripe(bk)
	if mu.TryLock() {
		if victims, err := s.ix.reserve(t, bk, SaltOf(string(key)), size); err == nil {
			s.evict(victims, mu)
			meta := kv.BlobMeta{DType: planeHint(len(data)), Aux: info.Aux}
			if s.cache.PutBlobWith(blobNS, bk, meta, data, kv.PutBlobOptions{Cached: true, Owned: true}) == nil {
				s.ix.commit(t, bk, SaltOf(string(key)), db, size, exp, s.clock.Now())
				mu.Unlock()
				s.enqueue(pending{bk: bk, size: size})
				return data, true
			}
		}
		mu.Unlock()
	}
	return data, true
}

// remoteTenant and remoteID name a value in the Remote: plain tokens, the
// key hashed.
func remoteTenant(t string) string { return "resp." + t }

func remoteID(db int, key []byte) string {
	h := sha256.New()
	h.Write([]byte{byte(db)})
	h.Write(key)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// sweeper deletes expired keys once a second.
func (s *store) sweeper() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case <-s.clock.After(time.Second):
		}
		for _, e := range s.ix.expired(s.nowMs()) {
			s.expire(e.tenant, e.bk)
		}
	}
}

// acquireReader takes one of Options.MaxReaders slots; release gives it
// back.
func (s *store) acquireReader() { s.readers <- struct{}{} }
func (s *store) releaseReader() { <-s.readers }

// ownBuffer reports whether a value served from tier is a buffer decoded
// for this read (the Archive, the Remote) rather than a memory tier's.
func ownBuffer(tier tiers.Tier) bool { return tier != tiers.TierFocus && tier != tiers.TierWorking }

// unsynced returns the bytes acknowledged and not yet on disk.
func (s *store) unsynced() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

// drain waits until the persister has written everything queued so far.
func (s *store) drain(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.queue) > 0 || s.queued > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.cond.Wait()
	}
	return nil
}
