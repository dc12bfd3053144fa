package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A session's lease is one key, SET with a TTL, holding "owner token":
// owner is the holder's address (Options.Owner) and token names one
// acquisition by one process (its instance, a random id per Open, and a
// counter). Only the holder renews or releases it (compare in Lua), and a
// fenced Append checks it in the same script as the write. A process that
// finds a lease of its own address but another instance knows that holder
// is a dead earlier incarnation of itself and takes the lease at once;
// any other holder's lease is waited for until released or expired.
// Owner must therefore be unique among live replicas.

// Lease is a held session lease. Release it when done; until then the
// Store renews it every LeaseTTL/3. A lease whose renewal found it gone
// (it expired while the store was unreachable, and someone else took it)
// reports Lost, and fenced writes with it fail with ErrNotOwner.
type Lease struct {
	s     *Store
	key   string
	token string
	lost  atomic.Bool
}

// Token is the lease's value in the store: "owner instance.n".
func (l *Lease) Token() string { return l.token }

// Lost reports whether a renewal found the lease taken or gone.
func (l *Lease) Lost() bool { return l.lost.Load() }

// acquireScript: KEYS[1] the lease; ARGV[1] the new token, ARGV[2] the
// TTL in ms, ARGV[3] this owner, ARGV[4] this instance. Returns {1} when
// taken, {0, holder} when held by another.
var acquireScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then
  local sp = string.find(cur, ' ', 1, true)
  if not sp then return {0, cur} end
  local owner = string.sub(cur, 1, sp - 1)
  local inst = string.match(string.sub(cur, sp + 1), '^[^.]*')
  if owner ~= ARGV[3] or inst == ARGV[4] then return {0, cur} end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1}
`)

var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
`)

// TryAcquire takes the session's lease if it is free (or held by a dead
// earlier incarnation of this replica); else it fails with a *HeldError
// naming the holder.
func (s *Store) TryAcquire(ctx context.Context, tenant, session string) (*Lease, error) {
	if err := checkToken("tenant", tenant); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, ErrClosed
	}
	l := &Lease{s: s, key: s.leaseKey(tenant, session),
		token: fmt.Sprintf("%s %s.%d", s.opts.Owner, s.instance, s.leaseSeq.Add(1))}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	res, err := acquireScript.Run(ctx, s.c, []string{l.key}, l.token, s.opts.LeaseTTL.Milliseconds(), s.opts.Owner, s.instance).Slice()
	if err != nil {
		return nil, fmt.Errorf("remote: acquire lease: %w", err)
	}
	if len(res) >= 1 && res[0] == int64(1) {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			l.release(ctx)
			return nil, ErrClosed
		}
		s.held[l] = struct{}{}
		s.mu.Unlock()
		return l, nil
	}
	holder := ""
	if len(res) >= 2 {
		holder, _ = res[1].(string)
	}
	owner, _, _ := strings.Cut(holder, " ")
	return nil, &HeldError{Owner: owner}
}

// Acquire takes the session's lease, waiting while another replica holds
// it (polling, 5 ms doubling to 100 ms) until it is released, expires, or
// ctx ends; then the *HeldError of the last try is returned.
func (s *Store) Acquire(ctx context.Context, tenant, session string) (*Lease, error) {
	wait := 5 * time.Millisecond
	for {
		l, err := s.TryAcquire(ctx, tenant, session)
		if !errors.Is(err, ErrHeld) {
			return l, err
		}
		if sleepCtx(ctx, wait) != nil {
			return nil, err
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// Renew extends the lease to a full LeaseTTL now; ErrNotOwner (and Lost)
// when it is no longer held.
func (l *Lease) Renew(ctx context.Context) error {
	ctx, cancel := l.s.opCtx(ctx)
	defer cancel()
	n, err := renewScript.Run(ctx, l.s.c, []string{l.key}, l.token, l.s.opts.LeaseTTL.Milliseconds()).Int64()
	if err != nil {
		return fmt.Errorf("remote: renew lease: %w", err)
	}
	if n != 1 {
		l.markLost()
		return fmt.Errorf("remote: renew lease: %w", ErrNotOwner)
	}
	return nil
}

func (l *Lease) markLost() {
	l.lost.Store(true)
	l.s.mu.Lock()
	delete(l.s.held, l)
	l.s.mu.Unlock()
}

// Release gives the lease up (only if still held by this lease: compare
// and delete). Releasing twice, or a lost lease, returns ErrNotOwner.
func (l *Lease) Release(ctx context.Context) error {
	ctx, cancel := l.s.opCtx(ctx)
	defer cancel()
	return l.release(ctx)
}

func (l *Lease) release(ctx context.Context) error {
	l.s.mu.Lock()
	delete(l.s.held, l)
	l.s.mu.Unlock()
	n, err := compareDelete.Run(ctx, l.s.c, []string{l.key}, l.token).Int64()
	if err != nil {
		return fmt.Errorf("remote: release lease: %w", err)
	}
	if n != 1 {
		l.lost.Store(true)
		return fmt.Errorf("remote: release lease: %w", ErrNotOwner)
	}
	return nil
}

// renewLoop renews every held lease each LeaseTTL/3 in one pipeline.
func (s *Store) renewLoop() {
	defer close(s.done)
	t := time.NewTicker(s.opts.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.renewHeld()
	}
}

func (s *Store) renewHeld() {
	s.mu.Lock()
	held := make([]*Lease, 0, len(s.held))
	for l := range s.held {
		held = append(held, l)
	}
	s.mu.Unlock()
	if len(held) == 0 {
		return
	}
	ctx, cancel := s.opCtx(context.Background())
	defer cancel()
	p := s.c.Pipeline()
	cmds := make([]*redis.Cmd, len(held))
	ttl := s.opts.LeaseTTL.Milliseconds()
	for i, l := range held {
		cmds[i] = renewScript.Eval(ctx, p, []string{l.key}, l.token, ttl)
	}
	if _, err := p.Exec(ctx); err != nil {
		s.opts.Logger.Warn("remote: renewing leases", "leases", len(held), "err", err)
		return
	}
	for i, c := range cmds {
		if n, err := c.Int64(); err == nil && n != 1 {
			held[i].markLost()
			s.opts.Logger.Warn("remote: a session lease was lost (expired and taken elsewhere)", "key", held[i].key)
		}
	}
}
