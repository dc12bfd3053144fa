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
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// The knowledge base beside the log: (subject, predicate, object) triples
// the background model extracts with the facts, each supported by the
// facts it was drawn from.
//
// Extraction rides on the fact job's call (one prompt, one reply, so the
// sidecar's calls per client turn stay what they were): the fact prompt
// also asks for triple lines, and the reply's "[TRIPLE]" lines are cut out
// before parseFactOps sees the rest. A triple's supports are ids of the
// facts shown in the prompt, or "+n" for the n-th [ADD] of the same reply
// (the fact the model just stated); a triple whose supports do not all
// resolve is rejected whole.
//
// Triples live in their session, like the facts they rest on: written to
// the session log as "triple" records (the whole triple, so a later record
// of the same id replaces it) and "tdel" records (an operator's delete),
// replayed on load and through the shared log. Deleting a unit removes it
// from every triple's supports and deletes the triples left with none (the
// cascade is derived from the unit's own "del" record, on replay too). The
// graph of a session's triples is attached to its index (index.EntityGraph)
// and fused in hybrid recall; the user's graph (usergraph.go) holds the
// triples of all the user's sessions for recall across them.

// Triple is one (subject, predicate, object) of the knowledge base, the
// one type for it on both sides of the seam: the console (package proxy)
// serves it as this JSON. The session log keeps triples in its own,
// shorter form (tripleRecord).
type Triple struct {
	ID        string `json:"id"`
	Subject   string `json:"subject"`
	Predicate string `json:"predicate"`
	Object    string `json:"object"`
	// Support lists the ids of the session's memory units (facts) the
	// triple rests on, sorted; never empty.
	Support []string  `json:"support"`
	At      time.Time `json:"at"`
	// Session is the session holding the triple; set by Store.Triples only.
	Session string `json:"session,omitempty"`
}

// tripleRecord is a triple as a "triple" log record holds it (the log's
// format: short keys, no session).
type tripleRecord struct {
	ID        string    `json:"id"`
	Subject   string    `json:"s"`
	Predicate string    `json:"p"`
	Object    string    `json:"o"`
	Support   []string  `json:"sup"`
	At        time.Time `json:"at"`
}

func (t *Triple) record() *tripleRecord {
	return &tripleRecord{ID: t.ID, Subject: t.Subject, Predicate: t.Predicate, Object: t.Object, Support: t.Support, At: t.At}
}

func (r *tripleRecord) triple() Triple {
	return Triple{ID: r.ID, Subject: r.Subject, Predicate: r.Predicate, Object: r.Object, Support: r.Support, At: r.At}
}

// tripleOp is one parsed triple line: Support holds fact ids and "+n"
// references to the reply's n-th [ADD].
type tripleOp struct {
	Subject, Predicate, Object string
	Support                    []string
}

// String renders the line in the form parseTriples accepts.
func (op tripleOp) String() string {
	return tripleTag + " " + op.Subject + " | " + op.Predicate + " | " + op.Object + " | " + strings.Join(op.Support, ", ")
}

// Limits of the triple parser and store.
const (
	tripleTag          = "[TRIPLE]"
	maxTripleTermBytes = 200 // subject, predicate or object
	maxTripleSupport   = 8   // supports of one line
	maxStoredSupport   = 32  // supports of a stored triple (lines of equal triples merge)
	maxTripleOps       = 32  // triple lines per reply
	maxTripleRef       = 32  // "+n" may name the first 32 [ADD]s
	maxSessionTriples  = 1000
	maxListedSessions  = 64 // sessions one Triples listing reads
)

// ErrTripleNotFound: no triple with that id for the tenant and user. It
// also matches ErrNotFound.
var ErrTripleNotFound = memerr.NotFound("memory: triple not found")

// tripleInstructions is appended to the fact prompt.
const tripleInstructions = "\nThen state what the new messages say as knowledge triples, one per line, exactly:\n" +
	tripleTag + " <subject> | <predicate> | <object> | <supporting fact ids, comma-separated>\n" +
	"A supporting id is one of the ids listed above, or +1 for the first [ADD] of your reply, +2 for the second, and so on. " +
	"Subjects and objects are short names of people, places, things or events. Only triples the facts support.\n"

// cutTripleLines splits a reply into its triple lines and the rest.
func cutTripleLines(out string) (rest, triples string) {
	var r, t strings.Builder
	for line := range strings.Lines(out) {
		if strings.HasPrefix(strings.ToUpper(strings.TrimSpace(line)), "[TRIPLE") {
			t.WriteString(line)
		} else {
			r.WriteString(line)
		}
	}
	return r.String(), t.String()
}

// parseTriples parses triple lines strictly: each non-blank line is exactly
// "[TRIPLE] subject | predicate | object | id, id" with three texts of
// 1–200 bytes (valid UTF-8, no control or format characters, no "|", no
// operation marker) and 1–8 supports, each a fact id ([a-z0-9-], 1–64) or
// "+n" (1 ≤ n ≤ 32). Every other line — malformed, too long, beyond 32
// triples or 64 KiB — is rejected with an error wrapping ErrInvalid and
// skipped; it never stops the valid ones.
func parseTriples(out string) (ops []tripleOp, rejected []error) {
	return parseLines(out, "triples", "triples", maxTripleOps, parseTriple)
}

func parseTriple(line string) (tripleOp, error) {
	if len(line) > maxFactLineBytes {
		return tripleOp{}, fmt.Errorf("line of %d bytes", len(line))
	}
	if !utf8.ValidString(line) {
		return tripleOp{}, fmt.Errorf("invalid UTF-8")
	}
	rest, ok := strings.CutPrefix(line, tripleTag+" ")
	if !ok {
		return tripleOp{}, fmt.Errorf("not a triple")
	}
	parts := strings.Split(rest, "|")
	if len(parts) != 4 {
		return tripleOp{}, fmt.Errorf("%d fields, want subject | predicate | object | supports", len(parts))
	}
	var op tripleOp
	for i, dst := range []*string{&op.Subject, &op.Predicate, &op.Object} {
		t := strings.TrimSpace(parts[i])
		if len(t) > maxTripleTermBytes {
			return tripleOp{}, fmt.Errorf("field %d of %d bytes (max %d)", i+1, len(t), maxTripleTermBytes)
		}
		if err := validFactText(t); err != nil {
			return tripleOp{}, fmt.Errorf("field %d: %v", i+1, err)
		}
		*dst = t
	}
	for sup := range strings.SplitSeq(parts[3], ",") {
		sup = strings.TrimSpace(sup)
		if ref, isRef := strings.CutPrefix(sup, "+"); isRef {
			n, err := strconv.Atoi(ref)
			if err != nil || n < 1 || n > maxTripleRef || ref != strconv.Itoa(n) {
				return tripleOp{}, fmt.Errorf("bad reference %q", sanitize.Truncate(sup, 16))
			}
		} else if err := validFactID(sup); err != nil {
			return tripleOp{}, fmt.Errorf("support: %v", err)
		}
		if slices.Contains(op.Support, sup) {
			continue
		}
		if len(op.Support) == maxTripleSupport {
			return tripleOp{}, fmt.Errorf("more than %d supports", maxTripleSupport)
		}
		op.Support = append(op.Support, sup)
	}
	return op, nil
}

// sessTriples is a session's triples. The session's mu protects it.
type sessTriples struct {
	triples map[string]*Triple
	deleted map[string]bool // ids an operator deleted: never recreated
	dirty   map[string]bool // triples to write
	dels    []string        // operator deletions to write
	ver     uint64          // counts changes
	// graphIx and graphVer: the index the graph was last attached to, and
	// the version it reflects.
	graphIx  *index.Index
	graphVer uint64
}

func (k *sessTriples) put(t *Triple) {
	if k.triples == nil {
		k.triples = map[string]*Triple{}
	}
	k.triples[t.ID] = t
	k.ver++
}

func (k *sessTriples) markDirty(id string) {
	if k.dirty == nil {
		k.dirty = map[string]bool{}
	}
	k.dirty[id] = true
}

// remove deletes a triple (an operator's delete: it is written and never
// recreated).
func (k *sessTriples) remove(id string) {
	delete(k.triples, id)
	delete(k.dirty, id)
	if k.deleted == nil {
		k.deleted = map[string]bool{}
	}
	k.deleted[id] = true
	k.ver++
}

// unitDeleted is the cascade: unit id leaves every triple's supports, and
// triples left with none are deleted. Nothing is written: replay derives
// the same from the unit's "del" record.
func (k *sessTriples) unitDeleted(id string) {
	for tid, t := range k.triples {
		i := slices.Index(t.Support, id)
		if i < 0 {
			continue
		}
		if len(t.Support) == 1 {
			delete(k.triples, tid)
			delete(k.dirty, tid)
		} else {
			c := *t
			c.Support = slices.Delete(slices.Clone(t.Support), i, i+1)
			k.triples[tid] = &c
		}
		k.ver++
	}
}

// applyTripleRecord replays a "triple" or "tdel" record.
func (s *session) applyTripleRecord(r *record) error {
	if r.K == "tdel" {
		s.kb.remove(r.ID)
		return nil
	}
	if r.Triple == nil || r.Triple.ID == "" {
		return fmt.Errorf("memory: bad triple record: %w", errCorrupt)
	}
	if s.kb.deleted[r.Triple.ID] {
		return nil
	}
	t := r.Triple.triple()
	// Supports deleted since (or before, in a shared log) do not count.
	t.Support = slices.DeleteFunc(slices.Clone(t.Support), func(id string) bool { return s.deleted[id] })
	if len(t.Support) == 0 {
		if _, ok := s.kb.triples[t.ID]; ok {
			delete(s.kb.triples, t.ID)
			s.kb.ver++
		}
		return nil
	}
	s.kb.put(&t)
	return nil
}

// appendTripleRecords frames the triples and deletions not yet written.
func (k *sessTriples) appendRecords(framed []byte, now time.Time) ([]byte, error) {
	var err error
	for _, id := range k.dels {
		if framed, err = encodeRecord(framed, &record{K: "tdel", T: now.UnixNano(), ID: id}); err != nil {
			return framed, err
		}
	}
	ids := make([]string, 0, len(k.dirty))
	for id := range k.dirty {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if t := k.triples[id]; t != nil {
			if framed, err = encodeRecord(framed, &record{K: "triple", T: now.UnixNano(), Triple: t.record()}); err != nil {
				return framed, err
			}
		}
	}
	return framed, nil
}

// written marks what appendRecords framed as written.
func (k *sessTriples) written(dels int) {
	k.dels = k.dels[dels:]
	clear(k.dirty)
}

// tripleID names a triple: the session's hash prefix (so an id names one
// session of the user), the last message seq of its job and its index.
func tripleID(sess *session, seq uint64, i int) string {
	return fmt.Sprintf("tri-%s-%012d-%02d", sess.hash[:8], seq, i)
}

// applyTriplesLocked applies a fact job's triple lines after its fact
// operations: adds are the job's [ADD] operations in reply order, for "+n"
// supports. Every rejection is logged and counted, and changes nothing.
func (kn *knowledge) applyTriplesLocked(job *extractJob, lines string, added map[int]string, now time.Time) {
	if lines == "" {
		return
	}
	sess := job.sess
	ops, rejected := parseTriples(lines)
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
		for _, t := range sess.kb.triples {
			if strings.EqualFold(t.Subject, op.Subject) && strings.EqualFold(t.Predicate, op.Predicate) && strings.EqualFold(t.Object, op.Object) {
				same = t
				break
			}
		}
		if same != nil {
			merged := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(same.Support), sup...))))
			if len(merged) > maxStoredSupport {
				reject(fmt.Errorf("%w: %s would have %d supports (max %d)", ErrInvalid, same.ID, len(merged), maxStoredSupport))
				continue
			}
			if len(merged) != len(same.Support) {
				c := *same
				c.Support, c.At = merged, now
				sess.kb.put(&c)
				sess.kb.markDirty(c.ID)
			}
			continue
		}
		if len(sess.kb.triples) >= maxSessionTriples {
			reject(fmt.Errorf("%w: %d triples, the most a session keeps", ErrInvalid, len(sess.kb.triples)))
			continue
		}
		id := tripleID(sess, job.to, next)
		for sess.kb.triples[id] != nil || sess.kb.deleted[id] {
			next++
			id = tripleID(sess, job.to, next)
		}
		next++
		sess.kb.put(&Triple{ID: id, Subject: op.Subject, Predicate: op.Predicate, Object: op.Object, Support: sup, At: now})
		sess.kb.markDirty(id)
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

// attachGraphLocked gives the session's index the graph of its triples
// when they changed since (or the index was rebuilt). Called with sess.mu
// held, before a search.
func (rt *retriever) attachGraphLocked(sess *session, x *index.Index) {
	kb := &sess.kb
	if x == nil || kb.graphIx == x && kb.graphVer == kb.ver {
		return
	}
	var g *index.EntityGraph
	if len(kb.triples) > 0 {
		g = index.NewEntityGraph(indexLinks(tripleLinks(sortedTriples(kb.triples), func(id string) string { return id })))
	}
	x.SetGraph(g)
	kb.graphIx, kb.graphVer = x, kb.ver
}

// sortedTriples returns the triples newest first (id breaks ties).
func sortedTriples(m map[string]*Triple) []*Triple {
	out := make([]*Triple, 0, len(m))
	for _, t := range m {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *Triple) int {
		if c := b.At.Compare(a.At); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out
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
			for _, t := range sess.kb.triples {
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
		_, ok := sess.kb.triples[id]
		if ok && sess.exists && !sess.gone.Load() && sess.user == user {
			sess.kb.remove(id)
			sess.kb.dels = append(sess.kb.dels, id)
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
