package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

// sessionJournal keeps the sessions' logs (this file; shared.go for a
// fleet's shared log): loading a session by
// replaying its log, appending its records, writing what the worker and
// the background jobs left unwritten, deleting its files, and, in a fleet,
// keeping the session's copy of the shared log in step. It holds no lock
// of its own: every method but load runs with the session's lock held by
// its caller. Files and format are package journal's.
//
// Invariants: a record is acknowledged only once written (and, with
// FsyncAlways, fsynced); with a shared log every record is written there
// first, at the session's position, and a failure there writes nothing
// locally; loading fails only on I/O errors (damage is skipped, a foreign
// log quarantined); a session is listed in its user's list before its log
// is created.
type sessionJournal struct {
	*env
	// listSession lists a new session in its user's list (userlist.go).
	listSession func(tenant, user, id string) error
	// loaded runs after a session loaded from its log, with its lock held
	// (decay catches up, the worker writes it).
	loaded func(sess *session, now time.Time)
}

// apply applies a record to the state. msgs, when non-nil, are the parsed
// messages of the record (saving a parse on the live path).
func (s *session) apply(r *record, msgs []Message, tk *Tokenizer) error {
	at := time.Unix(0, r.T)
	if r.T != 0 && at.After(s.updated) {
		s.updated = at
	}
	enc, encOK := encodingByName(r.Enc)
	parse := func(i int, raw json.RawMessage) (Message, error) {
		if msgs != nil {
			return msgs[i], nil
		}
		var m Message
		if err := json.Unmarshal(raw, &m); err != nil {
			return m, err
		}
		return m, nil
	}
	mkEntry := func(seq uint64, m Message, i int) *entry {
		e := newEntry(seq, m, at)
		if encOK && i < len(r.Tok) && r.Tok[i] >= 0 {
			e.tokens[enc] = int32(min(r.Tok[i], 1<<31-1))
		}
		if seq >= s.nextSeq {
			s.nextSeq = seq + 1
		}
		return e
	}
	switch r.K {
	case "meta":
		if r.Tenant != s.tenant || r.Session != s.id {
			return fmt.Errorf("memory: log %s belongs to another session: %w", filepath.Base(s.path), errCorrupt)
		}
		s.created = at
		s.user = r.User
	case "sys":
		sys := make([]*entry, 0, len(r.Msgs))
		for i, raw := range r.Msgs {
			m, err := parse(i, raw)
			if err != nil {
				return err
			}
			sys = append(sys, mkEntry(r.Seq+uint64(i), m, i))
		}
		s.sys = sys
	case "msg":
		m, err := parse(0, r.Msg)
		if err != nil {
			return err
		}
		e := mkEntry(r.Seq, m, 0)
		e.partial = r.Partial
		s.hist = append(s.hist, e)
	case "trunc":
		if r.Keep == nil || *r.Keep < 0 || *r.Keep > len(s.hist) {
			return fmt.Errorf("memory: bad trunc record: %w", errCorrupt)
		}
		for _, e := range s.hist[*r.Keep:] {
			if s.deleted[msgUnitID(e.seq)] {
				s.forgetEntryDoc(e)
				continue
			}
			u := s.units[msgUnitID(e.seq)]
			if u == nil {
				if s.redundant(e) {
					s.forgetEntryDoc(e)
					continue
				}
				u = unitFromEntry(e, tk, s.lastEnc, 0, at)
				u.persisted = true // derived from this record on every replay
				s.putUnit(u)
			}
			u.Tier = PlaceArchive
			u.UpdatedAt = at
		}
		clear(s.hist[*r.Keep:])
		s.hist = s.hist[:*r.Keep]
		s.unitsChanged()
	case "undo":
		if r.Keep == nil || *r.Keep < 0 || *r.Keep > len(s.hist) {
			return fmt.Errorf("memory: bad undo record: %w", errCorrupt)
		}
		for _, e := range s.hist[*r.Keep:] {
			s.forgetEntryDoc(e)
		}
		clear(s.hist[*r.Keep:])
		s.hist = s.hist[:*r.Keep]
	case "blk":
		i := s.histIndex(r.Seq)
		if i < 0 {
			return nil // its message was cut since
		}
		m, err := parse(0, r.Msg)
		if err != nil {
			return err
		}
		s.hist[i].block = mkEntry(0, m, 0)
		s.hist[i].blockHashes = r.H
	case "unit":
		if r.Unit == nil || r.Unit.ID == "" {
			return fmt.Errorf("memory: bad unit record: %w", errCorrupt)
		}
		u := *r.Unit
		normalizeUnit(&u)
		u.persisted = true
		if u.ToSeq >= s.nextSeq {
			s.nextSeq = u.ToSeq + 1
		}
		s.units[u.ID] = &u
		s.noteUnit(&u)
		s.unitsChanged()
	case "acc":
		for _, a := range r.Acc {
			if u := s.units[a.ID]; u != nil {
				u.AccessCount = a.Count
				u.LastAccess = time.Unix(0, a.Last)
				if u.Category != "" {
					touch(u, u.LastAccess)
				}
				if a.Tier != "" && a.Tier != u.Tier {
					u.Tier = a.Tier
					s.unitsChanged()
				}
			}
		}
	case "del":
		if _, ok := s.units[r.ID]; ok {
			delete(s.units, r.ID)
			s.unitsChanged()
		}
		if s.deleted == nil {
			s.deleted = map[string]bool{}
		}
		s.deleted[r.ID] = true
		s.kb.UnitDeleted(r.ID)
	case "triple", "tdel":
		return s.applyTripleRecord(r)
	case "drop":
		// An evicted message whose content a unit already held (dedupe.go).
		if i := s.histIndex(r.Seq); i >= 0 {
			s.hist[i].dropped = true
			s.forgetEntryDoc(s.hist[i])
		}
	case "xseq":
		s.factSeq = max(s.factSeq, r.Seq)
	case "eseq":
		s.episodeSeq = max(s.episodeSeq, r.Seq)
	case "decay":
		if at.After(s.lastDecay) {
			s.lastDecay = at
		}
	case "l4":
		// Clusters whose L4 merge was refused (l4.go).
		for _, fp := range r.H {
			s.l4.Refuse(fp, false)
		}
	default:
		// Unknown kinds come from newer versions; skip them.
	}
	return nil
}

// removeLocked deletes a loaded session's files and state (fsyncing its
// folder when sync) and marks it gone. Called with sess.mu held; the caller
// drops it from the registry.
func (sj *sessionJournal) removeLocked(sess *session, sync bool) error {
	sess.gone.Store(true)
	sess.exists = false
	var errs []error
	if sess.log != nil {
		errs = append(errs, sess.log.Close())
		sess.log = nil
	}
	if err := os.Remove(indexPath(sess)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("memory: remove index: %w", err))
	}
	if err := os.Remove(sess.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("memory: remove log: %w", err))
	} else if sync {
		errs = append(errs, durable.SyncDir(filepath.Dir(sess.path)))
	}
	if sess.pending != nil {
		close(sess.pending)
		sess.pending = nil
	}
	sess.reset()
	return errors.Join(errs...)
}

// load replays the session's log, if it has one. Damage never leaves a
// session stuck: damaged records are skipped (the log is repaired, see
// openLog); records that decode but cannot apply (their context was in a
// damaged record) are skipped too; a log whose meta record is damaged keeps
// its other records and gets a new meta record; a log that belongs to
// another session (or holds nothing) is moved to quarantine (or removed)
// with its index, and the session starts afresh. Only I/O errors fail.
func (sj *sessionJournal) load(sess *session) error {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	var (
		rec      record
		first    = true
		foreign  bool
		rejected int
	)
	lf, rep, err := sj.j.Open(sess.path, func(p []byte) {
		if foreign {
			return
		}
		isFirst := first
		first = false
		rec = record{}
		if err := json.Unmarshal(p, &rec); err != nil {
			rejected++
			return
		}
		if rec.K == "meta" && (rec.Tenant != sess.tenant || rec.Session != sess.id) {
			foreign = isFirst
			rejected++
			return
		}
		if err := sess.apply(&rec, nil, sj.tok); err != nil {
			rejected++
		}
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	sj.j.NoteRepair(rep, rejected, sess.path, "session")
	switch {
	case foreign:
		// Not this session's log (a misplaced or forged file): keep it in
		// quarantine and start afresh.
		lf.Close()
		sess.reset()
		sess.created = time.Time{}
		dst, err := durable.Quarantine(sess.path, sj.j.Quarantine(), sj.opts.Clock.Now())
		if err != nil {
			return fmt.Errorf("memory: quarantine foreign log: %w", err)
		}
		sj.j.CountQuarantined()
		sj.opts.Logger.Warn("memory: session log belongs to another session; quarantined", "saved", dst)
		return sj.removeIndexFile(sess)
	case sess.created.IsZero() && rep.Records == 0:
		// Nothing but the magic: a creation never acknowledged, or a log
		// whose every record was damaged.
		lf.Close()
		if err := os.Remove(sess.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("memory: remove empty log: %w", err)
		}
		sess.reset()
		return sj.removeIndexFile(sess)
	case sess.created.IsZero():
		// The meta record was damaged, the rest salvaged: write a new one
		// first so the next open finds the log whole.
		lf.Close()
		if lf, err = sj.rewriteMeta(sess); err != nil {
			return err
		}
	}
	sess.log = lf
	sess.exists = true
	sj.loaded(sess, sj.opts.Clock.Now())
	return nil
}

// rewriteMeta rewrites the session's log with a new meta record before its
// records (atomically) and reopens it. Called with sess.mu held.
func (sj *sessionJournal) rewriteMeta(sess *session) (*journal.Log, error) {
	now := sj.opts.Clock.Now()
	meta, err := json.Marshal(&record{K: "meta", V: logVersion, Tenant: sess.tenant, Session: sess.id, T: now.UnixNano()})
	if err != nil {
		return nil, fmt.Errorf("memory: encode meta: %w", err)
	}
	data, err := os.ReadFile(sess.path)
	if err != nil || !bytes.HasPrefix(data, journal.Magic) {
		return nil, fmt.Errorf("memory: reread repaired log: %w", errors.Join(err, errCorrupt))
	}
	image := append(journal.Image(meta), data[len(journal.Magic):]...)
	if err := durable.WriteFile(sess.path, image); err != nil {
		return nil, fmt.Errorf("memory: rewrite meta: %w", err)
	}
	lf, _, err := sj.j.Open(sess.path, func([]byte) {})
	if err != nil {
		return nil, err
	}
	sess.created = now
	return lf, nil
}

// removeIndexFile removes the session's index file, if any.
func (sj *sessionJournal) removeIndexFile(sess *session) error {
	if err := os.Remove(indexPath(sess)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("memory: remove index: %w", err)
	}
	return nil
}

// writeLocked appends framed records to the session's log, creating it with
// its meta record first. Called with sess.mu held.
//
// With a shared log (Options.Shared) the records go there first, at the
// session's position (see SharedLog); a failure there writes nothing.
func (sj *sessionJournal) writeLocked(sess *session, framed []byte, now time.Time) error {
	var meta []byte
	if sess.log == nil || sj.opts.SharedLog != nil {
		var err error
		if meta, err = json.Marshal(&record{K: "meta", V: logVersion, Tenant: sess.tenant, Session: sess.id, User: sess.user, T: now.UnixNano()}); err != nil {
			return fmt.Errorf("memory: encode meta: %w", err)
		}
	}
	if sj.opts.SharedLog != nil {
		ctx, cancel := context.WithTimeout(sj.ctx, sj.opts.SharedLogTimeout)
		defer cancel()
		if sess.sharedN < 0 {
			if err := sj.syncLocked(ctx, sess); err != nil {
				return err
			}
		}
		if err := sj.shareLocked(ctx, sess, meta, framed); err != nil {
			return err
		}
	}
	if sess.log == nil {
		if !sess.exists {
			if err := sj.listSession(sess.tenant, sess.user, sess.id); err != nil {
				return err
			}
		}
		lf, err := sj.j.Create(sess.path, durable.AppendRecord(nil, meta))
		if err != nil {
			return err
		}
		sess.log, sess.exists, sess.created = lf, true, now
	}
	return sess.log.Append(framed)
}

// persistLocked writes unpersisted units and access counts as one append.
func (sj *sessionJournal) persistLocked(sess *session, now time.Time) {
	var framed []byte
	var err error
	var written []*Unit
	for _, u := range sess.units {
		if !u.persisted {
			written = append(written, u)
		}
	}
	slices.SortFunc(written, func(a, b *Unit) int { return strings.Compare(a.ID, b.ID) })
	dels := sess.delDirty
	for _, id := range dels {
		if framed, err = encodeRecord(framed, &record{K: "del", T: now.UnixNano(), ID: id}); err != nil {
			sj.opts.Logger.Warn("memory: encode deletion", "err", err)
			return
		}
	}
	drops := sess.drops
	for _, seq := range drops {
		if framed, err = encodeRecord(framed, &record{K: "drop", T: now.UnixNano(), Seq: seq}); err != nil {
			return
		}
	}
	if sess.decayDirty {
		if framed, err = encodeRecord(framed, &record{K: "decay", T: sess.lastDecay.UnixNano()}); err != nil {
			return
		}
	}
	l4n := len(sess.l4.Dirty)
	if l4n > 0 {
		if framed, err = encodeRecord(framed, &record{K: "l4", T: now.UnixNano(), H: slices.Clone(sess.l4.Dirty)}); err != nil {
			return
		}
	}
	if sess.seqDirty {
		for _, r := range []*record{{K: "xseq", T: now.UnixNano(), Seq: sess.factSeq}, {K: "eseq", T: now.UnixNano(), Seq: sess.episodeSeq}} {
			if framed, err = encodeRecord(framed, r); err != nil {
				return
			}
		}
	}
	for _, u := range written {
		c := u.clone()
		if framed, err = encodeRecord(framed, &record{K: "unit", T: now.UnixNano(), Unit: &c}); err != nil {
			sj.opts.Logger.Warn("memory: encode unit", "err", err)
			return
		}
	}
	kdels := len(sess.kb.Dels)
	if framed, err = appendTripleRecords(framed, &sess.kb, now); err != nil {
		sj.opts.Logger.Warn("memory: encode triple", "err", err)
		return
	}
	var acc []accessRecord
	for id := range sess.accessDirty {
		if u := sess.units[id]; u != nil && u.persisted {
			acc = append(acc, accessRecord{ID: id, Count: u.AccessCount, Last: u.LastAccess.UnixNano(), Tier: u.Tier})
		}
	}
	slices.SortFunc(acc, func(a, b accessRecord) int {
		if a.ID < b.ID {
			return -1
		}
		return 1
	})
	if len(acc) > 0 {
		if framed, err = encodeRecord(framed, &record{K: "acc", T: now.UnixNano(), Acc: acc}); err != nil {
			acc = nil
		}
	}
	if len(framed) == 0 {
		clear(sess.accessDirty)
		return
	}
	if err := sj.writeLocked(sess, framed, now); err != nil {
		sj.stats.writeErrors.Add(1)
		sj.opts.Logger.Warn("memory: write units", "session", sess.path, "err", err)
		return
	}
	for _, u := range written {
		u.persisted = true
	}
	sess.delDirty = sess.delDirty[len(dels):]
	sess.drops = sess.drops[len(drops):]
	sess.seqDirty, sess.decayDirty = false, false
	sess.l4.Dirty = sess.l4.Dirty[l4n:]
	sess.kb.Written(kdels)
	clear(sess.accessDirty)
}
