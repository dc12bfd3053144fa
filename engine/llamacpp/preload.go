package llamacpp

// Predictive preload (Options.Preload): while no client request is
// in flight, restore into an idle slot the state of the session expected
// to speak soonest, so its restore leaves the request path.

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/kv"
)

// preloader restores, off the request path, the state of the session
// expected to speak soonest into an idle slot whose KV is stored. It runs
// in the saver's goroutine, after the saves (tests call one); Before uses
// what it restored (useLocked) or waits for the restore under way (the
// slot's c.ops lock).
//
// It owns its counters and preloaded, what each slot's preload restored,
// which c.mu protects like the slots it describes. The slots, sessions,
// arrival history, fingerprint and layout it plans from are the
// connector's, under the connector's mu, reached through the back pointer.
type preloader struct {
	c         *Connector
	preloaded []restoreInfo // per slot: what its preload restored; c.mu protects it

	preloads, used, abandoned, waits, errs, ns atomic.Int64
}

func newPreloader(c *Connector, slots int) *preloader {
	return &preloader{c: c, preloaded: make([]restoreInfo, slots)}
}

// preloadPlan is one preload the connector decided on.
type preloadPlan struct {
	key  string // the session's scheduler key
	due  time.Time
	m    *stateMeta
	slot *slotInfo
}

// clientsBusyLocked counts the client requests in flight or on their way
// to a slot. Called with c.mu held.
func (p *preloader) clientsBusyLocked() int {
	return p.c.arriving + p.c.sched.clients()
}

// stateOf returns the newest state session key saved under the
// current model and layout, worth a restore; nil when none.
func (p *preloader) stateOf(key string, fp, layout string) *stateMeta {
	c := p.c
	l := c.cat.session(key)
	for i := len(l) - 1; i >= 0; i-- {
		m := l[i]
		if m.fp == fp && (layout == "" || m.layout == layout) && m.tokens >= c.opts.MinSaveTokens {
			return m
		}
	}
	return nil
}

// planLocked picks the session expected soonest that holds no slot,
// has a saved state and is not overdue by more than its usual gap, and the
// slot to restore it into: an idle slot
// whose KV is stored (a free one first, else the one whose occupant is
// expected latest), and only from an occupant expected later than that
// session or gone quiet, whose last request ended at least the background
// quiet period ago, or twice its own gap between follow-ups if longer (a
// client sending turns back to back keeps its slot, as it does against
// background calls). Nothing while a client request is in
// flight or arriving. (Background calls take a slot holding a preloaded
// state only when every slot holds one.) When an occupant's quiet period is
// all that stands in the way, wait says how long until it ends. Called
// with c.mu held.
func (p *preloader) planLocked(now time.Time) (plan preloadPlan, wait time.Duration, ok bool) {
	c := p.c
	if c.restoreOff || c.fp == "" || p.clientsBusyLocked() > 0 {
		return preloadPlan{}, 0, false
	}
	cands := c.pred.next(now, len(c.sched.slots)+4, c.sched.resident)
	for _, cd := range cands {
		if now.Sub(cd.due) > cd.gap {
			// Overdue by more than its usual gap: its rhythm did not hold
			// (say, the gap came from one follow-up); nothing says it
			// comes now.
			continue
		}
		m := p.stateOf(cd.key, c.fp, c.layout)
		if m == nil {
			continue
		}
		sl, wait := p.slotLocked(cd.due, now)
		if sl == nil {
			// Later candidates are due later still: no slot for them either.
			return preloadPlan{}, wait, false
		}
		return preloadPlan{key: cd.key, due: cd.due, m: m, slot: sl}, 0, true
	}
	return preloadPlan{}, 0, false
}

// slotLocked returns the slot a session due at due may take, or nil
// and how long until an occupant's quiet period ends (0: none would do).
// Called with c.mu held.
func (p *preloader) slotLocked(due, now time.Time) (*slotInfo, time.Duration) {
	c := p.c
	var free, best *slotInfo
	var bestDue time.Time
	var wait time.Duration
	for _, sl := range c.sched.slots {
		if sl.inflight > 0 || sl.preload == preloadReserved || sl.preload == preloadRestoring || sl.dirty {
			continue
		}
		if !sl.holds() {
			if free == nil || sl.lastUse < free.lastUse {
				free = sl
			}
			continue
		}
		at, expected, lapsed := c.pred.due(sl.sess, now)
		switch {
		case lapsed:
			at = time.Unix(1<<62, 0) // gone quiet: the first to go
		case !expected || !at.After(due):
			continue // expected as soon, or its history tells nothing: it stays
		}
		if left := sl.clientEnd.Add(c.holdLocked(sl)).Sub(now); !sl.clientEnd.IsZero() && left > 0 {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		if best == nil || at.After(bestDue) {
			best, bestDue = sl, at
		}
	}
	if free != nil {
		return free, 0
	}
	if best != nil {
		return best, 0
	}
	return nil, wait
}

// holdLocked is how long after its client's last request a slot is kept
// from background calls and preloads, as that client's next request may be
// on its way: the quiet period (BackgroundQuiet, adapted), or twice the
// session's own gap between follow-ups within a visit if longer. Called
// with c.mu held.
func (c *Connector) holdLocked(sl *slotInfo) time.Duration {
	hold := c.quiet
	if b, ok := c.pred.burst(sl.sess); ok && 2*b > hold {
		hold = 2 * b
	}
	return hold
}

// useLocked marks the state preloaded into sl used by req, its
// session's request, so that After checks the engine reused it. Called
// with c.mu held.
func (p *preloader) useLocked(req *request, sl *slotInfo) {
	sl.preload = preloadNone
	p.used.Add(1)
	r := p.preloaded[sl.id]
	req.restore = &r
}

// one preloads one session's state (see Options.Preload); it reports
// whether it did.
func (p *preloader) one() bool {
	ok, _ := p.try()
	return ok
}

// try is one that also says, when it preloaded nothing, how long until a
// slot's quiet period ends and a preload may be possible.
func (p *preloader) try() (bool, time.Duration) {
	c := p.c
	if c.closed.Load() || c.probe.Load() != probeEnabled {
		return false, 0
	}
	c.mu.Lock()
	plan, wait, ok := p.planLocked(c.opts.Clock.Now())
	if !ok {
		c.mu.Unlock()
		return false, wait
	}
	sl, m := plan.slot, plan.m
	sl.preload = preloadReserved
	ver := sl.version
	c.mu.Unlock()

	c.ops[sl.id].Lock()
	defer c.ops[sl.id].Unlock()
	start := c.opts.Clock.Now()
	_, raw, _, err := c.opts.Cache.LoadBlob(c.opts.Namespace, m.id)
	if errors.Is(err, kv.ErrNotFound) {
		c.cat.remove(m.id)
	}
	c.mu.Lock()
	switch {
	case sl.version != ver || sl.preload != preloadReserved:
		// A client request took the slot meanwhile: its placement ended
		// the reservation.
		p.abandoned.Add(1)
		c.mu.Unlock()
		return false, 0
	case err != nil:
		sl.preload = preloadNone
		c.mu.Unlock()
		if !errors.Is(err, kv.ErrNotFound) {
			p.errs.Add(1)
			c.log.Warn("llamacpp: preload: fetch saved state", "err", err)
		}
		return false, 0
	case p.clientsBusyLocked() > 0 || c.sched.resident(plan.key):
		// A client request is on its way (to this slot's occupant, or
		// anywhere: a restore would hold up the engine's loop), or the
		// session found a slot of its own: give up before the engine is
		// asked; the slot keeps its occupant.
		sl.preload = preloadNone
		p.abandoned.Add(1)
		c.mu.Unlock()
		return false, 0
	}
	// The slot becomes the session's: its request now finds it resident
	// and waits for the restore below rather than run one of its own.
	prev := sl.sess
	c.sched.seq++
	sl.sess, sl.owner = plan.key, plan.key
	sl.chain, sl.next, sl.tokens = chain{}, chain{}, 0
	sl.dirty, sl.saveFailed, sl.computeMs = false, false, 0
	sl.version++
	sl.lastUse = c.sched.seq
	sl.preload = preloadRestoring
	ver = sl.version
	if ps, ok := c.sessions[prev]; ok && prev != plan.key {
		ps.stats.Slot = -1
	}
	if se, ok := c.sessions[plan.key]; ok {
		se.stats.Slot = sl.id
	}
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.opts.SlotTimeout)
	defer cancel()
	err = c.restoreInto(ctx, sl.id, m.id, raw)
	d := c.opts.Clock.Now().Sub(start)
	if err != nil {
		p.errs.Add(1)
		c.mu.Lock()
		if sl.version == ver {
			sl.preload, sl.chain = preloadNone, chain{} // unknown now
		}
		c.mu.Unlock()
		c.checkAPIError(sl.id, err)
		c.log.Warn("llamacpp: preload: slot restore failed", "slot", sl.id, "err", err)
		return false, 0
	}
	p.preloads.Add(1)
	p.ns.Add(int64(d))
	c.cat.touch(m, c.opts.Clock.Now())
	// The server's token count of a restored slot (GET /slots
	// n_prompt_tokens, which tells another client's use of the slot) is not
	// always the file's: ask it, so the next request does not take the
	// difference for a foreign use. Unknown (0) if it does not answer.
	tokens := 0
	if !c.noSlots.Load() {
		if ss, err := c.api.slots(ctx); err == nil {
			for _, st := range ss {
				if st.ID == sl.id && !st.IsProcessing {
					tokens = st.NPrompt
				}
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.restoreMsMB.add(float64(d) / 1e6 / max(float64(len(raw))/(1<<20), 1e-3))
	if se, ok := c.sessions[plan.key]; ok {
		se.stats.Preloads++
	}
	if sl.version != ver {
		c.sched.wasted++ // another session took the slot during the restore
		return true, 0
	}
	sl.chain, sl.tokens = m.chain, tokens
	sl.preload = preloadLoaded
	c.log.Debug("llamacpp: preloaded", "session", plan.key, "slot", sl.id, "replaced", prev, "due_in", plan.due.Sub(start), "ms", float64(d)/1e6)
	p.preloaded[sl.id] = restoreInfo{expect: m.tokens, ms: float64(d) / 1e6}
	return true, 0
}
