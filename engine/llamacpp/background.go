package llamacpp

import (
	"context"
	"fmt"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
)

// beforeBackground places a background call: one at a time (the bg
// token), on an idle, quiet slot, never while a client request is on its
// way to a slot; bounded by ctx and the slot timeout.
func (c *Connector) beforeBackground(ctx, sctx context.Context, req *request) ([]byte, error) {
	busy := func(err error) ([]byte, error) {
		return nil, fmt.Errorf("engine: llamacpp: background call: %w (%w)", engine.ErrBusy, err)
	}
	select {
	case c.bg <- struct{}{}:
	case <-ctx.Done():
		return busy(context.Cause(ctx))
	case <-sctx.Done():
		return busy(sctx.Err())
	case <-c.done:
		return busy(errClosed)
	}
	req.bgHeld = true // After gives the token back
	c.mu.Lock()
	var p placement
	for {
		var (
			wait time.Duration
			ok   bool
		)
		if c.arriving == 0 {
			wasted := c.sched.wasted
			now := c.opts.Clock.Now()
			var avoid *slotInfo
			if c.opts.Preload && len(c.sched.slots) > 1 && c.bgSeconds.n > 0 {
				// A call that would still run when the session expected
				// next comes leaves it the slot its preload takes (it
				// would be cancelled then, and the session restored on
				// its path); with one slot, or a session expected later,
				// the call goes first.
				if plan, _, ok := c.preloader.planLocked(now); ok && plan.due.Before(now.Add(seconds(c.bgSeconds.v))) {
					avoid = plan.slot
				}
			}
			p, wait, ok = c.sched.placeBackground(req.chain, now, c.holdLocked, avoid)
			if c.sched.wasted != wasted {
				c.log.Debug("llamacpp: a preloaded state wasted by a background call", "slot", p.slot.id, "preloaded", p.prevSess)
			}
		}
		if ok {
			break
		}
		changed := c.changed
		c.bgWaiting++
		c.mu.Unlock()
		var quiet <-chan time.Time
		if wait > 0 {
			quiet = c.opts.Clock.After(wait)
		}
		var err error
		select {
		case <-changed:
		case <-quiet:
		case <-ctx.Done():
			err = context.Cause(ctx)
		case <-sctx.Done():
			err = sctx.Err()
		case <-c.done:
			err = errClosed
		}
		c.mu.Lock()
		c.bgWaiting--
		if err != nil {
			c.mu.Unlock()
			return busy(err)
		}
	}
	c.seq++
	req.sk, req.owner = "", ""
	req.assigned, req.slot = true, p.slot.id
	if ps, ok := c.sessions[p.prevSess]; ok {
		ps.stats.Slot = -1
	}
	if req.Cancel != nil {
		c.bgReqs[req] = struct{}{}
	}
	req.placedAt = c.opts.Clock.Now()
	c.mu.Unlock()
	c.bgCalls.Add(1)
	c.assigns.Add(1)
	if p.prevDirty {
		c.ops[p.slot.id].Lock()
		c.evictions.Add(1)
		c.saver.save(sctx, p.slot.id, p.prevOwner, p.prevChain, req.fp, 0)
		c.ops[p.slot.id].Unlock()
	}
	return c.rewrite(req)
}

// preemptLocked cancels the background calls in flight on slot: a client
// request takes the slot. Called with c.mu held.
func (c *Connector) preemptLocked(slot int) {
	for r := range c.bgReqs {
		if r.slot == slot {
			delete(c.bgReqs, r)
			r.Cancel(engine.ErrPreempted)
			c.bgCancelled.Add(1)
			// The clients pause longer than the quiet period: wait longer.
			r.preempted = true
			c.quiet = min(2*c.quiet, 16*c.opts.BackgroundQuiet)
		}
	}
}

// signalLocked wakes the background calls waiting for a slot: a slot's
// requests or the clients arriving changed. Called with c.mu held.
func (c *Connector) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}
