package llamacpp

// Restoring: the state sharing the longest prefix with a request, when it
// pays.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/kv"
)

// costSamples is how many restores are timed before their rate decides
// against one: a restore timed by the sidecar's clock while the machine
// was busy (the first after a start reads cold files) is not a rate, and
// deciding on it left a returning session to prefill its whole prompt
// (TestRealEngineRestoresAfterSidecarKill9 failed 3 times in 20 on a
// loaded machine). A prefill's rate is the engine's own timing.
const costSamples = 3

// pays reports whether restoring size bytes beats prefilling tokens, by
// the measured costs; until a prefill is measured and costSamples restores
// are, it assumes so (a restore reads a file, a prefill runs the model).
func (c *Connector) pays(size int64, tokens int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.prefillMsTok.n == 0 || c.restoreMsMB.n < costSamples {
		return true
	}
	return c.restoreMsMB.v*float64(size)/(1<<20) < c.prefillMsTok.v*float64(tokens)
}

// restoreBest restores into sl the state sharing the longest prefix with
// the request, when there is one that pays and it covers more than the
// first have pieces of the prompt (what the slot already holds; -1 for
// nothing). With a shared store, a state there that covers more than the
// local catalog's best is fetched into the tiers first.
func (c *Connector) restoreBest(ctx context.Context, req *request, sl *slotInfo, have int) {
	c.mu.Lock()
	off, layout := c.restoreOff, c.layout
	c.mu.Unlock()
	if off {
		return
	}
	if c.opts.Shared != nil {
		c.fetchShared(ctx, req)
	}
	for range 2 { // a state the tiers lost is dropped and the next best tried
		m, i, ok := c.cat.lookup(req.fp, req.chain)
		if !ok || i <= have {
			if have < 0 {
				c.restoreMiss.Add(1)
			}
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
		start := c.opts.Clock.Now()
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
		if err := c.restoreInto(ctx, sl.id, m.id, raw); err != nil {
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
		d := c.opts.Clock.Now().Sub(start)
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

// restoreInfo is what Before restored for a request, for After's check
// that the engine reused it.
type restoreInfo struct {
	expect int     // tokens the state should spare the engine
	ms     float64 // what the restore took
}

// refreshResident restores over a slot the session already holds when the
// shared store has a state of the session's prompt that covers more than
// the slot does: the turns the session had on other replicas since it was
// last here.
func (c *Connector) refreshResident(ctx context.Context, req *request, sl *slotInfo) {
	c.ops[sl.id].Lock()
	defer c.ops[sl.id].Unlock()
	c.mu.Lock()
	alone := sl.sess == req.sk && sl.inflight == 1
	have := -1
	if alone {
		for i := range min(sl.chain.len(), req.chain.len()) {
			if sl.chain.hashes[i] != req.chain.hashes[i] {
				break
			}
			have = i
		}
	}
	c.mu.Unlock()
	if alone {
		c.restoreBest(ctx, req, sl, have)
	}
}

// fetchShared asks the shared store for the state sharing the longest
// prefix with the request and, when it covers more than the local
// catalog's best, takes it into the tiers and the catalog. Errors only
// cost the restore.
func (c *Connector) fetchShared(ctx context.Context, req *request) {
	if req.chain.len() == 0 {
		return
	}
	local := -1
	if _, i, ok := c.cat.lookup(req.fp, req.chain); ok {
		local = i
	}
	id, n, err := c.opts.Shared.LookupState(ctx, req.fp, hashStrings(req.chain.hashes))
	if err != nil {
		c.sharedError("look up a shared state", err)
		return
	}
	if n-1 <= local || id == "" {
		return
	}
	if _, _, err := c.opts.Cache.StatBlob(c.opts.Namespace, id); err == nil {
		return // already here, under another prefix's entry
	}
	raw, aux, err := c.opts.Shared.GetState(ctx, id)
	if err != nil {
		if !errors.Is(err, engine.ErrSharedNotFound) {
			c.sharedError("fetch a shared state", err)
		}
		return
	}
	m, err := parseStateMeta(aux)
	if err != nil || m.fp != req.fp || int64(len(raw)) > c.opts.MaxStateBytes {
		c.sharedError("fetch a shared state", fmt.Errorf("state %s: metadata unreadable or for another model", id))
		return
	}
	m.id, m.size = id, int64(len(raw))
	if err := c.opts.Cache.PutBlob(c.opts.Namespace, id, kv.BlobMeta{Aux: aux}, raw); err != nil {
		c.sharedError("keep a shared state", err)
		return
	}
	c.sharedFetches.Add(1)
	for _, d := range c.cat.add(m, c.opts.statesKept(m.sess)) {
		c.saver.drop(d.id)
	}
}

func (c *Connector) sharedError(op string, err error) {
	c.sharedErrs.Add(1)
	if !c.warnedShared.Swap(true) {
		c.log.Warn("llamacpp: shared state store: "+op+" failed; requests go on with local states (warned once)", "err", err)
	}
}

// restoreInto hands the engine the saved state raw (of catalog entry id)
// through a file in the slot folder and asks it to restore slot from it;
// the file is removed either way.
func (c *Connector) restoreInto(ctx context.Context, slot int, id string, raw []byte) error {
	name := opFileName(id, slot, "restore")
	err := writeFileAtomic(c.opts.SlotDir, name, raw)
	if err == nil {
		_, err = c.api.slotAction(ctx, slot, "restore", name)
	}
	os.Remove(filepath.Join(c.opts.SlotDir, name))
	return err
}
