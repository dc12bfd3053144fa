package respstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Fsync says when a SET's value reaches the disk.
type Fsync string

const (
	// FsyncBackground (the default) answers a SET once its value is in
	// RAM and served; the persisters write it to the Archive right behind
	// (staged: in the file system, surviving kill -9), and a syncer
	// fsyncs what they wrote every second. At most
	// Options.MaxUnsyncedBytes of answered values wait to be written: what
	// a kill -9 can lose; a power loss can lose the last second too, as
	// with Redis's appendfsync everysec.
	FsyncBackground Fsync = "background"
	// FsyncAlways answers a SET only once its value is in the Archive,
	// fsynced: a kill -9 loses nothing acknowledged.
	FsyncAlways Fsync = "always"
)

// Options configure a Server. Every zero value is a documented default;
// Dir is required (Open applies EnsureDefaults and Validate).
type Options struct {
	// Dir is the folder of the store's Archive (one file per value, the
	// tiers' block format: zstd over byte planes, CRC32C, quarantine).
	Dir string
	// RAMBytes is the Working tier's budget, in host RAM. Zero: 1 GiB.
	RAMBytes int64
	// DiskBytes bounds the Archive's files; past it the least recently
	// used values are deleted. Zero: 16 GiB.
	DiskBytes int64
	// Device, a GPU, backs a Focus tier of FocusBytes (zero: 256 MiB)
	// above Working. Nil: no Focus tier (on a CPU it would be one more
	// copy in host RAM).
	Device     gpu.Device
	FocusBytes int64
	// Strategy is the eviction policy of the memory tiers (tiers.NewPolicy's
	// names). Empty: tiers.DefaultStrategy.
	Strategy string
	// Fsync is when a SET's value reaches the disk. Empty: FsyncBackground.
	Fsync Fsync
	// MaxUnsyncedBytes bounds the answered bytes not yet written to the
	// file system (FsyncBackground): what a kill -9 can lose, and the
	// burst of SETs answered at the speed of RAM before they wait for the
	// persisters. Zero: 256 MiB, at most half of RAMBytes.
	MaxUnsyncedBytes int64
	// MaxValueBytes caps one value (and any argument). Zero: 512 MiB.
	MaxValueBytes int64
	// MaxInflightBytes bounds the memory every connection together holds
	// for values being received, before they are stored: a large argument
	// waits until its bytes fit. Zero: MaxValueBytes.
	MaxInflightBytes int64
	// MaxReaders bounds the GETs reading their values from the tiers at
	// once: a value read from the Archive is decoded into buffers of its
	// size, so this bounds that memory (writing replies is not bounded by
	// it). Zero: twice the CPUs, at least 4.
	MaxReaders int
	// MaxConns caps open connections; one more is answered "-ERR max
	// number of clients reached" and closed. Zero: 1024.
	MaxConns int
	// Users, when not nil, are the only accounts AUTH accepts (a tenant
	// each, "u_<name>"). Nil: any credentials are accepted and name a
	// tenant of their own, "t_" and 16 hex digits of their SHA-256 (AUTH
	// with a password alone hashes as the HTTP side hashes a bearer key),
	// so clients that do not share credentials never share keys.
	Users []User
	// AllowAnonymous lets clients that never AUTH share one tenant,
	// "anonymous". False: they get -NOAUTH until they authenticate.
	AllowAnonymous bool
	// Quota caps the bytes of each tenant's keys (a User's own Quota
	// wins); past it the tenant's least recently used keys are evicted.
	// Zero: none (the tiers' budgets still apply to all tenants together).
	Quota int64
	// SaltQuota caps the bytes of each (tenant, LMCache cache_salt) pair
	// (see SaltOf); past it the pair's least recently used keys are
	// evicted. Zero: none.
	SaltQuota int64
	// ReadTimeout bounds reading one command once its first byte came
	// (for a large value: each 16 MiB of it). WriteTimeout bounds each
	// write of a reply (each 16 MiB of a large one). Zero: 60 s each. An
	// idle connection is never closed, as with Redis's default.
	ReadTimeout, WriteTimeout time.Duration
	// Remote is the fleet's shared store (--remote): values are written
	// through to it in the background and read from it when the local
	// tiers miss. Nil: this machine only.
	Remote Remote
	// Metrics receives the store's families (sidecar_resp_*). Nil: Stats
	// only.
	Metrics *obs.Registry
	// Logger logs connections' errors and the persister's. Nil:
	// slog.Default().
	Logger *slog.Logger
	// Clock tells time (expiries). Nil: the system clock.
	Clock clock.Clock
	// Version is reported by INFO as kvsidecar_version.
	Version string
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. Open calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.Fsync == "" {
		o.Fsync = FsyncBackground
	}
	if o.RAMBytes == 0 {
		o.RAMBytes = 1 << 30
	}
	if o.MaxUnsyncedBytes == 0 {
		o.MaxUnsyncedBytes = min(256<<20, o.RAMBytes/2)
	}
	if o.MaxValueBytes == 0 {
		o.MaxValueBytes = 512 << 20
	}
	if o.MaxInflightBytes == 0 {
		o.MaxInflightBytes = o.MaxValueBytes
	}
	if o.MaxConns == 0 {
		o.MaxConns = 1024
	}
	if o.MaxReaders == 0 {
		o.MaxReaders = max(4, 2*runtime.GOMAXPROCS(0))
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = time.Minute
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *Options) Validate() error {
	if o.Dir == "" {
		return errors.New("respstore: Dir is required")
	}
	for _, v := range []int64{o.RAMBytes, o.DiskBytes, o.FocusBytes, o.MaxUnsyncedBytes, o.MaxValueBytes, o.MaxInflightBytes, o.Quota, o.SaltQuota} {
		if v < 0 {
			return errors.New("respstore: negative size")
		}
	}
	if o.MaxConns < 0 || o.MaxReaders < 0 || o.ReadTimeout < 0 || o.WriteTimeout < 0 {
		return errors.New("respstore: negative MaxConns or timeout")
	}
	switch o.Fsync {
	case FsyncBackground, FsyncAlways:
	default:
		return fmt.Errorf("respstore: Fsync %q: want %s or %s", o.Fsync, FsyncBackground, FsyncAlways)
	}
	if o.MaxInflightBytes < o.MaxValueBytes {
		return fmt.Errorf("respstore: MaxInflightBytes (%d) below MaxValueBytes (%d): a largest value could never be received", o.MaxInflightBytes, o.MaxValueBytes)
	}
	for _, u := range o.Users {
		if !validName(u.Name) || u.Password == "" || u.Quota < 0 {
			return fmt.Errorf("respstore: user %q: a name of letters, digits and _.=- and a password are required", u.Name)
		}
	}
	return nil
}

// Server is the RESP listener: it owns its store (a kv.Cache opened on
// Options.Dir, with its persister and expiry goroutines), its listeners,
// one goroutine per connection, and the in-flight budget. Open it, Serve
// on a listener, Close it. Safe for concurrent use.
type Server struct {
	opts     Options
	cache    *kv.Cache
	ix       *index
	st       *store
	acc      *accounts
	inflight *semaphore.Weighted
	started  time.Time
	loaded   int

	ctx    context.Context // done at Close: waits on the budget end
	cancel context.CancelFunc

	nextID atomic.Int64
	conns  atomic.Int64
	cmds   sync.Map // command name → *atomic.Int64
	protoErrors, refusedConns,
	authFailures atomic.Int64

	// mu protects the fields below.
	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	open      map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// Open opens the store under opts.Dir (rebuilding its index from the
// Archive: what a previous process acknowledged and wrote is served
// again) and returns a Server ready to Serve.
func Open(opts Options) (*Server, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	cache, err := kv.Open(kv.Options{
		Store: tiers.Options{
			Dir: opts.Dir, Device: opts.Device, DisableFocus: opts.Device == nil,
			Focus: tiers.Budget{MaxBytes: opts.FocusBytes}, Working: tiers.Budget{MaxBytes: opts.RAMBytes},
			Archive: tiers.Budget{MaxBytes: opts.DiskBytes}, Strategy: opts.Strategy,
			MaxBlockBytes: opts.MaxValueBytes, Clock: opts.Clock,
		},
		MaxBlobBytes: opts.MaxValueBytes,
		Clock:        opts.Clock,
	})
	if err != nil {
		return nil, fmt.Errorf("respstore: open: %w", err)
	}
	acc := newAccounts(opts.Users)
	defQuota := opts.Quota
	ix := newIndex(func(t string) int64 {
		if q := acc.quota(t); q > 0 {
			return q
		}
		return defQuota
	}, opts.SaltQuota)
	s := &Server{
		opts: opts, cache: cache, ix: ix, acc: acc,
		inflight:  semaphore.NewWeighted(opts.MaxInflightBytes),
		started:   opts.Clock.Now(),
		listeners: map[net.Listener]struct{}{}, open: map[net.Conn]struct{}{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.st = newStore(cache, ix, &s.opts)
	if s.loaded, err = s.st.load(); err != nil {
		cache.Close()
		return nil, err
	}
	s.st.start()
	if opts.Metrics != nil {
		s.exportMetrics(opts.Metrics)
	}
	return s, nil
}

// Loaded returns how many values the store found on disk when it opened.
func (s *Server) Loaded() int { return s.loaded }

// Serve accepts connections on ln until Close (then it returns nil) or an
// accept error. Serve may be called on several listeners.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	var tempDelay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				tempDelay = min(max(2*tempDelay, 5*time.Millisecond), time.Second)
				time.Sleep(tempDelay)
				continue
			}
			return fmt.Errorf("respstore: accept: %w", err)
		}
		tempDelay = 0
		if !s.track(c) {
			c.Close()
			return nil
		}
		go s.handle(c)
	}
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.open[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.open, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Close stops accepting, closes every connection (a command in progress
// finishes or fails; a SET answered before is kept), writes what the
// persister holds to disk, and closes the store, which writes what only
// RAM holds to the Archive. Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.st.close()
	if err := s.cache.Close(); err != nil {
		return fmt.Errorf("respstore: close: %w", err)
	}
	return nil
}

// Sync waits until every value acknowledged so far is on disk (or ctx
// ends). With FsyncAlways there is never anything to wait for.
func (s *Server) Sync(ctx context.Context) error { return s.st.drain(ctx) }

// count adds one to a command's counter.
func (s *Server) count(name string) {
	v, ok := s.cmds.Load(name)
	if !ok {
		v, _ = s.cmds.LoadOrStore(name, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
}
