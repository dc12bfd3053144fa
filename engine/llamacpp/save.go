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
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/kv"
)

// saver saves slots' KV into the cache and keeps the states it saves. It
// owns the connector's one goroutine (run): woken by After, it saves, one
// at a time, the least recently used idle slot holding KV no stored state
// covers until none is left, then lets the preloader fill idle slots (a
// preload takes only a slot whose KV is stored). Before saves a displaced
// occupant through it on the request path, Settle and ExportStates a
// session's slot, Close what every slot holds.
//
// It owns its wake-up and stop channels, its goroutine (start, stop: stop
// waits) and its counters. The slots, sessions and fingerprint it reads
// and updates are the connector's, under the connector's mu, reached
// through the back pointer; a slot's operations run under its c.ops lock.
type saver struct {
	c *Connector

	kick chan struct{} // After: a slot may need saving, or a preload may be due
	quit chan struct{} // closed by stop
	wg   sync.WaitGroup

	saves, errs, empty, parseErrs, bytes, ns, deletes atomic.Int64
	warnedParse, warnedDir, warnedStore               atomic.Bool
}

func newSaver(c *Connector) *saver {
	return &saver{c: c, kick: make(chan struct{}, 1), quit: make(chan struct{})}
}

// start starts the goroutine; stop stops it and waits for it.
func (s *saver) start() {
	s.wg.Add(1)
	go s.run()
}

func (s *saver) stop() {
	close(s.quit)
	s.wg.Wait()
}

// wake tells the goroutine to look for work; it never blocks.
func (s *saver) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run saves slots holding unsaved KV once they are idle, one at a time,
// then preloads, until stop.
func (s *saver) run() {
	defer s.wg.Done()
	c := s.c
	var again <-chan time.Time // a preload waits for a slot's quiet period
	for {
		select {
		case <-s.quit:
			return
		case <-s.kick:
		case <-again:
		}
		again = nil
		for !c.opts.NoBackgroundSave && !c.closed.Load() && s.saveOne() {
		}
		// Preload once the slots' KV is saved: a preload takes only a slot
		// whose KV is stored.
		for i := 0; c.opts.Preload && i < c.opts.Slots && !c.closed.Load(); i++ {
			ok, wait := c.preloader.try()
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
func (s *saver) saveOne() bool {
	c := s.c
	c.mu.Lock()
	sl := c.sched.saveCandidate()
	if sl == nil {
		c.mu.Unlock()
		return false
	}
	id, ver := sl.id, sl.version
	c.mu.Unlock()
	s.saveIdle(sl, id, ver)
	return true
}

// settle saves the KV that req (already After'ed) left in its slot, when
// its session still holds the slot; see Connector.Settle.
func (s *saver) settle(req *request) {
	c := s.c
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
	s.saveIdle(sl, sl.id, ver)
}

// settleSession saves the KV the session's slot holds, when idle and not
// covered by a stored state yet.
func (s *saver) settleSession(sk string) {
	c := s.c
	if c.closed.Load() || c.probe.Load() != probeEnabled {
		return
	}
	c.mu.Lock()
	var sl *slotInfo
	for _, x := range c.sched.slots {
		if x.sess == sk {
			sl = x
			break
		}
	}
	if sl == nil {
		c.mu.Unlock()
		return
	}
	ver := sl.version
	c.mu.Unlock()
	s.saveIdle(sl, sl.id, ver)
}

// saveIdle saves slot id (sl) if it still holds content version ver,
// unsaved and idle.
func (s *saver) saveIdle(sl *slotInfo, id int, ver uint64) {
	c := s.c
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
	ok := s.save(ctx, id, owner, ch, fp, extra)
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

// saveAll saves every slot holding KV no stored state covers, busy or
// not, once: for Close, after stop.
func (s *saver) saveAll() {
	c := s.c
	for {
		c.mu.Lock()
		sl := c.sched.saveCandidate()
		if sl == nil {
			c.mu.Unlock()
			return
		}
		id, sess, ch, fp, extra := sl.id, sl.owner, sl.chain, c.fp, sl.computeMs
		sl.dirty = false
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.SlotTimeout)
		c.ops[id].Lock()
		s.save(ctx, id, sess, ch, fp, extra)
		c.ops[id].Unlock()
		cancel()
	}
}

var errEmptySlot = errors.New("engine: llamacpp: the slot holds no KV")

// save saves slot's KV, which covers ch for owner (a session) under model
// fingerprint fp, as a state in the cache (GetOrComputeBlob: a state
// already stored under that key is not saved again), and keeps it,
// dropping the states it supersedes. extraMs is the prefill the state
// spares, which the cache counts in the compute's cost. The caller holds
// the slot's op lock. It reports whether a state covers the slot now.
func (s *saver) save(ctx context.Context, slot int, owner string, ch chain, fp string, extraMs float64) bool {
	c := s.c
	if ch.len() == 0 || fp == "" {
		return false
	}
	start := time.Now()
	meta := &stateMeta{id: stateKey(fp, owner, ch), sess: owner, fp: fp, chain: ch, created: c.opts.Clock.Now()}
	meta.used = meta.created
	var saved, savedAux []byte // for the shared store
	_, out, err := c.opts.Cache.GetOrComputeBlob(ctx, c.opts.Namespace, meta.id, func(ctx context.Context) (kv.BlobMeta, []byte, time.Duration, error) {
		raw, err := s.saveFile(ctx, slot, meta.id)
		if err != nil {
			return kv.BlobMeta{}, nil, 0, err
		}
		st, err := parseSlotState(raw, 0)
		if err != nil {
			s.parseErrs.Add(1)
			if !s.warnedParse.Swap(true) {
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
		s.empty.Add(1)
		return false
	case err != nil:
		s.errs.Add(1)
		if !s.warnedStore.Swap(true) || !errors.Is(err, ErrSlotState) {
			c.log.Warn("llamacpp: saving a slot's KV failed; the session's older state, if any, is kept", "slot", slot, "err", err)
		}
		return false
	case !out.Computed:
		return true // that prefix was stored already
	}
	s.saves.Add(1)
	s.bytes.Add(meta.size)
	s.ns.Add(int64(time.Since(start)))
	if c.opts.Shared != nil && saved != nil {
		if err := c.opts.Shared.PutState(ctx, fp, meta.id, hashStrings(ch.hashes), saved, savedAux); err != nil {
			c.sharedError("write a state through", err)
		} else {
			c.sharedPuts.Add(1)
		}
	}
	s.keep(meta)
	c.mu.Lock()
	if se, ok := c.sessions[owner]; ok {
		se.stats.Saves++
		se.stats.SavedTokens = meta.tokens
		se.stats.SavedBytes = meta.size
	}
	c.mu.Unlock()
	return true
}

// keep indexes state m, stored in the cache, in the catalog, and drops
// the states it supersedes (its owner's beyond Options.StatesPerSession or
// StatelessStates) and the least recently used beyond Options.MaxStates.
func (s *saver) keep(m *stateMeta) {
	c := s.c
	for _, d := range c.cat.add(m, c.opts.statesKept(m.sess)) {
		s.drop(d.id)
	}
	for {
		n, _ := c.cat.size()
		o := c.cat.oldest()
		if n <= c.opts.MaxStates || o == nil {
			break
		}
		c.cat.remove(o.id)
		s.drop(o.id)
	}
}

// drop deletes state id, no longer in the catalog, from the cache.
func (s *saver) drop(id string) {
	c := s.c
	if err := c.opts.Cache.DeleteBlob(c.opts.Namespace, id); err != nil && !errors.Is(err, kv.ErrNotFound) {
		c.log.Warn("llamacpp: delete a superseded state", "err", err)
		return
	}
	s.deletes.Add(1)
}

// saveFile has the server save slot into SlotDir and returns the file's
// bytes; the file is removed whatever happens.
func (s *saver) saveFile(ctx context.Context, slot int, key string) ([]byte, error) {
	c := s.c
	name := opFileName(key, slot, "save")
	path := filepath.Join(c.opts.SlotDir, name)
	defer os.Remove(path)
	if _, err := c.api.slotAction(ctx, slot, "save", name); err != nil {
		c.checkAPIError(slot, err)
		return nil, err
	}
	raw, err := readBounded(path, c.opts.MaxStateBytes)
	if errors.Is(err, fs.ErrNotExist) && !s.warnedDir.Swap(true) {
		c.log.Warn("llamacpp: the server saved a slot but its file is not in the slot dir: is --llamacpp-slot-dir the server's --slot-save-path?",
			"slot_dir", c.opts.SlotDir)
	}
	return raw, err
}

// Settle saves now, in the caller's goroutine, the KV that req (already
// After'ed) left in its slot, when no stored state covers it yet, and so
// writes it through to the shared store; it returns once that is done (or
// failed), or at once when there is nothing to save. A fleet releases a
// session's lease after it, so the replica that serves the next turn
// finds this turn's KV. Bounded by the slot timeout.
func (c *Connector) Settle(_ context.Context, er *engine.Request) {
	c.saver.settle(requestOf(er))
}

// Flush saves now, in the caller's goroutine, what the background saver
// would save next: every idle slot holding KV no stored state covers. It
// returns once none is left. For tests, benchmarks and tools; the request
// path never waits for it.
func (c *Connector) Flush() {
	for !c.closed.Load() && c.saver.saveOne() {
	}
}

// QueueDepth returns the slots whose KV waits for a background save.
func (c *Connector) QueueDepth() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sched.pending()
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
// run left in dir: the connector's own files only.
func recoverSlotDir(dir string, log *slog.Logger) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	n := 0
	for _, e := range es {
		name := e.Name()
		if e.Type().IsRegular() && (strings.HasPrefix(name, "kvsidecar-") || strings.HasPrefix(name, ".tmp-kvsidecar-")) {
			if os.Remove(filepath.Join(dir, name)) == nil {
				n++
			}
		}
	}
	if n > 0 {
		log.Info("llamacpp: removed files an interrupted run left in the slot dir", "files", n)
	}
}
