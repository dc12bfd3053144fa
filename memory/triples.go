package memory

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

// Triple is one (subject, predicate, object) of the knowledge base, the
// one type for it on both sides of the seam: the console (package proxy)
// serves it as this JSON. Package memory/internal/knowledge owns it and
// the session's knowledge base (knowledge.KB); this file is its glue to
// the session: the log's records, the fact job's triple lines, the
// console's listing and deletes.
type Triple = knowledge.Triple

// maxListedSessions is how many sessions one Triples listing reads.
const maxListedSessions = 64

// ErrTripleNotFound: no triple with that id for the tenant and user. It
// also matches ErrNotFound.
var ErrTripleNotFound = memerr.NotFound("memory: triple not found")

// applyTripleRecord replays a "triple" or "tdel" record.
func (s *session) applyTripleRecord(r *record) error {
	if r.K == "tdel" {
		s.kb.Remove(r.ID)
		return nil
	}
	if r.Triple == nil || r.Triple.ID == "" {
		return fmt.Errorf("memory: bad triple record: %w", errCorrupt)
	}
	if s.kb.Deleted[r.Triple.ID] {
		return nil
	}
	t := r.Triple.Triple()
	// Supports deleted since (or before, in a shared log) do not count.
	t.Support = slices.DeleteFunc(slices.Clone(t.Support), func(id string) bool { return s.deleted[id] })
	if len(t.Support) == 0 {
		if _, ok := s.kb.Triples[t.ID]; ok {
			delete(s.kb.Triples, t.ID)
			s.kb.Ver++
		}
		return nil
	}
	s.kb.Put(&t)
	return nil
}

// appendTripleRecords frames the knowledge base's triples and deletions
// not yet written ("triple" and "tdel" records).
func appendTripleRecords(framed []byte, k *knowledge.KB, now time.Time) ([]byte, error) {
	var err error
	for _, id := range k.Dels {
		if framed, err = encodeRecord(framed, &record{K: "tdel", T: now.UnixNano(), ID: id}); err != nil {
			return framed, err
		}
	}
	ids := make([]string, 0, len(k.Dirty))
	for id := range k.Dirty {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if t := k.Triples[id]; t != nil {
			if framed, err = encodeRecord(framed, &record{K: "triple", T: now.UnixNano(), Triple: t.Record()}); err != nil {
				return framed, err
			}
		}
	}
	return framed, nil
}

// tripleID names a triple: the session's hash prefix (so an id names one
// session of the user), the last message seq of its job and its index.
func tripleID(sess *session, seq uint64, i int) string {
	return fmt.Sprintf("tri-%s-%012d-%02d", sess.hash[:8], seq, i)
}

// applyTriplesLocked applies a fact job's triple lines after its fact
// operations: adds are the job's [ADD] operations in reply order, for "+n"
// supports. Every rejection is logged and counted, and changes nothing.
func (kn *learner) applyTriplesLocked(job *extractJob, lines string, added map[int]string, now time.Time) {
	if lines == "" {
		return
	}
	sess := job.sess
	ops, rejected := knowledge.ParseTriples(lines)
	reject := func(err error) {
		kn.stats.triplesRejected.Add(1)
		kn.opts.Logger.Warn("memory: rejected triple", "session", sess.id, "err", err)
	}
	for _, err := range rejected {
		reject(err)
	}
	next := 0
	for _, op := range ops {
		sup, err := resolveSupport(sess, job, op.Support, added)
		if err != nil {
			reject(err)
			continue
		}
		var same *Triple
		for _, t := range sess.kb.Triples {
			if strings.EqualFold(t.Subject, op.Subject) && strings.EqualFold(t.Predicate, op.Predicate) && strings.EqualFold(t.Object, op.Object) {
				same = t
				break
			}
		}
		if same != nil {
			merged := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(same.Support), sup...))))
			if len(merged) > knowledge.MaxStoredSupport {
				reject(fmt.Errorf("%w: %s would have %d supports (max %d)", ErrInvalid, same.ID, len(merged), knowledge.MaxStoredSupport))
				continue
			}
			if len(merged) != len(same.Support) {
				c := *same
				c.Support, c.At = merged, now
				sess.kb.Put(&c)
				sess.kb.MarkDirty(c.ID)
			}
			continue
		}
		if len(sess.kb.Triples) >= knowledge.MaxSessionTriples {
			reject(fmt.Errorf("%w: %d triples, the most a session keeps", ErrInvalid, len(sess.kb.Triples)))
			continue
		}
		id := tripleID(sess, job.to, next)
		for sess.kb.Triples[id] != nil || sess.kb.Deleted[id] {
			next++
			id = tripleID(sess, job.to, next)
		}
		next++
		sess.kb.Put(&Triple{ID: id, Subject: op.Subject, Predicate: op.Predicate, Object: op.Object, Support: sup, At: now})
		sess.kb.MarkDirty(id)
		kn.stats.triples.Add(1)
	}
}

// resolveSupport turns a line's supports into unit ids of the session:
// a fact id shown in the job's prompt, or "+n", the unit holding the n-th
// [ADD] line's text (the one just added, or the equal one it deduplicated
// to; an [ADD] that was rejected or not stored resolves to nothing).
func resolveSupport(sess *session, job *extractJob, sups []string, added map[int]string) ([]string, error) {
	out := make([]string, 0, len(sups))
	for _, sup := range sups {
		if ref, ok := strings.CutPrefix(sup, "+"); ok {
			n, _ := strconv.Atoi(ref)
			id := added[n]
			if id == "" {
				return nil, fmt.Errorf("%w: %s: the reply's [ADD] number %d was not stored", ErrInvalid, sup, n)
			}
			out = append(out, id)
			continue
		}
		if !job.known[sup] {
			return nil, fmt.Errorf("%w: unknown id %q", ErrInvalid, sup)
		}
		if sess.units[sup] == nil {
			return nil, fmt.Errorf("%w: id %q was deleted", ErrInvalid, sup)
		}
		out = append(out, sup)
	}
	return slices.Compact(slices.Sorted(slices.Values(out))), nil
}

// Triples lists the knowledge base of a tenant's user ("" is the tenant's
// default user): the triples of the user's newest 64 stored sessions,
// newest first, at most limit (≤ 0: 1000), as copies with Session set.
// It never crosses tenants and creates no session.
func (s *Store) Triples(tenant, user string, limit int) ([]Triple, error) {
	if limit <= 0 {
		limit = 1000
	}
	infos, err := s.Sessions(tenant, &user, maxListedSessions)
	if err != nil {
		return nil, err
	}
	out := []Triple{}
	for _, si := range infos {
		if si.Tenant != tenant {
			continue // Sessions("") lists every tenant
		}
		sess, err := s.reg.session(tenant, si.ID, false)
		if err != nil {
			continue // deleted since
		}
		sess.mu.Lock()
		if sess.exists && !sess.gone.Load() && sess.user == user {
			for _, t := range sess.kb.Triples {
				c := *t
				c.Support = slices.Clone(t.Support)
				c.Session = sess.id
				out = append(out, c)
			}
		}
		sess.mu.Unlock()
		s.reg.unpin(sess)
	}
	slices.SortFunc(out, func(a, b Triple) int {
		if c := b.At.Compare(a.At); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out[:min(len(out), limit)], nil
}

// DeleteTriple deletes a triple of a tenant's user; an unknown id (or one
// of another tenant or user) is ErrTripleNotFound. The deletion is written
// by the background worker, like a memory edit, and a deleted id is never
// recreated.
func (s *Store) DeleteTriple(tenant, user, id string) error {
	notFound := fmt.Errorf("%w: %q", ErrTripleNotFound, id)
	// The id starts with the first 8 hex digits of its session's hash,
	// which name the session's log file: read only those logs' meta.
	h8, ok := strings.CutPrefix(id, "tri-")
	if !ok || len(h8) < 9 || h8[8] != '-' || strings.Trim(h8[:8], "0123456789abcdef") != "" {
		return notFound
	}
	h8 = h8[:8]
	paths, _ := filepath.Glob(filepath.Join(tenantDir(s.opts.Dir, tenant), h8[:2], h8+"*.log"))
	for _, p := range paths {
		meta, err := readLogMeta(s.j, p)
		if err != nil || meta.K != "meta" || meta.Tenant != tenant || meta.User != user || meta.Session == "" {
			continue
		}
		sess, err := s.reg.session(tenant, meta.Session, false)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return err
			}
			continue
		}
		sess.mu.Lock()
		_, ok := sess.kb.Triples[id]
		if ok && sess.exists && !sess.gone.Load() && sess.user == user {
			sess.kb.Remove(id)
			sess.kb.Dels = append(sess.kb.Dels, id)
			sess.mu.Unlock()
			s.wk.enqueue(sess)
			s.reg.unpin(sess)
			return nil
		}
		sess.mu.Unlock()
		s.reg.unpin(sess)
	}
	return notFound
}
