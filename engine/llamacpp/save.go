package llamacpp

// Saving slots: the background saver, a slot save into the cache, and
// the files the server and the connector share.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/kv"
)

// saver saves slots holding unsaved KV once they are idle, one at a time,
// until Close.
func (c *Connector) saver() {
	defer c.wg.Done()
	var again <-chan time.Time // a preload waits for a slot's quiet period
	for {
		select {
		case <-c.done:
			return
		case <-c.kick:
		case <-again:
		}
		again = nil
		for !c.opts.NoBackgroundSave && !c.closed.Load() && c.saveOne() {
		}
		// Preload once the slots' KV is saved: a preload takes only a slot
		// whose KV is stored.
		for i := 0; c.opts.Preload && i < c.opts.Slots && !c.closed.Load(); i++ {
			ok, wait := c.tryPreload()
			if !ok {
				if wait > 0 {
					again = c.opts.Clock.After(wait)
				}
				break
			}
		}
	}
}

// saveOne saves the least recently used idle slot with unsaved KV; it
// reports whether there was one.
func (c *Connector) saveOne() bool {
	c.mu.Lock()
	sl := c.sched.saveCandidate()
	if sl == nil {
		c.mu.Unlock()
		return false
	}
	id, ver := sl.id, sl.version
	c.mu.Unlock()
	c.saveIdle(sl, id, ver)
	return true
}

// Settle saves now, in the caller's goroutine, the KV that req (already
// After'ed) left in its slot, when no stored state covers it yet, and so
// writes it through to the shared store; it returns once that is done (or
// failed), or at once when there is nothing to save. A fleet releases a
// session's lease after it, so the replica that serves the next turn
// finds this turn's KV. Bounded by the slot timeout.
func (c *Connector) Settle(ctx context.Context, er *engine.Request) {
	req := requestOf(er)
	if c.closed.Load() || req.slot < 0 || req.slot >= len(c.ops) || req.sk == "" || req.Background {
		return
	}
	c.mu.Lock()
	sl := c.sched.slots[req.slot]
	if sl.sess != req.sk {
		c.mu.Unlock()
		return
	}
	ver := sl.version
	c.mu.Unlock()
	c.saveIdle(sl, sl.id, ver)
}

// saveIdle saves slot id (sl) if it still holds content version ver,
// unsaved and idle.
func (c *Connector) saveIdle(sl *slotInfo, id int, ver uint64) {
	c.ops[id].Lock()
	defer c.ops[id].Unlock()
	c.mu.Lock()
	if sl.version != ver || !sl.dirty || sl.saveFailed || sl.inflight > 0 {
		c.mu.Unlock()
		return // it changed meanwhile: the caller looks again
	}
	owner, ch, fp, extra := sl.owner, sl.chain, c.fp, sl.computeMs
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.SlotTimeout)
	ok := c.saveSlot(ctx, id, owner, ch, fp, extra)
	cancel()
	c.mu.Lock()
	if sl.version == ver {
		if ok {
			sl.dirty, sl.computeMs = false, 0
			if strings.HasPrefix(sl.sess, "~") {
				sl.sess = ""
			}
		} else {
			sl.saveFailed = true // retried once the content changes
		}
	}
	c.mu.Unlock()
}

// Flush saves now, in the caller's goroutine, what the background saver
// would save next: every idle slot holding KV no stored state covers. It
// returns once none is left. For tests, benchmarks and tools; the request
// path never waits for it.
func (c *Connector) Flush() {
	for !c.closed.Load() && c.saveOne() {
	}
}

// QueueDepth returns the slots whose KV waits for a background save.
func (c *Connector) QueueDepth() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sched.pending()
}

var errEmptySlot = errors.New("engine: llamacpp: the slot holds no KV")

// saveSlot saves slot's KV, which covers ch for owner (a session) under model
// fingerprint fp, as a state in the cache (GetOrComputeBlob: a state
// already stored under that key is not saved again), and indexes it,
// dropping the states it supersedes. extraMs is the prefill the state
// spares, which the cache counts in the compute's cost. The caller holds
// the slot's op lock. It reports whether a state covers the slot now.
func (c *Connector) saveSlot(ctx context.Context, slot int, owner string, ch chain, fp string, extraMs float64) bool {
	if ch.len() == 0 || fp == "" {
		return false
	}
	start := time.Now()
	meta := &stateMeta{id: stateKey(fp, owner, ch), sess: owner, fp: fp, chain: ch, created: c.opts.Clock.Now()}
	meta.used = meta.created
	var saved, savedAux []byte // for the shared store
	_, out, err := c.opts.Cache.GetOrComputeBlob(ctx, c.opts.Namespace, meta.id, func(ctx context.Context) (kv.BlobMeta, []byte, time.Duration, error) {
		raw, err := c.saveFile(ctx, slot, meta.id)
		if err != nil {
			return kv.BlobMeta{}, nil, 0, err
		}
		st, err := parseSlotState(raw, 0)
		if err != nil {
			c.parseErrs.Add(1)
			if !c.warnedParse.Swap(true) {
				c.log.Warn("llamacpp: slot state file not in the expected layout; not kept", "err", err, "bytes", len(raw))
			}
			return kv.BlobMeta{}, nil, 0, err
		}
		if len(st.Tokens) == 0 && st.Cells() == 0 {
			return kv.BlobMeta{}, nil, 0, errEmptySlot
		}
		meta.tokens, meta.size, meta.layout = len(st.Tokens), int64(len(raw)), layoutOf(st)
		c.mu.Lock()
		if c.fp == fp && c.layout == "" {
			c.layout = meta.layout
		}
		c.mu.Unlock()
		saved, savedAux = raw, appendStateMeta(nil, meta)
		return kv.BlobMeta{Aux: savedAux}, raw, time.Duration(extraMs * float64(time.Millisecond)), nil
	})
	switch {
	case errors.Is(err, errEmptySlot):
		c.saveEmpty.Add(1)
		return false
	case err != nil:
		c.saveErrs.Add(1)
		if !c.warnedStore.Swap(true) || !errors.Is(err, ErrSlotState) {
			c.log.Warn("llamacpp: saving a slot's KV failed; the session's older state, if any, is kept", "slot", slot, "err", err)
		}
		return false
	case !out.Computed:
		return true // that prefix was stored already
	}
	c.saves.Add(1)
	c.savedB.Add(meta.size)
	c.saveNs.Add(int64(time.Since(start)))
	if c.opts.Shared != nil && saved != nil {
		if err := c.opts.Shared.PutState(ctx, fp, meta.id, hashStrings(ch.hashes), saved, savedAux); err != nil {
			c.sharedError("write a state through", err)
		} else {
			c.sharedPuts.Add(1)
		}
	}
	for _, d := range c.cat.add(meta, c.keep(owner)) {
		c.dropState(d.id)
	}
	for {
		n, _ := c.cat.size()
		o := c.cat.oldest()
		if n <= c.opts.MaxStates || o == nil {
			break
		}
		c.cat.remove(o.id)
		c.dropState(o.id)
	}
	c.mu.Lock()
	if se, ok := c.sessions[owner]; ok {
		se.stats.Saves++
		se.stats.SavedTokens = meta.tokens
		se.stats.SavedBytes = meta.size
	}
	c.mu.Unlock()
	return true
}

func (c *Connector) dropState(id string) {
	if err := c.opts.Cache.DeleteBlob(c.opts.Namespace, id); err != nil && !errors.Is(err, kv.ErrNotFound) {
		c.log.Warn("llamacpp: delete a superseded state", "err", err)
		return
	}
	c.deletes.Add(1)
}

// saveFile has the server save slot into SlotDir and returns the file's
// bytes; the file is removed whatever happens.
func (c *Connector) saveFile(ctx context.Context, slot int, key string) ([]byte, error) {
	name := opFileName(key, slot, "save")
	path := filepath.Join(c.opts.SlotDir, name)
	defer os.Remove(path)
	if _, err := c.api.slotAction(ctx, slot, "save", name); err != nil {
		c.checkAPIError(slot, err)
		return nil, err
	}
	raw, err := readBounded(path, c.opts.MaxStateBytes)
	if errors.Is(err, fs.ErrNotExist) && !c.warnedDir.Swap(true) {
		c.log.Warn("llamacpp: the server saved a slot but its file is not in the slot dir: is --llamacpp-slot-dir the server's --slot-save-path?",
			"slot_dir", c.opts.SlotDir)
	}
	return raw, err
}

// layoutOf names a state's KV layout: layer count, transposition, and per
// layer the element types and bytes per token. A state restores only into
// a server with the same layout.
func layoutOf(st *slotState) string {
	h := sha256.New()
	for i := range st.Streams {
		s := &st.Streams[i]
		if len(s.Cells) == 0 {
			continue
		}
		fmt.Fprintf(h, "%d/%t", len(s.Layers), s.VTrans)
		for _, l := range s.Layers {
			fmt.Fprintf(h, "|%d:%d:%d:%d:%d:%d", l.KType, l.KRowBytes, l.VType, l.VRowBytes, l.VElemSize, l.VEmbd)
		}
		break
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("slot file of %d bytes, at most %d", fi.Size(), limit)
	}
	buf := bytes.NewBuffer(make([]byte, 0, fi.Size()+1))
	if _, err := buf.ReadFrom(io.LimitReader(f, limit+1)); err != nil {
		return nil, err
	}
	if int64(buf.Len()) > limit {
		return nil, fmt.Errorf("slot file over %d bytes", limit)
	}
	return buf.Bytes(), nil
}

// writeFileAtomic writes data to dir/name through a temporary file and a
// rename, so the server never reads a partial file. Not fsynced: the file
// lives only until the server read it. Readable by the server's user.
func writeFileAtomic(dir, name string, data []byte) error {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".tmp-"+name+"-"+hex.EncodeToString(rnd[:]))
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// recoverSlotDir removes what an interrupted save or restore of an earlier
// run left in SlotDir: the connector's own files only.
func (c *Connector) recoverSlotDir() {
	es, err := os.ReadDir(c.opts.SlotDir)
	if err != nil {
		return
	}
	n := 0
	for _, e := range es {
		name := e.Name()
		if e.Type().IsRegular() && (strings.HasPrefix(name, "kvsidecar-") || strings.HasPrefix(name, ".tmp-kvsidecar-")) {
			if os.Remove(filepath.Join(c.opts.SlotDir, name)) == nil {
				n++
			}
		}
	}
	if n > 0 {
		c.log.Info("llamacpp: removed files an interrupted run left in the slot dir", "files", n)
	}
}
