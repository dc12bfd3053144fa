package tiers

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// ArchiveOptions configure an Archive. Only Dir is required; every other
// zero value is a documented default (OpenArchive applies EnsureDefaults and
// Validate).
type ArchiveOptions struct {
	// Dir is the archive's directory; block files go to Dir/blocks and
	// corrupt ones to Dir/quarantine. Required.
	Dir string
	// FS is the file system. Nil means OSFS.
	FS FS
	// Budget bounds the bytes of block files on disk. Zero MaxBytes means
	// 16 GiB. Above Soft, Trim deletes least recently used blocks; a Put
	// that would cross Hard deletes them first.
	Budget Budget
	// Level is the zstd level, 1 (fastest) to 4 (best). Zero means 1: on
	// KV data higher levels cost several times the CPU for a few percent.
	Level int
	// MaxBlockBytes caps one block's decoded size. Zero means 1 GiB.
	MaxBlockBytes int64
	// VerifyOnOpen reads every file in full when opening and quarantines
	// those that fail their CRC. Off, only headers are read on open and
	// payloads are checked on every read, which is when it matters.
	VerifyOnOpen bool
	// HotHalfLife is the half-life of the hot score reported by Get. Zero
	// means one minute.
	HotHalfLife time.Duration
	// Clock tells time for hot scores. Nil means the system clock.
	Clock clock.Clock
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. OpenArchive calls it; calling it twice changes nothing.
func (o *ArchiveOptions) EnsureDefaults() *ArchiveOptions {
	if o.FS == nil {
		o.FS = OSFS{}
	}
	o.Budget.ensureDefaults(16 << 30)
	if o.Level == 0 {
		o.Level = 1
	}
	if o.MaxBlockBytes == 0 {
		o.MaxBlockBytes = 1 << 30
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
func (o *ArchiveOptions) Validate() error {
	if o.Dir == "" {
		return errors.New("archive: Dir is required")
	}
	if err := o.Budget.validate("archive"); err != nil {
		return err
	}
	if o.Level < 1 || o.Level > 4 {
		return fmt.Errorf("archive: zstd level %d, want 1 to 4", o.Level)
	}
	if o.MaxBlockBytes < 0 {
		return fmt.Errorf("archive: negative MaxBlockBytes")
	}
	return nil
}

// Quarantine reports one file moved out of service.
type Quarantine struct {
	// File is the file's path in quarantine, or its original path when
	// it could not be moved (it is then skipped, never served).
	File   string    `json:"file"`
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
}

// Archive keeps blocks as files, one per key, named by the SHA-256 of the
// key under 256 shard folders. It is safe for concurrent use; writes of one
// key are serialised, reads take no file lock. Open it with OpenArchive.
type Archive struct {
	opts          ArchiveOptions
	fs            FS
	level         atomic.Int32 // zstd.EncoderLevel of new blocks
	levelN        atomic.Int32 // the same as ArchiveOptions.Level (1 to 4)
	blocksDir     string
	quarantineDir string
	seq           atomic.Uint64

	hits, misses, puts, evictions, quarantined atomic.Int64

	stripes [64]sync.Mutex // serialise writes per key hash

	// mu protects the fields below.
	mu      sync.Mutex
	idx     map[string]*archEntry
	lru     *list.List // of *archEntry; front is most recent
	bytes   int64      // file bytes
	raw     int64      // the blocks' bytes before compression
	tokens  int64
	shards  map[string]bool // shard folders known to exist
	staged  map[string]bool // files Staged and not yet Synced
	reports []Quarantine
	closed  bool
}

type archEntry struct {
	key      string
	name     string // path of the file
	meta     Meta
	rawLen   int64
	fileSize int64
	hot      hotScore
	elem     *list.Element
	gen      uint64 // distinguishes successive blocks of one key
}

// Level returns the zstd level (1 to 4) new blocks are written with.
func (a *Archive) Level() int { return int(a.levelN.Load()) }

// SetLevel changes the zstd level (1 fastest to 4 best; see
// ArchiveOptions.Level) of the blocks written from now on; blocks already
// written keep theirs (every level reads back alike).
func (a *Archive) SetLevel(level int) error {
	if level < 1 || level > 4 {
		return fmt.Errorf("archive: zstd level %d, want 1 to 4", level)
	}
	a.level.Store(int32(encoderLevel(level)))
	a.levelN.Store(int32(level))
	return nil
}

// OpenArchive opens or creates the archive in opts.Dir and rebuilds its
// index by scanning the block files. Leftover temporary files are removed;
// files that fail their checks are moved to quarantine and reported by
// Quarantined. Only an unusable directory is an error.
func OpenArchive(opts ArchiveOptions) (*Archive, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	a := &Archive{
		opts:          opts,
		fs:            opts.FS,
		blocksDir:     path.Join(opts.Dir, "blocks"),
		quarantineDir: path.Join(opts.Dir, "quarantine"),
		idx:           make(map[string]*archEntry),
		lru:           list.New(),
		shards:        make(map[string]bool),
	}
	a.level.Store(int32(encoderLevel(opts.Level)))
	a.levelN.Store(int32(opts.Level))
	for _, d := range []string{a.blocksDir, a.quarantineDir} {
		if err := a.fs.MkdirAll(d); err != nil {
			return nil, fmt.Errorf("archive: create %s: %w", d, err)
		}
	}
	if err := a.fs.SyncDir(opts.Dir); err != nil {
		return nil, fmt.Errorf("archive: sync %s: %w", opts.Dir, err)
	}
	if err := a.scan(); err != nil {
		return nil, err
	}
	return a, nil
}

func fileID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

func (a *Archive) paths(key string) (shard, name string) {
	id := fileID(key)
	shard = path.Join(a.blocksDir, id[:2])
	return shard, path.Join(shard, id+".kva")
}

func (a *Archive) stripe(key string) *sync.Mutex {
	sum := crc32.Checksum([]byte(key), castagnoli)
	return &a.stripes[sum%uint32(len(a.stripes))]
}

// Put writes v under key durably: when Put returns nil the block survives a
// crash. The file is written with durable.WriteAtomicFS (temporary name,
// fsync, rename over the old block, folder fsync). lossy allows q8
// quantisation of 16-bit float data.
func (a *Archive) Put(key string, v Value, lossy bool) error {
	return a.put(key, v, lossy, true)
}

// Stage is Put without its fsyncs (durable.WriteAtomicFSNoSync): the
// block is in place, checked by its CRC on every read, and survives kill -9
// of the process; it survives a power loss once Sync ran after it.
func (a *Archive) Stage(key string, v Value, lossy bool) error {
	return a.put(key, v, lossy, false)
}

// Sync fsyncs every block Staged since the last Sync and the folders
// holding them; what it returns nil for survives a power loss.
func (a *Archive) Sync() error {
	a.mu.Lock()
	staged := a.staged
	a.staged = nil
	a.mu.Unlock()
	var errs []error
	dirs := map[string]bool{}
	for name := range staged {
		dirs[path.Dir(name)] = true
		f, err := a.fs.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // replaced or deleted since
		}
		if err == nil {
			err = f.Sync()
			f.Close()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("archive: sync %s: %w", path.Base(name), err))
		}
	}
	for d := range dirs {
		if err := a.fs.SyncDir(d); err != nil {
			errs = append(errs, fmt.Errorf("archive: sync: %w", err))
		}
	}
	if len(errs) > 0 {
		// Stage them again: the next Sync tries once more.
		a.mu.Lock()
		for name := range staged {
			if a.staged == nil {
				a.staged = map[string]bool{}
			}
			a.staged[name] = true
		}
		a.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (a *Archive) put(key string, v Value, lossy, sync bool) error {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("archive: put: key of %d bytes, want 1 to %d", len(key), MaxKeyLen)
	}
	if err := v.Meta.validate(); err != nil {
		return fmt.Errorf("archive: put: %w", err)
	}
	if int64(len(v.Data)) > a.opts.MaxBlockBytes {
		return fmt.Errorf("archive: put %d bytes: %w", len(v.Data), ErrTooLarge)
	}
	payload, codec := encodePayload(getBuf(len(v.Data)/2+64), v.Data, v.DType, lossy, zstd.EncoderLevel(a.level.Load()))
	defer putBuf(payload)
	h := &fileHeader{meta: v.Meta, key: key, codec: codec, rawLen: uint64(len(v.Data)), storedLen: uint64(len(payload))}
	header := appendHeader(nil, h)
	size := int64(len(header) + len(payload) + 4)
	if !a.opts.Budget.fitsHard(size, v.Tokens) {
		return fmt.Errorf("archive: put %d bytes over a budget of %d: %w", size, a.opts.Budget.MaxBytes, ErrTooLarge)
	}
	a.makeRoom(key, size, v.Tokens)

	mu := a.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return fmt.Errorf("archive: put: %w", ErrClosed)
	}
	shard, name := a.paths(key)
	if err := a.ensureShard(shard); err != nil {
		return err
	}
	crc := crc32.Update(crc32.Checksum(header, castagnoli), castagnoli, payload)
	write := durable.WriteAtomicFS
	if !sync {
		write = durable.WriteAtomicFSNoSync
	}
	err := write(a.fs, name, func(w io.Writer) error {
		for _, p := range [][]byte{header, payload, binary.LittleEndian.AppendUint32(nil, crc)} {
			if _, err := w.Write(p); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, durable.ErrUnsyncedRename) {
		// The rename may or may not survive a crash; the file itself is
		// whole either way. Index it, since it is what is on disk now.
		a.index(key, name, h, size)
	}
	if err != nil {
		return fmt.Errorf("archive: put: %w", err)
	}
	a.index(key, name, h, size)
	a.puts.Add(1)
	if !sync {
		a.mu.Lock()
		if a.staged == nil {
			a.staged = map[string]bool{}
		}
		a.staged[name] = true
		a.mu.Unlock()
	}
	return nil
}

func (a *Archive) ensureShard(shard string) error {
	a.mu.Lock()
	ok := a.shards[shard]
	a.mu.Unlock()
	if ok {
		return nil
	}
	if err := a.fs.MkdirAll(shard); err != nil {
		return fmt.Errorf("archive: create %s: %w", shard, err)
	}
	if err := a.fs.SyncDir(a.blocksDir); err != nil {
		return fmt.Errorf("archive: sync %s: %w", a.blocksDir, err)
	}
	a.mu.Lock()
	a.shards[shard] = true
	a.mu.Unlock()
	return nil
}

func (a *Archive) index(key, name string, h *fileHeader, size int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var hot hotScore
	if old, ok := a.idx[key]; ok {
		hot = old.hot
		a.dropLocked(old)
	}
	e := &archEntry{key: key, name: name, meta: h.meta, rawLen: int64(h.rawLen), fileSize: size, hot: hot, gen: a.seq.Add(1)}
	e.elem = a.lru.PushFront(e)
	a.idx[key] = e
	a.bytes += size
	a.raw += e.rawLen
	a.tokens += h.meta.Tokens
}

func (a *Archive) dropLocked(e *archEntry) {
	a.lru.Remove(e.elem)
	delete(a.idx, e.key)
	a.bytes -= e.fileSize
	a.raw -= e.rawLen
	a.tokens -= e.meta.Tokens
}

// makeRoom deletes least recently used blocks, other than key's, until a
// block of size bytes fits under the hard watermark. Blocks whose key is
// being written are skipped, so a Put never waits on another key here.
func (a *Archive) makeRoom(key string, size, tokens int64) {
	a.mu.Lock()
	if old, ok := a.idx[key]; ok {
		size -= old.fileSize
		tokens -= old.meta.Tokens
	}
	a.mu.Unlock()
	a.evictWhile(func() bool { return !a.opts.Budget.fitsHard(a.bytes+size, a.tokens+tokens) }, key)
}

// Trim deletes least recently used blocks until usage is under the soft
// watermark. The store calls it from its maintenance goroutine.
func (a *Archive) Trim() {
	a.evictWhile(func() bool { return a.opts.Budget.overSoft(a.bytes, a.tokens) }, "")
}

// TrimTo deletes least recently used blocks until the block files take at
// most maxBytes (a shared disk budget's share, see Store.TrimDisk).
func (a *Archive) TrimTo(maxBytes int64) {
	a.evictWhile(func() bool { return a.bytes > maxBytes }, "")
}

// evictWhile deletes LRU blocks while over() (called under mu) holds.
func (a *Archive) evictWhile(over func() bool, skip string) {
	for {
		a.mu.Lock()
		if !over() {
			a.mu.Unlock()
			return
		}
		var victim *archEntry
		var mu *sync.Mutex
		for el := a.lru.Back(); el != nil; el = el.Prev() {
			e := el.Value.(*archEntry)
			if e.key == skip {
				continue
			}
			if m := a.stripe(e.key); m.TryLock() {
				victim, mu = e, m
				break
			}
		}
		if victim == nil {
			a.mu.Unlock()
			return
		}
		a.dropLocked(victim)
		a.mu.Unlock()
		// An eviction need not be durable: a block that comes back after a
		// crash is a valid block.
		_ = a.fs.Remove(victim.name)
		mu.Unlock()
		a.evictions.Add(1)
	}
}

// Get reads key's block, checking its CRC before returning a byte, and
// returns its hot score after this access. A file that fails its checks is
// quarantined and reported; the error then matches both durable.ErrCorrupt and
// ErrNotFound.
func (a *Archive) Get(key string) (Value, float64, error) {
	v, hot, _, err := a.get(key)
	return v, hot, err
}

// get is Get that also returns the generation of the block it read.
func (a *Archive) get(key string) (Value, float64, uint64, error) {
	for attempt := 0; ; attempt++ {
		a.mu.Lock()
		e, ok := a.idx[key]
		if !ok {
			a.mu.Unlock()
			a.misses.Add(1)
			return Value{}, 0, 0, ErrNotFound
		}
		hot := e.hot.bump(a.opts.Clock.Now(), a.opts.HotHalfLife)
		a.lru.MoveToFront(e.elem)
		a.mu.Unlock()

		v, err := a.readFile(e.name, key)
		if err == nil {
			a.hits.Add(1)
			return v, hot, e.gen, nil
		}
		// The file may have been replaced or deleted since the index
		// lookup; only a file still indexed as read is judged.
		mu := a.stripe(key)
		mu.Lock()
		a.mu.Lock()
		cur := a.idx[key]
		a.mu.Unlock()
		if cur != e {
			mu.Unlock()
			if attempt < 3 {
				continue
			}
			a.misses.Add(1)
			return Value{}, 0, 0, ErrNotFound
		}
		if !errors.Is(err, errFormat) && !errors.Is(err, fs.ErrNotExist) {
			mu.Unlock()
			return Value{}, 0, 0, fmt.Errorf("archive: read %s: %w", path.Base(e.name), err)
		}
		a.mu.Lock()
		a.dropLocked(e)
		a.mu.Unlock()
		a.misses.Add(1)
		if errors.Is(err, fs.ErrNotExist) {
			// Removed behind the archive's back: forget it.
			mu.Unlock()
			return Value{}, 0, 0, ErrNotFound
		}
		a.quarantine(e.name, err.Error())
		mu.Unlock()
		return Value{}, 0, 0, alsoNotFound{fmt.Errorf("%w: %s quarantined: %v", errCorrupt, path.Base(e.name), err)}
	}
}

// alsoNotFound marks a corruption error as ErrNotFound too, without
// repeating that sentinel's text in the message.
type alsoNotFound struct{ error }

func (e alsoNotFound) Is(target error) bool { return target == ErrNotFound }
func (e alsoNotFound) Unwrap() error        { return e.error }

// genOf returns the generation of key's block, or 0.
func (a *Archive) genOf(key string) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.idx[key]; ok {
		return e.gen
	}
	return 0
}

// Contains reports whether key has a block, in O(1) and without I/O.
func (a *Archive) Contains(key string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.idx[key]
	return ok
}

// Stat returns key's metadata and decoded size without reading the file.
func (a *Archive) Stat(key string) (Meta, int64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.idx[key]; ok {
		return e.meta, e.rawLen, true
	}
	return Meta{}, 0, false
}

// Delete removes key's block durably; a missing key is not an error.
func (a *Archive) Delete(key string) error {
	mu := a.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	a.mu.Lock()
	e, ok := a.idx[key]
	if ok {
		a.dropLocked(e)
	}
	a.mu.Unlock()
	if !ok {
		return nil
	}
	if err := a.fs.Remove(e.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("archive: delete: %w", err)
	}
	if err := a.fs.SyncDir(path.Dir(e.name)); err != nil {
		return fmt.Errorf("archive: delete: sync: %w", err)
	}
	return nil
}

// Keys calls fn for every key and its metadata until fn returns false.
func (a *Archive) Keys(fn func(key string, m Meta) bool) {
	a.mu.Lock()
	type km struct {
		k string
		m Meta
	}
	all := make([]km, 0, len(a.idx))
	for k, e := range a.idx {
		all = append(all, km{k, e.meta})
	}
	a.mu.Unlock()
	for _, x := range all {
		if !fn(x.k, x.m) {
			return
		}
	}
}

// Len returns the number of blocks.
func (a *Archive) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.idx)
}

// Bytes returns the size of all block files.
func (a *Archive) Bytes() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bytes
}

// Stats describes the archive.
func (a *Archive) Stats() TierStats {
	a.mu.Lock()
	n, b, raw, tok := len(a.idx), a.bytes, a.raw, a.tokens
	a.mu.Unlock()
	return TierStats{
		Tier: TierArchive.String(), Entries: n, Bytes: b, RawBytes: raw, MaxBytes: a.opts.Budget.MaxBytes,
		Tokens: tok, MaxTokens: a.opts.Budget.MaxTokens,
		Hits: a.hits.Load(), Misses: a.misses.Load(), Puts: a.puts.Load(),
		Evictions: a.evictions.Load(), Quarantined: a.quarantined.Load(),
	}
}

// Close waits for writes in progress. Every acknowledged Put is already on
// disk, so there is nothing to flush.
func (a *Archive) Close() error {
	for i := range a.stripes {
		a.stripes[i].Lock()
	}
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	for i := range a.stripes {
		a.stripes[i].Unlock()
	}
	return a.Sync() // what was Staged is made durable before the process goes
}
