package memory

// Context snapshots (.hctx, MemGPT design §8.1): a session's memory
// captured whole, to continue the conversation on another sidecar. The
// session log is already a complete, replayable record of the session —
// history, recall blocks, units (evicted turns, summaries, facts,
// episodes), access counts, deletions, triples — so the memory section of
// a snapshot is that log's records, plus what the log does not hold: the
// working memory (active set and Hebbian links).
//
// Section layout: records framed as in a log (durable.AppendRecord: length,
// payload CRC-32C, header CRC-32C), each a JSON payload:
//
//	1     {"k":"hctx","v":1,"session":…,"user":…,"model":…,"wm":{…}}
//	2     the session's meta record (tenant left empty: the importer's is written)
//	3 …   every other record of the log that applies, in log order
//	last  {"k":"hctx-end","n":<records before it>}, so a cut at a record
//	      boundary is seen too
//
// Import replays the records into a scratch session before it writes
// anything, so a section that does not replay cleanly is refused whole.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

// ErrExists: an import names a session that already exists. Nothing was
// written; the caller deletes the session first to replace it.
var ErrExists = errors.New("memory: session already exists")

// snapshotVersion is the version of the memory section.
const snapshotVersion = 1

// Bounds on what an imported working memory may hold.
const (
	maxSnapActive = 1024
	maxSnapIDLen  = 256
)

// SnapshotInfo describes the memory section of a snapshot: what an export
// wrote or an import read.
type SnapshotInfo struct {
	Session string `json:"session"`
	// User is the session's end user ("" when it names none).
	User  string `json:"user,omitempty"`
	Model string `json:"model,omitempty"`
	// Records are the log records carried (the meta record included).
	Records  int `json:"records"`
	Messages int `json:"messages"`
	Units    int `json:"units"`
	Facts    int `json:"facts"`
	Triples  int `json:"triples"`
	// Active and Links are the working memory's active set and Hebbian
	// links.
	Active int `json:"active"`
	Links  int `json:"links"`
	// Bytes is the section's size.
	Bytes int `json:"bytes"`
}

// snapHeader is the first record of a memory section.
type snapHeader struct {
	K       string      `json:"k"`
	V       int         `json:"v"`
	Session string      `json:"session"`
	User    string      `json:"user,omitempty"`
	Model   string      `json:"model,omitempty"`
	WM      *wmSnapshot `json:"wm,omitempty"`
}

// wmSnapshot is a working memory as a snapshot carries it; times are Unix
// nanoseconds.
type wmSnapshot struct {
	Active   []wmActive `json:"active,omitempty"`
	Links    []wmLink   `json:"links,omitempty"`
	Injected []string   `json:"injected,omitempty"`
	Seq      uint64     `json:"seq,omitempty"`
}

type wmActive struct {
	ID string `json:"id"`
	T  int64  `json:"t"`
	N  uint64 `json:"n"`
}

type wmLink struct {
	A string  `json:"a"`
	B string  `json:"b"`
	W float64 `json:"w"`
	T int64   `json:"t"`
}

// snapshot returns the working memory in a stable order.
func (wm *workingMemory) snapshot() *wmSnapshot {
	if len(wm.active) == 0 && len(wm.links) == 0 && len(wm.injected) == 0 {
		return nil
	}
	out := &wmSnapshot{Injected: slices.Clone(wm.injected), Seq: wm.seq}
	for id, a := range wm.active {
		out.Active = append(out.Active, wmActive{ID: id, T: a.t.UnixNano(), N: a.n})
	}
	slices.SortFunc(out.Active, func(a, b wmActive) int { return strings.Compare(a.ID, b.ID) })
	for k, l := range wm.links {
		out.Links = append(out.Links, wmLink{A: k.a, B: k.b, W: l.w, T: l.t.UnixNano()})
	}
	slices.SortFunc(out.Links, func(a, b wmLink) int {
		if c := strings.Compare(a.A, b.A); c != 0 {
			return c
		}
		return strings.Compare(a.B, b.B)
	})
	return out
}

// check validates a snapshot's working memory.
func (w *wmSnapshot) check() error {
	if w == nil {
		return nil
	}
	okID := func(id string) bool { return id != "" && len(id) <= maxSnapIDLen }
	if len(w.Active) > maxSnapActive || len(w.Links) > maxLinks || len(w.Injected) > maxSnapActive {
		return fmt.Errorf("working memory of %d memories and %d links, at most %d and %d", len(w.Active), len(w.Links), maxSnapActive, maxLinks)
	}
	for _, a := range w.Active {
		if !okID(a.ID) {
			return errors.New("working memory: bad memory id")
		}
	}
	for _, l := range w.Links {
		if !okID(l.A) || !okID(l.B) || l.A >= l.B || !(l.W > 0 && l.W <= 1) {
			return errors.New("working memory: bad link")
		}
	}
	for _, id := range w.Injected {
		if !okID(id) {
			return errors.New("working memory: bad memory id")
		}
	}
	return nil
}

// restore replaces wm with w, keeping only memories in units.
func (wm *workingMemory) restore(w *wmSnapshot, units map[string]*Unit) {
	wm.reset()
	if w == nil {
		return
	}
	for _, a := range w.Active {
		if units[a.ID] != nil {
			if wm.active == nil {
				wm.active = map[string]activation{}
			}
			wm.active[a.ID] = activation{t: time.Unix(0, a.T), n: a.N}
		}
	}
	for _, l := range w.Links {
		if units[l.A] != nil && units[l.B] != nil {
			if wm.links == nil {
				wm.links = map[linkKey]link{}
			}
			k := linkKey{l.A, l.B}
			if _, ok := wm.links[k]; !ok {
				wm.addAdj(k.a, k.b)
				wm.addAdj(k.b, k.a)
			}
			wm.links[k] = link{w: l.W, t: time.Unix(0, l.T)}
		}
	}
	for _, id := range w.Injected {
		if units[id] != nil {
			wm.injected = append(wm.injected, id)
		}
	}
	slices.Sort(wm.injected)
	wm.seq = w.Seq
}

// ExportSession returns the memory section of a snapshot of the tenant's
// session (see the top of this file), and what it holds. user must be the
// session's end user ("" for a session that names none), else
// ErrUserMismatch; an unknown session is ErrNotFound. It waits (bounded,
// as Prepare does) for a turn in flight to record its reply, writes what
// the background worker has not written yet, and reads the log; the
// session is locked meanwhile (a few milliseconds per MiB of log).
func (s *Store) ExportSession(ctx context.Context, tenant, sessionID, user string) ([]byte, SnapshotInfo, error) {
	if err := s.syncView(tenant, sessionID); err != nil {
		return nil, SnapshotInfo{}, err
	}
	sess, err := s.reg.session(tenant, sessionID, false)
	if err != nil {
		return nil, SnapshotInfo{}, err
	}
	defer s.reg.unpin(sess)
	if err := s.waitPending(ctx, sess); err != nil {
		return nil, SnapshotInfo{}, err
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if !sess.exists || sess.gone.Load() {
		return nil, SnapshotInfo{}, fmt.Errorf("%w: %q", ErrNotFound, sessionID)
	}
	if sess.user != user {
		return nil, SnapshotInfo{}, ErrUserMismatch
	}
	s.jrn.persistLocked(sess, s.opts.Clock.Now())
	if sess.log != nil {
		if err := sess.log.Sync(); err != nil {
			return nil, SnapshotInfo{}, err
		}
	}
	data, err := os.ReadFile(sess.path)
	if err != nil {
		return nil, SnapshotInfo{}, fmt.Errorf("memory: export: read log: %w", err)
	}
	if !bytes.HasPrefix(data, journal.Magic) {
		return nil, SnapshotInfo{}, fmt.Errorf("memory: export: log of %q: %w", sessionID, errCorrupt)
	}
	hdr, err := json.Marshal(&snapHeader{K: "hctx", V: snapshotVersion, Session: sess.id, User: sess.user, Model: sess.lastModel, WM: sess.wm.snapshot()})
	if err != nil {
		return nil, SnapshotInfo{}, fmt.Errorf("memory: export: %w", err)
	}
	out := durable.AppendRecord(make([]byte, 0, len(data)+len(hdr)+64), hdr)
	// Replay the log into a scratch session as load does, keeping the
	// records that apply: the importer refuses any that does not.
	scratch := newSession(s.opts.Dir, sess.tenant, sess.id)
	first, n := true, 1
	durable.ScanRecords(data[len(journal.Magic):], s.opts.MaxRecordBytes, func(_ int, p []byte) {
		var r record
		if json.Unmarshal(p, &r) != nil || (r.K == "meta") != first {
			return // only the first record is the meta record (load's rule)
		}
		if scratch.apply(&r, nil, s.tok) != nil {
			return
		}
		if first {
			first = false
			r.Tenant, r.User = "", sess.user // the importer writes its own tenant
			if p, err = json.Marshal(&r); err != nil {
				return
			}
		}
		out = durable.AppendRecord(out, p)
		n++
	})
	if err != nil {
		return nil, SnapshotInfo{}, fmt.Errorf("memory: export: %w", err)
	}
	out = durable.AppendRecord(out, fmt.Appendf(nil, `{"k":"hctx-end","n":%d}`, n))
	info, err := s.parseSnapshot(sess.tenant, sess.id, out)
	if err != nil {
		// The live state replays; a log that does not is a bug to see.
		return nil, SnapshotInfo{}, fmt.Errorf("memory: export of %q does not replay: %w", sessionID, err)
	}
	return out, info.SnapshotInfo, nil
}

// parsedSnapshot is a memory section checked by parseSnapshot.
type parsedSnapshot struct {
	SnapshotInfo
	header   snapHeader
	payloads [][]byte // meta first (tenant and session as given), aliasing the section
	scratch  *session
}

// parseSnapshot checks a memory section whole: framing, header, a meta
// record first, and every record replaying into a scratch session for
// (tenant, id). Errors match durable.ErrCorrupt (or ErrInvalid for a newer
// version).
func (s *Store) parseSnapshot(tenant, id string, section []byte) (*parsedSnapshot, error) {
	var recs [][]byte
	sc := durable.ScanRecords(section, s.opts.MaxRecordBytes, func(_ int, p []byte) { recs = append(recs, p) })
	if sc.DamagedBytes() > 0 || sc.End != len(section) || len(recs) < 3 {
		return nil, fmt.Errorf("memory: snapshot section damaged or empty: %w", errCorrupt)
	}
	var end struct {
		K string `json:"k"`
		N int    `json:"n"`
	}
	if json.Unmarshal(recs[len(recs)-1], &end) != nil || end.K != "hctx-end" || end.N != len(recs)-1 {
		return nil, fmt.Errorf("memory: snapshot section cut: %w", errCorrupt)
	}
	recs = recs[:len(recs)-1]
	ps := &parsedSnapshot{}
	if err := json.Unmarshal(recs[0], &ps.header); err != nil || ps.header.K != "hctx" {
		return nil, fmt.Errorf("memory: snapshot section without its header: %w", errCorrupt)
	}
	if ps.header.V != snapshotVersion {
		return nil, fmt.Errorf("%w: memory snapshot version %d, this sidecar reads %d", ErrInvalid, ps.header.V, snapshotVersion)
	}
	if err := ps.header.WM.check(); err != nil {
		return nil, fmt.Errorf("memory: snapshot: %v: %w", err, errCorrupt)
	}
	var meta record
	if err := json.Unmarshal(recs[1], &meta); err != nil || meta.K != "meta" || meta.User != ps.header.User {
		return nil, fmt.Errorf("memory: snapshot section without its meta record: %w", errCorrupt)
	}
	meta.Tenant, meta.Session = tenant, id
	mp, err := json.Marshal(&meta)
	if err != nil {
		return nil, fmt.Errorf("memory: snapshot: %w", err)
	}
	ps.payloads = append([][]byte{mp}, recs[2:]...)
	sc2 := newSession(s.opts.Dir, tenant, id)
	for i, p := range ps.payloads {
		var r record
		if err := json.Unmarshal(p, &r); err != nil {
			return nil, fmt.Errorf("memory: snapshot record %d: %w", i+1, errors.Join(err, errCorrupt))
		}
		if i > 0 && r.K == "meta" {
			return nil, fmt.Errorf("memory: snapshot record %d: a second meta record: %w", i+1, errCorrupt)
		}
		if renameTriple(&r, sc2.hash[:8]) {
			// A triple's id names its session (DeleteTriple finds the
			// log by it): the importer's.
			if ps.payloads[i], err = json.Marshal(&r); err != nil {
				return nil, fmt.Errorf("memory: snapshot: %w", err)
			}
		}
		if err := sc2.apply(&r, nil, s.tok); err != nil {
			return nil, fmt.Errorf("memory: snapshot record %d: %w", i+1, errors.Join(err, errCorrupt))
		}
	}
	ps.scratch = sc2
	ps.SnapshotInfo = SnapshotInfo{Session: ps.header.Session, User: ps.header.User, Model: ps.header.Model,
		Records: len(ps.payloads), Messages: len(sc2.sys) + len(sc2.hist), Units: len(sc2.units),
		Triples: len(sc2.kb.Triples), Bytes: len(section)}
	for _, u := range sc2.units {
		if u.Category == CategoryFact || u.Type == UnitFact {
			ps.Facts++
		}
	}
	if w := ps.header.WM; w != nil {
		ps.Active, ps.Links = len(w.Active), len(w.Links)
	}
	return ps, nil
}

// renameTriple gives the triple a triple or tdel record names the session
// hash prefix h8; it reports whether it changed the record.
func renameTriple(r *record, h8 string) bool {
	id := &r.ID
	switch {
	case r.K == "triple" && r.Triple != nil:
		id = &r.Triple.ID
	case r.K != "tdel":
		return false
	}
	rest, ok := strings.CutPrefix(*id, "tri-")
	if !ok || len(rest) < 9 || rest[8] != '-' || rest[:8] == h8 {
		return false
	}
	*id = "tri-" + h8 + rest[8:]
	return true
}

// CheckSnapshot checks a memory section as ImportSession would, writing
// nothing, and returns what it holds: a damaged section matches
// durable.ErrCorrupt, one of another end user than user ErrUserMismatch.
func (s *Store) CheckSnapshot(section []byte, user string) (SnapshotInfo, error) {
	ps, err := s.parseSnapshot("", "check", section)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if ps.User != user {
		return ps.SnapshotInfo, ErrUserMismatch
	}
	return ps.SnapshotInfo, nil
}

// ImportSession creates the tenant's session sessionID from a memory
// section of a snapshot (ExportSession's, from this sidecar or another):
// its history, units, facts, triples, access counts and working memory,
// exactly as exported. The snapshot's end user must be user (else
// ErrUserMismatch); a session that exists already is ErrExists; a
// damaged section matches durable.ErrCorrupt. Nothing is written unless
// the whole section replays. The log is written atomically (and, with a
// SharedLog, goes to the shared copy first); the session's index is
// rebuilt from its units on first use, and its user's index takes its
// documents in the background. With a SharedLog the records are appended
// to the shared copy first (after a deleted session's tombstone).
func (s *Store) ImportSession(ctx context.Context, tenant, sessionID, user string, section []byte) (SnapshotInfo, error) {
	if sessionID == "" {
		return SnapshotInfo{}, fmt.Errorf("%w: empty session id", ErrInvalid)
	}
	ps, err := s.parseSnapshot(tenant, sessionID, section)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if ps.User != user {
		return ps.SnapshotInfo, ErrUserMismatch
	}
	sess, err := s.reg.session(tenant, sessionID, true)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	defer sess.mu.Unlock()
	var sctx context.Context
	if s.opts.SharedLog != nil {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, s.opts.SharedLogTimeout)
		defer cancel()
		if err := s.jrn.syncLocked(sctx, sess); err != nil {
			return SnapshotInfo{}, err
		}
	}
	if sess.exists || sess.pending != nil {
		return SnapshotInfo{}, fmt.Errorf("%w: %q", ErrExists, sessionID)
	}
	var sharedN int64
	if s.opts.SharedLog != nil {
		// Appended after what the shared log holds (nothing, or a deleted
		// session ending in its tombstone), never replacing it: a replica
		// holding the deleted session finds the tombstone in the tail it
		// reads and rebuilds, as after any delete.
		n, err := s.opts.SharedLog.Append(sctx, tenant, sessionID, max(sess.sharedN, 0), ps.payloads)
		if err != nil {
			return SnapshotInfo{}, fmt.Errorf("memory: import to the shared log: %w", err)
		}
		sharedN = n
	}
	if err := s.jrn.rebuildLocked(sess, ps.payloads); err != nil {
		return SnapshotInfo{}, err
	}
	if s.opts.SharedLog != nil {
		sess.setShared(sharedN, ps.payloads)
		if !s.private(sess.user) {
			if err := s.jrn.registerUserSession(sctx, sess); err != nil {
				s.opts.Logger.Warn("memory: register an imported session with its user in the shared log", "err", err)
			}
		}
	}
	sess.lastModel = ps.Model
	sess.wm.restore(ps.header.WM, sess.units)
	s.wk.enqueue(sess) // index and user documents, off this call
	return ps.SnapshotInfo, nil
}
