package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// ensureProbe reports whether the connector is enabled, probing the slot
// API first if it has not been yet.
func (c *Connector) ensureProbe(ctx context.Context) bool {
	switch c.probe.Load() {
	case probeEnabled:
		return true
	case probeDisabled:
		return false
	}
	c.probeMu.Lock()
	defer c.probeMu.Unlock()
	if st := c.probe.Load(); st != probeUnknown {
		return st == probeEnabled
	}
	now := c.opts.Clock.Now()
	if !c.lastProbe.IsZero() && now.Sub(c.lastProbe) < c.opts.ProbeInterval {
		return false
	}
	c.lastProbe = now
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := c.api.slotAction(pctx, 0, "kvsidecar-probe", "kvsidecar-probe.slot")
	var api *errSlotAPI
	switch {
	case err == nil:
		c.probe.Store(probeEnabled)
	case errors.As(err, &api):
		if reason, ok := api.unsupported(); ok {
			c.disable(reason)
			return false
		}
		c.probe.Store(probeEnabled) // 400 "Invalid action": the API is there
	default:
		c.log.Debug("llamacpp: slot API probe failed; will retry", "err", err)
		return false
	}
	return true
}

// disable turns the connector off, warning once.
func (c *Connector) disable(reason string) {
	if c.probe.Swap(probeDisabled) == probeDisabled {
		return
	}
	c.mu.Lock()
	c.disabledReason = reason
	c.mu.Unlock()
	c.log.Warn("llamacpp connector disabled: requests pass through without slot save/restore",
		"reason", reason, "server", c.opts.BaseURL, "slot_dir", c.opts.SlotDir)
}

// checkAPIError disables the connector when err says the slot API is
// missing, and warns once about a slot id the server does not have.
func (c *Connector) checkAPIError(slot int, err error) {
	var api *errSlotAPI
	if !errors.As(err, &api) {
		return
	}
	if reason, ok := api.unsupported(); ok {
		c.disable(reason)
		return
	}
	if strings.Contains(strings.ToLower(api.msg), "invalid slot") && !c.warnedSlotID.Swap(true) {
		c.log.Warn("llamacpp: the server has no such slot: is --llamacpp-slots larger than its -np?", "slot", slot, "slots", c.opts.Slots)
	}
}

// verify checks, with GET /slots, that the server still holds what the
// connector believes its slots hold, and returns the model fingerprint.
// A slot that lost its KV (a virgin slot, a task counter that went back)
// means the server restarted, perhaps with another model: the slots are
// forgotten and the fingerprint taken again. "" means the server could not
// be fingerprinted; the request then passes untouched.
func (c *Connector) verify(ctx context.Context) string {
	restarted := false
	if !c.noSlots.Load() {
		ss, err := c.api.slots(ctx)
		var api *errSlotAPI
		switch {
		case errors.As(err, &api) && (api.status == 404 || api.status == 501 || api.status == 405):
			c.noSlots.Store(true)
			c.log.Warn("llamacpp: the server does not list its slots (started with --no-slots?): a restart of the server is noticed only when requests fail", "err", err)
		case err != nil:
			c.opts.HTTPClient.CloseIdleConnections() // the server went away: its connections are dead
			c.mu.Lock()
			c.fp = "" // unreachable: fingerprint again once it answers
			c.mu.Unlock()
			return ""
		default:
			c.mu.Lock()
			for _, s := range ss {
				if s.ID < 0 || s.ID >= len(c.sched.slots) {
					continue
				}
				sl := c.sched.slots[s.ID]
				task := -1
				if s.IDTask != nil {
					task = *s.IDTask
				}
				switch {
				case task < c.lastTask[s.ID] || task < 0 && sl.tokens > 0 && sl.inflight == 0:
					restarted = true // a task counter went back, or a slot is virgin again
				case sl.tokens > 0 && sl.inflight == 0 && !s.IsProcessing && abs(s.NPrompt-sl.tokens) > 3:
					// Someone else's request used the slot (a client talking
					// to the server directly): its KV is not what we think.
					c.slotsLost.Add(1)
					c.log.Debug("llamacpp: slot lost", "slot", s.ID, "n_prompt_tokens", s.NPrompt, "tokens", sl.tokens, "task", task, "preload", sl.preload)
					c.sched.lose(sl)
				}
				c.lastTask[s.ID] = task
			}
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	fp := c.fp
	c.mu.Unlock()
	if fp != "" && !restarted {
		return fp
	}
	return c.refresh(ctx, fp)
}

// refresh fingerprints the server and forgets what the slots held. Callers
// that saw the same stale fingerprint share one refresh.
func (c *Connector) refresh(ctx context.Context, stale string) string {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	c.mu.Lock()
	if c.fp != stale {
		fp := c.fp // another caller refreshed meanwhile
		c.mu.Unlock()
		return fp
	}
	probeSlot := c.sched.victim().id
	c.mu.Unlock()
	fp, err := c.api.fingerprint(ctx, probeSlot)
	if err != nil {
		c.log.Warn("llamacpp: cannot fingerprint the server's model; requests pass untouched until it answers", "err", err)
		return ""
	}
	c.mu.Lock()
	first := stale == "" && c.restarts.Load() == 0 && c.sched.seq == 0
	c.sched.reset()
	for i := range c.lastTask {
		c.lastTask[i] = -1
	}
	if fp != c.fp {
		c.layout = ""
		c.shift.reset() // another model
	}
	c.fp = fp
	c.restoreOff, c.unusedRun = false, 0
	for _, se := range c.sessions {
		se.stats.Slot = -1
	}
	c.mu.Unlock()
	if !first {
		// Connections kept alive to the old process are dead: drop them
		// rather than fail a request on each.
		c.opts.HTTPClient.CloseIdleConnections()
		c.restarts.Add(1)
		c.log.Info("llamacpp: the server (re)started or was unreachable: slots forgotten, states restored from the tiers", "fingerprint", fp)
	}
	return fp
}

// Forget drops a session: its records, its saved states, and its slot,
// which is erased on the server (action=erase) so its KV is gone there
// too. For DELETE /v1/sessions/{id}.
func (c *Connector) Forget(ctx context.Context, tenant, session string) error {
	sk := sessKey(tenant, session)
	c.mu.Lock()
	delete(c.sessions, sk)
	c.pred.remove(sk)
	erase := c.sched.forget(sk)
	c.mu.Unlock()
	var errs []error
	for _, m := range c.cat.session(sk) {
		c.cat.remove(m.id)
		if err := c.opts.Cache.DeleteBlob(c.opts.Namespace, m.id); err != nil && !errors.Is(err, kv.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if c.probe.Load() == probeEnabled {
		for _, id := range erase {
			c.ops[id].Lock()
			_, err := c.api.slotAction(ctx, id, "erase", "")
			c.ops[id].Unlock()
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine: llamacpp: forget: %w", err)
	}
	return nil
}

// engine.SessionStats returns a session's slot, saves, restores and timings.
func (c *Connector) SessionStats(tenant, session string) (engine.SessionStats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	se, ok := c.sessions[sessKey(tenant, session)]
	if !ok {
		return engine.SessionStats{}, false
	}
	return se.stats, true
}

// Stats returns the counters.
func (c *Connector) Stats() Stats {
	s := Stats{
		Stats: engine.Stats{
			Connector:       c.Name(),
			Enabled:         c.probe.Load() != probeDisabled,
			Slots:           c.opts.Slots,
			BackgroundCalls: c.bgCalls.Load(),
			ReusedTokens:    c.reusedTokens.Load(),
		},
		SlotHits:          c.slotHits.Load(),
		SlotAssigns:       c.assigns.Load(),
		Evictions:         c.evictions.Load(),
		Saves:             c.saver.saves.Load(),
		SaveErrors:        c.saver.errs.Load(),
		SaveEmpty:         c.saver.empty.Load(),
		ParseErrors:       c.saver.parseErrs.Load(),
		Restores:          c.restores.Load(),
		RestoreMisses:     c.restoreMiss.Load(),
		RestoreErrors:     c.restoreErrs.Load(),
		RestoreSkips:      c.restoreSkips.Load(),
		PrefixReuses:      c.prefixReuses.Load(),
		Refused:           c.refused.Load(),
		UnusedRestores:    c.unusedRestores.Load(),
		KVShifts:          c.shift.seen.Load(),
		KVShiftMisses:     c.shift.missed.Load(),
		ShiftsKV:          c.shift.verdict.Load() == shiftYes,
		Restarts:          c.restarts.Load(),
		SlotsLost:         c.slotsLost.Load(),
		StatesDeleted:     c.saver.deletes.Load(),
		SavedBytes:        c.saver.bytes.Load(),
		RestoredBytes:     c.restoredB.Load(),
		RestoreMsTotal:    float64(c.restoredMsTotal.Load()) / 1000,
		ReplacedPrefillMs: float64(c.replacedPrefillUs.Load()) / 1000,
		SharedPuts:        c.sharedPuts.Load(),
		SharedFetches:     c.sharedFetches.Load(),
		SharedErrors:      c.sharedErrs.Load(),
	}
	s.BackgroundCancelled, s.ClientWaits = c.bgCancelled.Load(), c.clientWaits.Load()
	pl := c.preloader
	s.Preloads, s.PreloadsUsed, s.PreloadsAbandoned = pl.preloads.Load(), pl.used.Load(), pl.abandoned.Load()
	s.PreloadWaits, s.PreloadErrors = pl.waits.Load(), pl.errs.Load()
	if s.Preloads > 0 {
		s.MeanPreloadMs = float64(pl.ns.Load()) / float64(s.Preloads) / 1e6
	}
	if s.Saves > 0 {
		s.MeanSaveMs = float64(c.saver.ns.Load()) / float64(s.Saves) / 1e6
	}
	if s.Restores > 0 {
		s.MeanRestoreMs = float64(c.restoreNs.Load()) / float64(s.Restores) / 1e6
	}
	for t := range c.restoredFrom {
		if n := c.restoredFrom[t].Load(); n > 0 {
			if s.RestoredFrom == nil {
				s.RestoredFrom = map[string]int64{}
			}
			s.RestoredFrom[tiers.Tier(t).String()] = n
		}
	}
	s.States, s.StateBytes = c.cat.size()
	s.StatesByTier, s.StateBytesByTier = map[string]int{}, map[string]int64{}
	c.opts.Cache.RangeBlobs(c.opts.Namespace, func(key string, _ kv.BlobMeta, t tiers.Tier) bool {
		s.StatesByTier[t.String()]++
		s.StateBytesByTier[t.String()] += c.cat.sizeOf(key)
		return true
	})
	c.ts.Fill(&s.Stats)
	c.mu.Lock()
	s.Sessions = len(c.sessions)
	s.DisabledReason = c.disabledReason
	s.QueueDepth = c.sched.pending()
	s.RestoresOff = c.restoreOff
	s.PreloadsWasted = c.sched.wasted
	c.mu.Unlock()
	return s
}

// Close stops the saver, then saves, unless NoSaveOnClose, every slot
// holding KV no stored state covers, so the tiers (and through them the
// Archive) keep it across a restart; then the connector passes every
// request through. Call it after the proxy stopped forwarding and before
// closing the kv.Cache. Idempotent.
func (c *Connector) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	close(c.done)
	c.saver.stop()
	if c.opts.NoSaveOnClose || c.probe.Load() != probeEnabled {
		return nil
	}
	c.saver.saveAll()
	return nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
