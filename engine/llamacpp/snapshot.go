package llamacpp

// Context snapshots (.hctx): a session's saved engine states, exported
// from one sidecar and imported into another whose llama-server runs the
// same model, so the session's next turn there restores its KV instead of
// prefilling the whole conversation.
//
// Section layout (the engine section of a snapshot; package hctx frames
// and checksums it):
//
//	u8 version (1) | uvarint count
//	per state, newest first:
//	  u64 big-endian seed tag | uvarint len | metadata (appendStateMeta) | uvarint len | llama.cpp slot file
//	  | u32 big-endian CRC-32C of the state's bytes before it
//
// (The container checksums the section too; the per-state checksum keeps
// the section whole on its own, since a flipped bit inside a slot file's
// KV still parses.)
// The seed tag is chainSeed(fingerprint, tenant): a state's prefix hashes
// are seeded with the tenant (chain.go), so a state exported under one
// API key can never match a prompt of another; the importer keeps only
// the states whose tag it derives itself, under its own key.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/kv"
)

// snapshotVersion is the version of the engine section.
const snapshotVersion = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maxSnapshotStates bounds the states one engine section may carry.
const maxSnapshotStates = 64

// errSnapshot marks a malformed engine section; it matches
// durable.ErrCorrupt.
var errSnapshot = durable.NewCorrupt("engine: malformed snapshot states")

// snapState is one state of an engine section.
type snapState struct {
	seed uint64
	meta *stateMeta
	aux  []byte
	raw  []byte
}

// ExportStates returns the engine section of a snapshot of the tenant's
// session: its saved states, newest first, as many as fit maxBytes (≤ 0:
// no bound) — the newest alone continues the conversation. The KV the
// session's slot holds and no state covers yet is saved first (bounded by
// the slot timeout), so the last turn comes along. A session without
// states gives a section of none.
func (c *Connector) ExportStates(ctx context.Context, tenant, session string, maxBytes int64) ([]byte, engine.StatesInfo, error) {
	sk := sessKey(tenant, session)
	c.saver.settleSession(sk)
	states := c.cat.session(sk)
	slices.SortFunc(states, func(a, b *stateMeta) int { return b.created.Compare(a.created) })
	var (
		out  = []byte{snapshotVersion}
		body []byte
		info engine.StatesInfo
	)
	for _, m := range states {
		if err := ctx.Err(); err != nil {
			return nil, engine.StatesInfo{}, err
		}
		_, raw, _, err := c.opts.Cache.GetBlob(c.opts.Namespace, m.id)
		if errors.Is(err, kv.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, engine.StatesInfo{}, fmt.Errorf("engine: llamacpp: export a state: %w", err)
		}
		if maxBytes > 0 && info.Bytes+int64(len(raw)) > maxBytes {
			info.Skipped++
			continue
		}
		aux := appendStateMeta(nil, m)
		start := len(body)
		body = binary.BigEndian.AppendUint64(body, chainSeed(m.fp, tenant))
		body = binary.AppendUvarint(body, uint64(len(aux)))
		body = append(body, aux...)
		body = binary.AppendUvarint(body, uint64(len(raw)))
		body = append(body, raw...)
		body = binary.BigEndian.AppendUint32(body, crc32.Checksum(body[start:], castagnoli))
		addState(&info, m, int64(len(raw)))
	}
	out = binary.AppendUvarint(out, uint64(info.States))
	return append(out, body...), info, nil
}

// addState counts state m, of size bytes, in i.
func addState(i *engine.StatesInfo, m *stateMeta, size int64) {
	if i.States == 0 {
		i.Fingerprint, i.Layout = m.fp, m.layout
	}
	i.States++
	i.Bytes += size
	i.Tokens = max(i.Tokens, m.tokens)
}

// parseStates checks an engine section whole: framing, every state's
// metadata, and every slot file (of at most maxStateBytes) in the
// documented layout, holding the tokens and KV layout its metadata states.
// Errors wrap errSnapshot.
func parseStates(section []byte, maxStateBytes int64) ([]snapState, error) {
	bad := func(format string, args ...any) ([]snapState, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{errSnapshot}, args...)...)
	}
	if len(section) == 0 || section[0] != snapshotVersion {
		return bad("version or section missing")
	}
	b := section[1:]
	uv := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	bytesOf := func(limit uint64) ([]byte, bool) {
		n, ok := uv()
		if !ok || n > uint64(len(b)) || n > limit {
			return nil, false
		}
		v := b[:n]
		b = b[n:]
		return v, true
	}
	count, ok := uv()
	if !ok || count > maxSnapshotStates || count > uint64(len(b))/8 {
		return bad("%d states", count)
	}
	out := make([]snapState, 0, count)
	for i := range count {
		if len(b) < 8 {
			return bad("state %d cut", i+1)
		}
		whole := b
		st := snapState{seed: binary.BigEndian.Uint64(b)}
		b = b[8:]
		var ok1, ok2 bool
		st.aux, ok1 = bytesOf(1 << 20)
		st.raw, ok2 = bytesOf(uint64(maxStateBytes))
		if !ok1 || !ok2 || len(b) < 4 {
			return bad("state %d: framing, or a slot file over %d bytes", i+1, maxStateBytes)
		}
		if crc32.Checksum(whole[:len(whole)-len(b)], castagnoli) != binary.BigEndian.Uint32(b) {
			return bad("state %d: checksum mismatch", i+1)
		}
		b = b[4:]
		m, err := parseStateMeta(st.aux)
		if err != nil || m.fp == "" || strings.HasPrefix(m.sess, "~") {
			return bad("state %d: metadata", i+1)
		}
		ss, err := parseSlotState(st.raw, 0)
		if err != nil {
			return bad("state %d: %v", i+1, err)
		}
		if len(ss.Tokens) != m.tokens || layoutOf(ss) != m.layout {
			return bad("state %d: the slot file does not hold what its metadata says", i+1)
		}
		m.size = int64(len(st.raw))
		st.meta = m
		out = append(out, st)
	}
	if len(b) != 0 {
		return bad("%d bytes after the last state", len(b))
	}
	return out, nil
}

// CheckStates checks an engine section as ImportStates does — whole, and
// against the model and KV layout of this connector's server (asked now
// when it was not yet) — writing nothing. A malformed section is an
// error matching durable.ErrCorrupt; states of another model
// engine.ErrOtherModel; a server that cannot answer engine.ErrUnavailable. A section
// without states needs no server.
func (c *Connector) CheckStates(ctx context.Context, tenant string, section []byte) (engine.StatesInfo, error) {
	states, err := parseStates(section, c.opts.MaxStateBytes)
	if err != nil {
		return engine.StatesInfo{}, err
	}
	return c.checkStates(ctx, tenant, states)
}

func (c *Connector) checkStates(ctx context.Context, tenant string, states []snapState) (engine.StatesInfo, error) {
	var info engine.StatesInfo
	if len(states) == 0 {
		return info, nil
	}
	if c.closed.Load() || !c.ensureProbe(ctx) {
		return info, fmt.Errorf("%w: no slot API at %s", engine.ErrUnavailable, c.opts.BaseURL)
	}
	sctx, cancel := context.WithTimeout(ctx, c.opts.SlotTimeout)
	defer cancel()
	fp := c.verify(sctx)
	if fp == "" {
		return info, fmt.Errorf("%w: %s did not answer", engine.ErrUnavailable, c.opts.BaseURL)
	}
	c.mu.Lock()
	layout := c.layout
	c.mu.Unlock()
	for _, st := range states {
		m := st.meta
		if m.fp != fp {
			return info, fmt.Errorf("%w: saved by model %s, this engine runs %s", engine.ErrOtherModel, m.fp, fp)
		}
		if layout != "" && m.layout != layout {
			return info, fmt.Errorf("%w: KV layout %s (cache type or flash attention), this engine's is %s", engine.ErrOtherModel, m.layout, layout)
		}
		if st.seed != chainSeed(fp, tenant) {
			info.Skipped++
			continue
		}
		addState(&info, m, m.size)
	}
	return info, nil
}

// ImportStates takes the states of an engine section (ExportStates's,
// from this sidecar or another) into the cache's tiers and the catalog as
// states of the tenant's session, so its next request restores the one
// sharing the longest prefix with it. It checks the section as
// CheckStates does and imports nothing unless all of it passes; states
// saved under another API key are skipped (they could never match this
// key's prompts; counted in engine.StatesInfo.Skipped). With a shared store the
// states are written through to it.
func (c *Connector) ImportStates(ctx context.Context, tenant, session string, section []byte) (engine.StatesInfo, error) {
	states, err := parseStates(section, c.opts.MaxStateBytes)
	if err != nil {
		return engine.StatesInfo{}, err
	}
	info, err := c.checkStates(ctx, tenant, states)
	if err != nil || info.States == 0 {
		return info, err
	}
	owner := sessKey(tenant, session)
	now := c.opts.Clock.Now()
	// Oldest first, so the catalog's per-session bound keeps the newest.
	for i := len(states) - 1; i >= 0; i-- {
		st := states[i]
		if st.seed != chainSeed(st.meta.fp, tenant) {
			continue
		}
		m := st.meta
		m.sess = owner
		m.id = stateKey(m.fp, owner, m.chain)
		m.used = now // restoring rebuilds the access records
		aux := appendStateMeta(nil, m)
		if err := c.opts.Cache.PutBlob(c.opts.Namespace, m.id, kv.BlobMeta{Aux: aux}, st.raw); err != nil {
			return info, fmt.Errorf("engine: llamacpp: import a state: %w", err)
		}
		if c.opts.Shared != nil {
			if err := c.opts.Shared.PutState(ctx, m.fp, m.id, hashStrings(m.chain.hashes), st.raw, aux); err != nil {
				c.sharedError("write an imported state through", err)
			} else {
				c.sharedPuts.Add(1)
			}
		}
		c.saver.keep(m)
	}
	return info, nil
}
