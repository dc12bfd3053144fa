package engine

// Restoring: the state sharing the longest prefix with a request, when it
// pays.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/kvsidecar/kvsidecar/kv"
)

func (c *LlamaCPP) pays(size int64, tokens int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.prefillMsTok.n == 0 || c.restoreMsMB.n == 0 {
		return true
	}
	return c.restoreMsMB.v*float64(size)/(1<<20) < c.prefillMsTok.v*float64(tokens)
}

func (c *LlamaCPP) restoreBest(ctx context.Context, req *Request, sl *slotInfo) {
	c.mu.Lock()
	off, layout := c.restoreOff, c.layout
	c.mu.Unlock()
	if off {
		return
	}
	for range 2 { // a state the tiers lost is dropped and the next best tried
		m, i, ok := c.cat.lookup(req.fp, req.chain)
		if !ok {
			c.restoreMiss.Add(1)
			return
		}
		expect := m.tokensAt(i)
		if expect < c.opts.MinSaveTokens || !c.pays(m.size, expect) {
			c.restoreSkips.Add(1)
			return
		}
		if layout != "" && m.layout != layout {
			c.refused.Add(1)
			return
		}
		start := time.Now()
		_, raw, tier, err := c.opts.Cache.LoadBlob(c.opts.Namespace, m.id)
		if errors.Is(err, kv.ErrNotFound) {
			c.cat.remove(m.id)
			continue
		}
		if err != nil {
			c.restoreErrs.Add(1)
			c.log.Warn("llamacpp: fetch saved state", "err", err)
			return
		}
		name := opFileName(m.id, sl.id, "restore")
		path := filepath.Join(c.opts.SlotDir, name)
		err = writeFileAtomic(c.opts.SlotDir, name, raw)
		if err == nil {
			_, err = c.api.slotAction(ctx, sl.id, "restore", name)
		}
		os.Remove(path)
		if err != nil {
			c.restoreErrs.Add(1)
			c.checkAPIError(sl.id, err)
			c.log.Warn("llamacpp: slot restore failed; the request will prefill", "slot", sl.id, "err", err)
			c.mu.Lock()
			if sl.sess == req.sk {
				sl.chain = chain{} // unknown now
			}
			c.mu.Unlock()
			return
		}
		d := time.Since(start)
		c.restores.Add(1)
		c.restoredB.Add(int64(len(raw)))
		c.restoreNs.Add(int64(d))
		if int(tier) < len(c.restoredFrom) {
			c.restoredFrom[tier].Add(1)
		}
		if m.sess != req.owner {
			c.prefixReuses.Add(1)
		}
		c.cat.touch(m, c.opts.Clock.Now())
		req.restore = &restoreInfo{expect: expect, ms: float64(d) / 1e6}
		c.mu.Lock()
		c.restoreMsMB.add(float64(d) / 1e6 / max(float64(len(raw))/(1<<20), 1e-3))
		if sl.sess == req.sk {
			sl.chain, sl.tokens = m.chain, m.tokens
		}
		if se, ok := c.sessions[req.sk]; ok {
			se.stats.Restores++
		}
		c.mu.Unlock()
		return
	}
}

type restoreInfo struct {
	expect int     // tokens the state should spare the engine
	ms     float64 // what the restore took
}
