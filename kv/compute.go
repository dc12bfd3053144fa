package kv

// Get-or-compute: one compute per key however many callers ask at once,
// shared by blocks (GetOrCompute) and blobs (GetOrComputeBlob).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// Outcome says how GetOrCompute produced its block.
type Outcome struct {
	// Tier served the block; TierNone when it was computed.
	Tier tiers.Tier
	// Computed is true when this call ran compute.
	Computed bool
	// Shared is true when another call's compute produced the block.
	Shared bool
}

type flight struct {
	done chan struct{}
	val  any
	err  error
}

// GetOrCompute returns the block cached for memoryID and query, or runs
// compute, caches its block and returns it. Concurrent calls for one key
// run compute once; the others wait for it (or for their ctx). A failed
// compute is not cached: its error goes to every caller waiting on it, and
// the next call computes again. If the computing caller's ctx ends, waiters
// whose own ctx is still live compute themselves.
func (c *Cache) GetOrCompute(ctx context.Context, memoryID, query string, compute func(context.Context) (*Block, error)) (*Block, Outcome, error) {
	h := QueryHash(query)
	key := cacheKey(memoryID, h)
	return getOrCompute(c, ctx, key, memoryID,
		func() (*Block, tiers.Tier, time.Duration, error) { return c.get(key) },
		func(ctx context.Context) (*Block, time.Duration, error) {
			b, err := runCompute(ctx, compute)
			return b, 0, err
		},
		func(b *Block) error { return c.put(memoryID, h, b, tiers.Hint{}) })
}

// getOrCompute is the get-or-compute protocol over one store key, shared by
// blocks and blobs: lookup, else one compute per key however many callers
// ask (the others wait), then store unless memoryID was invalidated
// meanwhile (blobs pass "", which is never invalidated). The compute's own duration plus the extra cost it
// reports (work done outside this call, such as an engine's prefill) is
// what AmortizationStats count as C_compute.
func getOrCompute[T any](c *Cache, ctx context.Context, key, memoryID string,
	lookup func() (T, tiers.Tier, time.Duration, error),
	compute func(context.Context) (T, time.Duration, error),
	store func(T) error,
) (T, Outcome, error) {
	var zero T
	for {
		landed := c.landed.Load()
		v, t, d, err := lookup()
		if err == nil {
			c.hits.Add(1)
			c.amort.load(t, d)
			return v, Outcome{Tier: t}, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return zero, Outcome{}, err
		}
		c.mu.Lock()
		if f, ok := c.flights[key]; ok {
			c.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return zero, Outcome{}, fmt.Errorf("kv: get or compute: %w", ctx.Err())
			}
			if f.err != nil && ctx.Err() == nil && (errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) {
				continue // the computing caller gave up, not the compute
			}
			if f.err != nil {
				return zero, Outcome{}, f.err
			}
			c.hits.Add(1)
			c.amort.shared()
			return f.val.(T), Outcome{Shared: true}, nil
		}
		if c.landed.Load() != landed {
			// A flight ended between the lookup and the lock, after
			// storing its value: look again rather than compute twice.
			c.mu.Unlock()
			continue
		}
		f := &flight{done: make(chan struct{})}
		c.flights[key] = f
		gen := c.gens[memoryID]
		c.mu.Unlock()
		c.misses.Add(1)

		start := time.Now()
		val, extra, err := compute(ctx)
		c.amort.compute(time.Since(start) + extra)
		if err == nil {
			c.mu.Lock()
			stale := c.gens[memoryID] != gen
			c.mu.Unlock()
			if !stale {
				err = store(val)
			}
		}
		f.val, f.err = val, err
		c.mu.Lock()
		delete(c.flights, key)
		c.landed.Add(1)
		c.mu.Unlock()
		close(f.done)
		if err != nil {
			return zero, Outcome{}, err
		}
		return val, Outcome{Computed: true}, nil
	}
}

func runCompute(ctx context.Context, compute func(context.Context) (*Block, error)) (b *Block, err error) {
	defer func() {
		if r := recover(); r != nil {
			b, err = nil, fmt.Errorf("kv: compute panicked: %v", r)
		}
	}()
	b, err = compute(ctx)
	if err != nil {
		return nil, fmt.Errorf("kv: compute: %w", err)
	}
	if b == nil {
		return nil, fmt.Errorf("kv: compute returned no block: %w", ErrInvalid)
	}
	return b, nil
}
