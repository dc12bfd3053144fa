package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store is a connection to the shared store. Create it with Open and Close
// it; safe for concurrent use. It owns one goroutine, the lease renewer,
// which Close stops and waits for.
type Store struct {
	opts     Options
	c        redis.UniversalClient
	instance string // random per Open: tells this process's leases from an earlier one's

	durability string // what the server said about its AOF at Open

	leaseSeq atomic.Uint64

	// mu protects the fields below.
	mu     sync.Mutex
	held   map[*Lease]struct{}
	closed bool

	stop chan struct{}
	done chan struct{}
}

// Open connects to the store named by opts.URL, checks it answers (PING)
// and reads its persistence settings (see Durability). It starts the lease
// renewer.
func Open(ctx context.Context, opts Options) (*Store, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	c, err := newClient(opts)
	if err != nil {
		return nil, err
	}
	s := &Store{
		opts:     opts,
		c:        c,
		instance: fmt.Sprintf("%016x", rand.Uint64()),
		held:     map[*Lease]struct{}{},
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	pctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("remote: ping %s: %w", redactURL(opts.URL), err)
	}
	s.durability = s.readDurability(pctx)
	if !strings.HasPrefix(s.durability, "aof") {
		opts.Logger.Warn("remote: the store does not write an append-only file; a restart of it loses what was written since its last snapshot",
			"store", redactURL(opts.URL), "persistence", s.durability)
	}
	go s.renewLoop()
	return s, nil
}

func newClient(o Options) (redis.UniversalClient, error) {
	u, _ := url.Parse(o.URL)
	if o.Cluster || u.Query().Has("addr") {
		co, err := redis.ParseClusterURL(o.URL)
		if err != nil {
			return nil, fmt.Errorf("remote: cluster URL: %w", err)
		}
		return redis.NewClusterClient(co), nil
	}
	ro, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("remote: URL: %w", err)
	}
	return redis.NewClient(ro), nil
}

// redactURL drops the password from a store URL for logs and errors.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// readDurability asks CONFIG GET for appendonly and appendfsync. Managed
// stores often disable CONFIG; then it says "unknown".
func (s *Store) readDurability(ctx context.Context) string {
	m, err := s.c.ConfigGet(ctx, "append*").Result()
	if err != nil || m["appendonly"] == "" {
		return "unknown"
	}
	if m["appendonly"] != "yes" {
		return "no aof"
	}
	return "aof appendfsync=" + m["appendfsync"]
}

// Durability says what an acknowledged write survives, from the store's
// own settings at Open: "aof appendfsync=always" (a write is in the AOF
// and fsynced before the store answers: it survives a crash of the store
// or its machine), "aof appendfsync=everysec" (in the AOF before the
// answer, fsynced within about a second: it survives a kill -9 of the
// store; a machine crash may lose the last second), "aof appendfsync=no",
// "no aof" (only snapshots: a restart loses recent writes) or "unknown"
// (CONFIG is disabled).
func (s *Store) Durability() string { return s.durability }

// LeaseTTL is the lease lifetime in effect (Options.LeaseTTL).
func (s *Store) LeaseTTL() time.Duration { return s.opts.LeaseTTL }

// Owner is this replica's address as written into its leases.
func (s *Store) Owner() string { return s.opts.Owner }

// Ping checks the store answers within Options.Timeout.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	if err := s.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("remote: ping: %w", err)
	}
	return nil
}

// Close stops the lease renewer, releases the leases still held
// (best effort, bounded by Options.Timeout) and closes the connections.
// Safe to call twice.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	held := make([]*Lease, 0, len(s.held))
	for l := range s.held {
		held = append(held, l)
	}
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
	defer cancel()
	for _, l := range held {
		l.release(ctx)
	}
	return s.c.Close()
}

func (s *Store) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.Timeout)
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// ttlMillis is the TTL argument for scripts: 0 means none.
func (s *Store) ttlMillis() int64 { return s.opts.TTL.Milliseconds() }

// scriptErr maps a script's error reply (its first word) to a sentinel.
func scriptErr(op string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, m := range []struct {
		word string
		err  error
	}{{"CONFLICT", ErrConflict}, {"GAP", ErrGap}, {"NOTOWNER", ErrNotOwner}} {
		if strings.HasPrefix(msg, m.word) {
			return fmt.Errorf("remote: %s: %w (%s)", op, m.err, msg)
		}
	}
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("remote: %s: %w", op, ErrNotFound)
	}
	return fmt.Errorf("remote: %s: %w", op, err)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// SetClientLogger sends the Redis client library's own messages (failed
// dials, pool trouble) to l as warnings instead of the standard logger's
// plain lines. The setting is process-wide: call it once at start-up.
func SetClientLogger(l *slog.Logger) { redis.SetLogger(clientLogger{l}) }

type clientLogger struct{ l *slog.Logger }

func (c clientLogger) Printf(ctx context.Context, format string, v ...any) {
	c.l.WarnContext(ctx, "remote: redis client: "+fmt.Sprintf(format, v...))
}
