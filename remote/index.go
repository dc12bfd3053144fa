package remote

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The prefix index maps prefix hashes to the id of a stored state, per
// tenant and space (a model fingerprint): one key per hash, so each entry
// expires on its own, and all of a space's keys share a hash tag, so a
// lookup of many hashes is one MGET even on a cluster. A hash names the
// newest state written for it.

// IndexPut points each of hashes at id in the tenant's space, in one
// pipeline. The TTL is set on each entry.
func (s *Store) IndexPut(ctx context.Context, tenant, space string, hashes []string, id string) error {
	if err := checkToken("tenant", tenant); err != nil {
		return err
	}
	if err := checkToken("index space", space); err != nil {
		return err
	}
	if err := checkToken("state id", id); err != nil {
		return err
	}
	if len(hashes) == 0 {
		return nil
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	p := s.c.Pipeline()
	for _, h := range hashes {
		if err := checkToken("prefix hash", h); err != nil {
			return err
		}
		p.Set(ctx, s.indexKey(tenant, space, h), id, s.opts.TTL)
	}
	if _, err := p.Exec(ctx); err != nil {
		return fmt.Errorf("remote: index put: %w", err)
	}
	return nil
}

// IndexGet returns, for each of hashes, the state id it names ("" when
// none), in one MGET. A longest-prefix lookup passes a prompt's hashes
// shortest first and takes the last non-empty answer.
func (s *Store) IndexGet(ctx context.Context, tenant, space string, hashes []string) ([]string, error) {
	if err := checkToken("tenant", tenant); err != nil {
		return nil, err
	}
	if err := checkToken("index space", space); err != nil {
		return nil, err
	}
	out := make([]string, len(hashes))
	if len(hashes) == 0 {
		return out, nil
	}
	keys := make([]string, len(hashes))
	for i, h := range hashes {
		if err := checkToken("prefix hash", h); err != nil {
			return nil, err
		}
		keys[i] = s.indexKey(tenant, space, h)
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	vals, err := s.c.MGet(ctx, keys...).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("remote: index get: %w", err)
	}
	for i, v := range vals {
		if str, ok := v.(string); ok {
			out[i] = str
		}
	}
	return out, nil
}

// compareDelete deletes KEYS[1] when it holds ARGV[1]; 1 if deleted.
var compareDelete = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)
