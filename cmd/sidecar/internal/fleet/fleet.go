// Package fleet joins the replicas of a fleet through a shared
// Redis/Valkey store (package remote): it implements what the other
// packages ask of that store, each through an interface the using package
// defines —
//
//   - memory.SharedLog: session logs (and so units, facts, episodes),
//     written through at their positions, fenced by the session's lease
//     while this replica holds it;
//   - engine.SharedStates: engine KV states as chunked blobs, and the
//     prefix-hash index that finds them from another replica;
//   - the proxy's turn lease (Acquire): a session's turn holds the
//     session's lease from before its messages are recorded until its
//     reply and KV are written through, so turns of one session on two
//     replicas run one after the other and never fork its history.
//
// Policy when a session is busy elsewhere: wait for the lease (the other
// replica releases it at the end of its turn; a dead replica's lease
// expires after remote.Options.LeaseTTL), then take the session over from
// the store: its history by memory.Store.Sync (Prepare runs it), its KV by
// the engine's shared lookup. Requests are not forwarded to the holder:
// turns are short compared with a lease, and serving the turn where it
// landed keeps one code path for "moved" and "owner died".
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/remote"
)

// EngineTenant is the tenant token under which engine states are kept:
// their ids are content hashes and their prefix hashes are seeded with
// the request's tenant, so one tenant's lookup never finds another's.
const EngineTenant = "_engine"

// Options configure New.
type Options struct {
	// Store is the shared store. Required; the caller closes it after the
	// Fleet.
	Store *remote.Store
	// LeaseWait bounds how long a turn waits for its session's lease
	// held by another replica. Zero: twice the store's lease TTL (long
	// enough for a dead holder's lease to expire).
	LeaseWait time.Duration
	// Logger receives warnings. Nil: slog.Default().
	Logger *slog.Logger
}

// Fleet is the glue; create it with New. Safe for concurrent use.
type Fleet struct {
	st   *remote.Store
	wait time.Duration
	log  *slog.Logger

	// mu protects held: the leases this replica holds now, by session.
	mu   sync.Mutex
	held map[string]*remote.Lease

	acquired, waited, degraded, lost atomic.Int64
}

// New returns a Fleet over opts.Store.
func New(opts Options) (*Fleet, error) {
	if opts.Store == nil {
		return nil, errors.New("fleet: no Store")
	}
	if opts.LeaseWait < 0 {
		return nil, errors.New("fleet: negative LeaseWait")
	}
	if opts.LeaseWait == 0 {
		opts.LeaseWait = 2 * opts.Store.LeaseTTL()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Fleet{st: opts.Store, wait: opts.LeaseWait, log: opts.Logger, held: map[string]*remote.Lease{}}, nil
}

func sessKey(tenant, session string) string { return tenant + "\x00" + session }

// ErrBusy: the session's lease stayed with another replica for the whole
// wait.
var ErrBusy = errors.New("fleet: session busy on another replica")

// Acquire takes the session's lease for one turn, waiting while another
// replica holds it (at most LeaseWait); release ends the hold and must be
// called once, when the turn's reply and KV are written through. A store
// that cannot be reached does not stop the turn: Acquire logs, counts and
// returns a release that does nothing (the turn's shared writes fail on
// their own, and memory then forwards without recording).
func (f *Fleet) Acquire(ctx context.Context, tenant, session string) (release func(), err error) {
	wctx, cancel := context.WithTimeout(ctx, f.wait)
	defer cancel()
	start := time.Now()
	l, err := f.st.Acquire(wctx, tenant, session)
	if err != nil {
		var held *remote.HeldError
		if errors.As(err, &held) {
			return nil, fmt.Errorf("%w (%s) after %v", ErrBusy, held.Owner, time.Since(start).Round(time.Millisecond))
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("fleet: acquire: %w", ctx.Err()) // the caller is going away
		}
		f.degraded.Add(1)
		f.log.Warn("fleet: the shared store is unreachable; the turn goes on without its session lease", "err", err)
		return func() {}, nil
	}
	f.acquired.Add(1)
	if time.Since(start) > 50*time.Millisecond {
		f.waited.Add(1)
	}
	k := sessKey(tenant, session)
	f.mu.Lock()
	f.held[k] = l
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			if f.held[k] == l {
				delete(f.held, k)
			}
			f.mu.Unlock()
			if err := l.Release(context.Background()); err != nil {
				f.lost.Add(1)
				f.log.Warn("fleet: a session lease was lost before the turn ended", "err", err)
			}
		})
	}, nil
}

// lease returns the lease this replica holds on the session, or nil.
func (f *Fleet) lease(tenant, session string) *remote.Lease {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[sessKey(tenant, session)]
}

// Stats are the Fleet's counters.
type Stats struct {
	// LeasesAcquired counts turns that took their session's lease,
	// LeaseWaits those that waited for it, Degraded those that went on
	// without it (store unreachable), LeasesLost leases found taken when
	// released.
	LeasesAcquired, LeaseWaits, Degraded, LeasesLost int64
	// Durability is the store's own persistence setting (see
	// remote.Store.Durability).
	Durability string
}

// Stats returns a snapshot of the counters.
func (f *Fleet) Stats() Stats {
	return Stats{LeasesAcquired: f.acquired.Load(), LeaseWaits: f.waited.Load(), Degraded: f.degraded.Load(),
		LeasesLost: f.lost.Load(), Durability: f.st.Durability()}
}

// Log returns the memory.SharedLog over the store.
func (f *Fleet) Log() memory.SharedLog { return sessionLog{f} }

// States returns the engine.SharedStates over the store.
func (f *Fleet) States() engine.SharedStates { return states{f} }

type sessionLog struct{ f *Fleet }

func (s sessionLog) Append(ctx context.Context, tenant, session string, at int64, payloads [][]byte) (int64, error) {
	n, err := s.f.st.Append(ctx, tenant, session, s.f.lease(tenant, session), at, payloads...)
	if errors.Is(err, remote.ErrConflict) || errors.Is(err, remote.ErrGap) {
		return 0, fmt.Errorf("%w: %w", memory.ErrSharedConflict, err)
	}
	return n, err
}

func (s sessionLog) Records(ctx context.Context, tenant, session string, from int64) ([][]byte, error) {
	return s.f.st.Records(ctx, tenant, session, from, 0)
}

func (s sessionLog) Len(ctx context.Context, tenant, session string) (int64, error) {
	return s.f.st.RecordCount(ctx, tenant, session)
}

func (s sessionLog) Replace(ctx context.Context, tenant, session string, payloads [][]byte) error {
	return s.f.st.ReplaceRecords(ctx, tenant, session, payloads...)
}

type states struct{ f *Fleet }

func (s states) PutState(ctx context.Context, fp, id string, hashes []string, raw, meta []byte) error {
	if err := s.f.st.PutBlob(ctx, EngineTenant, id, raw, meta); err != nil {
		return err
	}
	return s.f.st.IndexPut(ctx, EngineTenant, fp, hashes, id)
}

func (s states) LookupState(ctx context.Context, fp string, hashes []string) (string, int, error) {
	ids, err := s.f.st.IndexGet(ctx, EngineTenant, fp, hashes)
	if err != nil {
		return "", 0, err
	}
	for i := len(ids) - 1; i >= 0; i-- {
		if ids[i] != "" {
			return ids[i], i + 1, nil
		}
	}
	return "", 0, nil
}

func (s states) GetState(ctx context.Context, id string) ([]byte, []byte, error) {
	raw, info, err := s.f.st.GetBlob(ctx, EngineTenant, id)
	if errors.Is(err, remote.ErrNotFound) {
		return nil, nil, fmt.Errorf("%w: %w", engine.ErrSharedNotFound, err)
	}
	return raw, info.Aux, err
}
