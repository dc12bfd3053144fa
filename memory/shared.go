package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"slices"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

// SharedLog is a record store the replicas of a fleet share (package fleet
// implements it over a Redis/Valkey store; package journal defines it).
// With one, a session's log is kept twice: every record is written to the
// shared list first, at its position, then to the local log; a replica
// brings its copy of a session up to date from the shared list (Store.Sync)
// before a turn, so any replica can serve any session and none forks its
// history. Units, facts, episodes and access counts are log records too, so
// they follow; so do the tenants' pools (package pool).
type SharedLog = journal.Shared

// goneRecord is the tombstone a deleted session's shared log is replaced
// with: a replica that still holds the session deletes its copy, and a
// session created again under the same id starts after it.
var goneRecord = []byte(`{"k":"gone"}`)

func isGone(p []byte) bool {
	var r record
	return json.Unmarshal(p, &r) == nil && r.K == "gone"
}

// ErrSharedConflict: the shared log moved on (another replica wrote the
// position this one meant to).
var ErrSharedConflict = memerr.ErrSharedConflict

// Sync brings the session's local state up to date with the shared log,
// when the Store has one (Options.SharedLog) (else it does nothing). A fleet calls it while it
// holds the session's lease, before the turn: the records other replicas
// appended since this one last wrote are applied and appended to the local
// log; a session this replica does not know, or whose position it lost
// (restart), is rebuilt from the shared log; a session the shared log does
// not have yet is uploaded from the local log.
func (s *Store) Sync(ctx context.Context, tenant, sessionID string) error {
	if s.opts.SharedLog == nil {
		return nil
	}
	sess, err := s.reg.session(tenant, sessionID, true)
	if err != nil {
		return err
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return s.jrn.syncLocked(ctx, sess)
}

// syncLocked is Sync with sess.mu held.
func (sj *sessionJournal) syncLocked(ctx context.Context, sess *session) error {
	sh := sj.opts.SharedLog
	n, err := sh.Len(ctx, sess.tenant, sess.id)
	if err != nil {
		return fmt.Errorf("memory: shared log: %w", err)
	}
	switch {
	case sess.sharedN == n:
		return nil
	case sess.sharedN >= 0 && sess.sharedN < n && sess.log != nil:
		// Read from the last record this copy knows, to check it is still
		// there: after a delete elsewhere (the list replaced by a
		// tombstone) and a new session of the id grown past this copy's
		// position, it is not.
		from := sess.sharedN
		if sess.sharedLast != 0 {
			from--
		}
		tail, err := sh.Records(ctx, sess.tenant, sess.id, from)
		if err != nil {
			return fmt.Errorf("memory: shared log: %w", err)
		}
		same := from == sess.sharedN || len(tail) > 0 && recordHash(tail[0]) == sess.sharedLast
		if from < sess.sharedN && same {
			tail = tail[1:]
		}
		if same && !slices.ContainsFunc(tail, isGone) {
			if err := sj.applySharedLocked(sess, tail); err != nil {
				return err
			}
			sess.setShared(sess.sharedN+int64(len(tail)), tail)
			sj.stats.logPulled.Add(int64(len(tail)))
			return nil
		}
		// Deleted elsewhere (and maybe created again): start over below.
	case n == 0 || sess.sharedN > n && !sj.sharedGone(ctx, sess):
		// The shared log has nothing (a session from before the fleet, or
		// a store that lost it): upload the local log.
		return sj.uploadLocked(ctx, sess)
	}
	// Unknown position (loaded from disk, or new here), or deleted
	// elsewhere: the shared log is the truth.
	all, err := sh.Records(ctx, sess.tenant, sess.id, 0)
	if err != nil {
		return fmt.Errorf("memory: shared log: %w", err)
	}
	live := all
	for i := len(all) - 1; i >= 0; i-- {
		if isGone(all[i]) {
			live = all[i+1:]
			break
		}
	}
	if len(live) == 0 {
		// Deleted: this replica's copy goes too.
		if sess.exists || sess.log != nil {
			if err := sj.removeLocked(sess, sj.opts.Fsync != FsyncNever); err != nil {
				return err
			}
			sess.gone.Store(false) // the entry stays usable: the id may be created again
		}
		sess.reset()
		sess.setShared(int64(len(all)), all)
		return nil
	}
	if err := sj.rebuildLocked(sess, live); err != nil {
		return err
	}
	sess.setShared(int64(len(all)), all)
	sj.stats.logRebuilds.Add(1)
	return nil
}

// setShared records that the session's state reflects the first n
// records of the shared log, the last of them the last of recs (when recs
// is not empty; otherwise the last known stays, or none when n is 0).
func (sess *session) setShared(n int64, recs [][]byte) {
	switch {
	case n <= 0:
		sess.sharedLast = 0
	case len(recs) > 0:
		sess.sharedLast = recordHash(recs[len(recs)-1])
	}
	sess.sharedN = n
}

// recordHash names a shared log record's bytes (never 0).
func recordHash(p []byte) uint64 {
	h := fnv.New64a()
	h.Write(p)
	return h.Sum64() | 1
}

// sharedGone reports whether the session's shared log ends deleted (its
// last tombstone has nothing after it): then a longer local copy is not
// uploaded back.
func (sj *sessionJournal) sharedGone(ctx context.Context, sess *session) bool {
	all, err := sj.opts.SharedLog.Records(ctx, sess.tenant, sess.id, 0)
	return err == nil && len(all) > 0 && isGone(all[len(all)-1])
}

// applySharedLocked applies records another replica wrote and appends them
// to the local log.
func (sj *sessionJournal) applySharedLocked(sess *session, payloads [][]byte) error {
	var framed []byte
	for _, p := range payloads {
		var r record
		if err := json.Unmarshal(p, &r); err != nil {
			return fmt.Errorf("memory: shared log record: %w", errors.Join(err, errCorrupt))
		}
		if r.K == "meta" {
			continue
		}
		if err := sess.apply(&r, nil, sj.tok); err != nil {
			return err
		}
		framed = durable.AppendRecord(framed, p)
	}
	sess.unitsChanged()
	sess.sticky = cachedBlock{}
	sess.prevPrompt, sess.prevCosts = nil, nil
	if len(framed) == 0 {
		return nil
	}
	return sess.log.Append(framed)
}

// rebuildLocked replaces the session's local log and state with payloads
// (a whole shared log, meta record first).
func (sj *sessionJournal) rebuildLocked(sess *session, payloads [][]byte) error {
	var first record
	if len(payloads) == 0 || json.Unmarshal(payloads[0], &first) != nil || first.K != "meta" ||
		first.Tenant != sess.tenant || first.Session != sess.id {
		return fmt.Errorf("memory: shared log of %q does not start with its meta record: %w", sess.id, errCorrupt)
	}
	if sess.log != nil {
		sess.log.Close()
		sess.log = nil
	}
	image := journal.Image(payloads...)
	if err := durable.MkdirAll(filepath.Dir(sess.path), 0o755); err != nil {
		return err
	}
	if !sess.exists {
		// New on this machine: its user's list names it (userlist.go).
		if err := sj.listSession(sess.tenant, first.User, sess.id); err != nil {
			return err
		}
	}
	if err := durable.WriteFile(sess.path, image); err != nil {
		return fmt.Errorf("memory: rebuild from the shared log: %w", err)
	}
	if err := sj.removeIndexFile(sess); err != nil {
		return err
	}
	sess.reset()
	sess.created, sess.user = time.Unix(0, first.T), first.User
	for _, p := range payloads[1:] {
		var r record
		if err := json.Unmarshal(p, &r); err != nil {
			continue // as load does: a record that does not parse is skipped
		}
		_ = sess.apply(&r, nil, sj.tok)
	}
	lf, _, err := sj.j.Open(sess.path, func([]byte) {})
	if err != nil {
		return err
	}
	sess.log, sess.exists = lf, true
	return nil
}

// uploadLocked writes the session's local log (if any) to the empty
// shared log.
func (sj *sessionJournal) uploadLocked(ctx context.Context, sess *session) error {
	if sess.log == nil {
		sess.setShared(0, nil)
		return nil
	}
	payloads, err := sj.j.Records(sess.path)
	if err != nil {
		return err
	}
	n, err := sj.opts.SharedLog.Append(ctx, sess.tenant, sess.id, 0, payloads)
	if err != nil {
		return fmt.Errorf("memory: upload to the shared log: %w", err)
	}
	sess.setShared(n, payloads)
	sj.stats.logUploads.Add(1)
	return nil
}

// shareLocked writes framed records (and the meta record that creates the
// local log, when the session has none yet) to the shared log at the
// session's position, taking first what other replicas wrote since. Called
// by writeLocked before the local write, with the session's position known
// (syncLocked ran).
func (sj *sessionJournal) shareLocked(ctx context.Context, sess *session, meta, framed []byte) error {
	var recs [][]byte
	durable.ScanRecords(framed, sj.opts.MaxRecordBytes, func(_ int, p []byte) { recs = append(recs, p) })
	for attempt := 0; ; attempt++ {
		payloads := recs
		if sess.log == nil {
			payloads = append([][]byte{meta}, recs...)
		}
		n, err := sj.opts.SharedLog.Append(ctx, sess.tenant, sess.id, sess.sharedN, payloads)
		if err == nil {
			sess.setShared(n, payloads)
			sj.stats.logPushed.Add(int64(len(payloads)))
			if sess.log == nil && !sj.private(sess.user) {
				// A new session: its user's other replicas will look for it.
				if err := sj.registerUserSession(ctx, sess); err != nil {
					sj.opts.Logger.Warn("memory: register the session with its user in the shared log", "err", err)
				}
			}
			return nil
		}
		if !errors.Is(err, ErrSharedConflict) || attempt > 0 {
			return fmt.Errorf("memory: shared log: %w", err)
		}
		// Another replica wrote meanwhile (its background work, or a turn
		// this one holds no lease for): take its records, then append
		// after them.
		sj.stats.logConflicts.Add(1)
		if err := sj.syncLocked(ctx, sess); err != nil {
			return err
		}
	}
}

// A user's sessions are listed in the shared log under userLogID (one
// record per session id, in creation order), so a replica that serves one
// of them finds the others for the user's cross-session recall.
func userLogID(user string) string { return "\x00user\x00" + user }

// maxSharedUserSessions bounds the sessions of a user a replica brings up
// to date per turn: the newest ones.
const maxSharedUserSessions = 64

// registerUserSession adds a new session to its user's list in the shared
// log.
func (sj *sessionJournal) registerUserSession(ctx context.Context, sess *session) error {
	id := userLogID(sess.user)
	for attempt := 0; ; attempt++ {
		recs, err := sj.opts.SharedLog.Records(ctx, sess.tenant, id, 0)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if string(r) == sess.id {
				return nil
			}
		}
		_, err = sj.opts.SharedLog.Append(ctx, sess.tenant, id, int64(len(recs)), [][]byte{[]byte(sess.id)})
		if err == nil || !errors.Is(err, ErrSharedConflict) || attempt == 4 {
			return err
		}
	}
}

// syncUserShared brings the user's newest sessions, wherever they were
// served, up to date on this replica and, when the user's index is loaded,
// their new documents into it. Call it holding no session's lock. Errors
// only cost recall; they are logged.
func (us *userScope) syncUserShared(um *userMem) {
	ctx, cancel := context.WithTimeout(us.ctx, us.opts.SharedLogTimeout)
	defer cancel()
	ids, err := us.opts.SharedLog.Records(ctx, um.tenant, userLogID(um.user), 0)
	if err != nil {
		us.opts.Logger.Warn("memory: the user's sessions in the shared log", "err", err)
		return
	}
	for _, b := range ids[max(0, len(ids)-maxSharedUserSessions):] {
		sess, err := us.reg.session(um.tenant, string(b), true)
		if err != nil {
			continue
		}
		sess.mu.Lock()
		before := sess.sharedN
		err = us.jrn.syncLocked(ctx, sess)
		changed := sess.sharedN != before
		sess.mu.Unlock()
		us.reg.unpin(sess) // what follows copes with a session unloaded meanwhile
		if err != nil {
			us.opts.Logger.Warn("memory: a session of the user from the shared log", "err", err)
			continue
		}
		if changed && um.index() != nil {
			us.recall.syncUserDocs(sess, um)
		}
	}
}
