package remote

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// A session's records are a Redis list: record i (from 0) is element i.
// An append names the position of its first record, so a retry of an
// append whose answer was lost finds its records already there, byte for
// byte, and adds nothing; different bytes at a taken position are a
// conflict (two writers forked the history), a position past the end is a
// gap. With a lease the append happens only while that lease is held, in
// the same script (fencing): a replica whose lease expired can no longer
// write.

// appendScript: KEYS[1] the list, KEYS[2] the lease; ARGV[1] the lease
// token ("" for none), ARGV[2] the first position, ARGV[3] the TTL in ms
// (0: none), ARGV[4..] the records.
var appendScript = redis.NewScript(`
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return redis.error_reply('NOTOWNER the session lease is not held by this writer')
end
local n = redis.call('LLEN', KEYS[1])
local at = tonumber(ARGV[2])
if at > n then return redis.error_reply('GAP the list has ' .. n .. ' records') end
local i = 4
while at < n and i <= #ARGV do
  if redis.call('LINDEX', KEYS[1], at) ~= ARGV[i] then
    return redis.error_reply('CONFLICT record ' .. at .. ' differs; the list has ' .. n)
  end
  at = at + 1
  i = i + 1
end
if i <= #ARGV then redis.call('RPUSH', KEYS[1], unpack(ARGV, i)) end
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return redis.call('LLEN', KEYS[1])
`)

// maxAppendBatch bounds the records of one script call (Lua's unpack has a
// stack limit of a few thousand values).
const maxAppendBatch = 256

// Append writes recs at positions at, at+1, … of the session's record list
// and returns the list's length. Records already there with the same bytes
// are skipped (a retried append is harmless); different bytes fail with
// ErrConflict, at beyond the end with ErrGap. With a non-nil lease the
// write happens only if the lease is still held (else ErrNotOwner). It
// returns after the store applied it (see Durability). The TTL is
// refreshed. More than 256 records go in several steps, each atomic; a
// failure between them leaves a prefix written, which a retry completes.
// With no records it only checks the lease and the position.
func (s *Store) Append(ctx context.Context, tenant, session string, lease *Lease, at int64, recs ...[]byte) (int64, error) {
	if err := checkToken("tenant", tenant); err != nil {
		return 0, err
	}
	if at < 0 {
		return 0, fmt.Errorf("remote: append at %d", at)
	}
	token := ""
	if lease != nil {
		token = lease.token
	}
	keys := []string{s.logKey(tenant, session), s.leaseKey(tenant, session)}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	for {
		batch := recs[:min(len(recs), maxAppendBatch)]
		recs = recs[len(batch):]
		args := make([]any, 0, 3+len(batch))
		args = append(args, token, at, s.ttlMillis())
		for _, r := range batch {
			args = append(args, r)
		}
		n, err := appendScript.Run(ctx, s.c, keys, args...).Int64()
		if err != nil {
			return 0, scriptErr("append", err)
		}
		at += int64(len(batch))
		if len(recs) == 0 {
			return n, nil
		}
	}
}

// Records returns up to limit records of the session from position from
// (limit ≤ 0: all of them). An unknown session has none (no error).
func (s *Store) Records(ctx context.Context, tenant, session string, from int64, limit int) ([][]byte, error) {
	if err := checkToken("tenant", tenant); err != nil {
		return nil, err
	}
	if from < 0 {
		return nil, fmt.Errorf("remote: records from %d", from)
	}
	stop := int64(-1)
	if limit > 0 {
		stop = from + int64(limit) - 1
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	vals, err := s.c.LRange(ctx, s.logKey(tenant, session), from, stop).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("remote: records: %w", err)
	}
	out := make([][]byte, len(vals))
	for i, v := range vals {
		out[i] = []byte(v)
	}
	return out, nil
}

// RecordCount is the length of the session's record list (0 when it has
// none).
func (s *Store) RecordCount(ctx context.Context, tenant, session string) (int64, error) {
	if err := checkToken("tenant", tenant); err != nil {
		return 0, err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	n, err := s.c.LLen(ctx, s.logKey(tenant, session)).Result()
	if err != nil {
		return 0, fmt.Errorf("remote: record count: %w", err)
	}
	return n, nil
}

// replaceScript: KEYS[1] the list; ARGV[1] the TTL in ms (0: none),
// ARGV[2..] the records.
var replaceScript = redis.NewScript(`
redis.call('DEL', KEYS[1])
if #ARGV > 1 then redis.call('RPUSH', KEYS[1], unpack(ARGV, 2)) end
if tonumber(ARGV[1]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return redis.call('LLEN', KEYS[1])
`)

// ReplaceRecords replaces the session's records with recs (at most 256),
// atomically: a reader sees the old list or the new one. A deletion that
// must be seen as one (a tombstone record) uses it.
func (s *Store) ReplaceRecords(ctx context.Context, tenant, session string, recs ...[]byte) error {
	if err := checkToken("tenant", tenant); err != nil {
		return err
	}
	if len(recs) > maxAppendBatch {
		return fmt.Errorf("remote: replace records: %d records, at most %d", len(recs), maxAppendBatch)
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	args := []any{s.ttlMillis()}
	for _, r := range recs {
		args = append(args, r)
	}
	if err := replaceScript.Run(ctx, s.c, []string{s.logKey(tenant, session)}, args...).Err(); err != nil {
		return fmt.Errorf("remote: replace records: %w", err)
	}
	return nil
}
