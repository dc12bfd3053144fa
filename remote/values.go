package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Values are small keyed items (pool entries, facts, a user's scope) in a
// namespace of a tenant, each with a version the store increments on every
// write, so writers on several replicas can compare-and-set. A namespace
// keeps a sorted set of its keys for listing by prefix.

// AnyVersion, as the expected version, writes or deletes unconditionally.
const AnyVersion int64 = -1

// Value is one stored item.
type Value struct {
	Key     string
	Data    []byte
	Version int64
}

// putValueScript: KEYS[1] the value, KEYS[2] the namespace's key set;
// ARGV[1] the key, ARGV[2] the data, ARGV[3] the expected version (-1
// any, 0 absent), ARGV[4] the TTL in ms (0 none).
var putValueScript = redis.NewScript(`
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
local e = tonumber(ARGV[3])
if e >= 0 and e ~= v then return redis.error_reply('CONFLICT at version ' .. v) end
v = v + 1
redis.call('HSET', KEYS[1], 'v', v, 'd', ARGV[2], 'k', ARGV[1])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
if tonumber(ARGV[4]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return v
`)

// deleteValueScript: KEYS and ARGV[1] as above, ARGV[2] the expected
// version (-1 any). Returns 1 when deleted, 0 when absent.
var deleteValueScript = redis.NewScript(`
local v = redis.call('HGET', KEYS[1], 'v')
if not v then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
local e = tonumber(ARGV[2])
if e >= 0 and e ~= tonumber(v) then return redis.error_reply('CONFLICT at version ' .. v) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
`)

func checkNS(tenant, ns string) error {
	if err := checkToken("tenant", tenant); err != nil {
		return err
	}
	return checkToken("namespace", ns)
}

// PutValue writes data under key in namespace ns of tenant and returns the
// new version. expect is the version the caller read: AnyVersion writes
// whatever is there, 0 only creates, n only replaces version n (else
// ErrConflict). The TTL is refreshed.
func (s *Store) PutValue(ctx context.Context, tenant, ns, key string, data []byte, expect int64) (int64, error) {
	if err := checkNS(tenant, ns); err != nil {
		return 0, err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	v, err := putValueScript.Run(ctx, s.c, []string{s.valueKey(tenant, ns, key), s.valueListKey(tenant, ns)},
		key, data, expect, s.ttlMillis()).Int64()
	if err != nil {
		return 0, scriptErr("put value", err)
	}
	return v, nil
}

// GetValue reads key of namespace ns.
func (s *Store) GetValue(ctx context.Context, tenant, ns, key string) (Value, error) {
	if err := checkNS(tenant, ns); err != nil {
		return Value{}, err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	vals, err := s.c.HMGet(ctx, s.valueKey(tenant, ns, key), "v", "d").Result()
	if err != nil {
		return Value{}, fmt.Errorf("remote: get value: %w", err)
	}
	return valueOf(key, vals)
}

func valueOf(key string, vals []any) (Value, error) {
	if len(vals) != 2 || vals[0] == nil || vals[1] == nil {
		return Value{}, fmt.Errorf("remote: value %q: %w", key, ErrNotFound)
	}
	vs, _ := vals[0].(string)
	d, _ := vals[1].(string)
	var ver int64
	if _, err := fmt.Sscan(vs, &ver); err != nil {
		return Value{}, fmt.Errorf("remote: value %q: %w: version %q", key, errCorrupt, vs)
	}
	return Value{Key: key, Data: []byte(d), Version: ver}, nil
}

// DeleteValue removes key of namespace ns when it is at version expect
// (AnyVersion: whatever it is). Deleting a missing key is not an error.
func (s *Store) DeleteValue(ctx context.Context, tenant, ns, key string, expect int64) error {
	if err := checkNS(tenant, ns); err != nil {
		return err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	err := deleteValueScript.Run(ctx, s.c, []string{s.valueKey(tenant, ns, key), s.valueListKey(tenant, ns)}, key, expect).Err()
	return scriptErr("delete value", err)
}

// ListValues returns up to limit values of namespace ns whose keys start
// with prefix, in key order (limit ≤ 0: 1,000). Keys whose value expired
// are dropped from the listing as they are met.
func (s *Store) ListValues(ctx context.Context, tenant, ns, prefix string, limit int) ([]Value, error) {
	if err := checkNS(tenant, ns); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 1000
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	lk := s.valueListKey(tenant, ns)
	lo, hi := "-", "+"
	if prefix != "" {
		lo, hi = "["+prefix, "["+prefix+"\xff"
	}
	keys, err := s.c.ZRangeByLex(ctx, lk, &redis.ZRangeBy{Min: lo, Max: hi, Count: int64(limit)}).Result()
	if err != nil {
		return nil, fmt.Errorf("remote: list values: %w", err)
	}
	p := s.c.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = p.HMGet(ctx, s.valueKey(tenant, ns, k), "v", "d")
	}
	if len(keys) > 0 {
		if _, err := p.Exec(ctx); err != nil {
			return nil, fmt.Errorf("remote: list values: %w", err)
		}
	}
	out := make([]Value, 0, len(keys))
	var stale []any
	for i, cmd := range cmds {
		v, err := valueOf(keys[i], cmd.Val())
		if errors.Is(err, ErrNotFound) {
			stale = append(stale, keys[i])
			continue
		}
		if err != nil {
			return nil, err
		}
		if !strings.HasPrefix(v.Key, prefix) {
			continue
		}
		out = append(out, v)
	}
	if len(stale) > 0 {
		s.c.ZRem(ctx, lk, stale...)
	}
	return out, nil
}
