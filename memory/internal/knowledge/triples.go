package knowledge

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// The knowledge base beside the log: (subject, predicate, object) triples
// the background model extracts with the facts, each supported by the
// facts it was drawn from.
//
// Extraction rides on the fact job's call (one prompt, one reply, so the
// sidecar's calls per client turn stay what they were): the fact prompt
// also asks for triple lines, and the reply's "[TRIPLE]" lines are cut out
// before ParseFactOps sees the rest. A triple's supports are ids of the
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
// shorter form (TripleRecord).
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

// TripleRecord is a triple as a "triple" log record holds it (the log's
// format: short keys, no session).
type TripleRecord struct {
	ID        string    `json:"id"`
	Subject   string    `json:"s"`
	Predicate string    `json:"p"`
	Object    string    `json:"o"`
	Support   []string  `json:"sup"`
	At        time.Time `json:"at"`
}

func (t *Triple) Record() *TripleRecord {
	return &TripleRecord{ID: t.ID, Subject: t.Subject, Predicate: t.Predicate, Object: t.Object, Support: t.Support, At: t.At}
}

func (r *TripleRecord) Triple() Triple {
	return Triple{ID: r.ID, Subject: r.Subject, Predicate: r.Predicate, Object: r.Object, Support: r.Support, At: r.At}
}

// TripleOp is one parsed triple line: Support holds fact ids and "+n"
// references to the reply's n-th [ADD].
type TripleOp struct {
	Subject, Predicate, Object string
	Support                    []string
}

// String renders the line in the form ParseTriples accepts.
func (op TripleOp) String() string {
	return tripleTag + " " + op.Subject + " | " + op.Predicate + " | " + op.Object + " | " + strings.Join(op.Support, ", ")
}

// Limits of the triple parser and store.
const (
	tripleTag          = "[TRIPLE]"
	maxTripleTermBytes = 200 // subject, predicate or object
	maxTripleSupport   = 8   // supports of one line
	MaxStoredSupport   = 32  // supports of a stored triple (lines of equal triples merge)
	maxTripleOps       = 32  // triple lines per reply
	maxTripleRef       = 32  // "+n" may name the first 32 [ADD]s
	MaxSessionTriples  = 1000
)

// TripleInstructions is appended to the fact prompt.
const TripleInstructions = "\nThen state what the new messages say as knowledge triples, one per line, exactly:\n" +
	tripleTag + " <subject> | <predicate> | <object> | <supporting fact ids, comma-separated>\n" +
	"A supporting id is one of the ids listed above, or +1 for the first [ADD] of your reply, +2 for the second, and so on. " +
	"Subjects and objects are short names of people, places, things or events. Only triples the facts support.\n"

// CutTripleLines splits a reply into its triple lines and the rest.
func CutTripleLines(out string) (rest, triples string) {
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

// ParseTriples parses triple lines strictly: each non-blank line is exactly
// "[TRIPLE] subject | predicate | object | id, id" with three texts of
// 1–200 bytes (valid UTF-8, no control or format characters, no "|", no
// operation marker) and 1–8 supports, each a fact id ([a-z0-9-], 1–64) or
// "+n" (1 ≤ n ≤ 32). Every other line — malformed, too long, beyond 32
// triples or 64 KiB — is rejected with an error wrapping memerr.ErrInvalid and
// skipped; it never stops the valid ones.
func ParseTriples(out string) (ops []TripleOp, rejected []error) {
	return ParseLines(out, "triples", "triples", maxTripleOps, parseTriple)
}

func parseTriple(line string) (TripleOp, error) {
	if len(line) > maxFactLineBytes {
		return TripleOp{}, fmt.Errorf("line of %d bytes", len(line))
	}
	if !utf8.ValidString(line) {
		return TripleOp{}, fmt.Errorf("invalid UTF-8")
	}
	rest, ok := strings.CutPrefix(line, tripleTag+" ")
	if !ok {
		return TripleOp{}, fmt.Errorf("not a triple")
	}
	parts := strings.Split(rest, "|")
	if len(parts) != 4 {
		return TripleOp{}, fmt.Errorf("%d fields, want subject | predicate | object | supports", len(parts))
	}
	var op TripleOp
	for i, dst := range []*string{&op.Subject, &op.Predicate, &op.Object} {
		t := strings.TrimSpace(parts[i])
		if len(t) > maxTripleTermBytes {
			return TripleOp{}, fmt.Errorf("field %d of %d bytes (max %d)", i+1, len(t), maxTripleTermBytes)
		}
		if err := ValidFactText(t); err != nil {
			return TripleOp{}, fmt.Errorf("field %d: %v", i+1, err)
		}
		*dst = t
	}
	for sup := range strings.SplitSeq(parts[3], ",") {
		sup = strings.TrimSpace(sup)
		if ref, isRef := strings.CutPrefix(sup, "+"); isRef {
			n, err := strconv.Atoi(ref)
			if err != nil || n < 1 || n > maxTripleRef || ref != strconv.Itoa(n) {
				return TripleOp{}, fmt.Errorf("bad reference %q", sanitize.Truncate(sup, 16))
			}
		} else if err := ValidFactID(sup); err != nil {
			return TripleOp{}, fmt.Errorf("support: %v", err)
		}
		if slices.Contains(op.Support, sup) {
			continue
		}
		if len(op.Support) == maxTripleSupport {
			return TripleOp{}, fmt.Errorf("more than %d supports", maxTripleSupport)
		}
		op.Support = append(op.Support, sup)
	}
	return op, nil
}

// KB is a session's knowledge base: its triples, what is left to write
// of them, and the graph last given to its index. The session's lock
// protects it; its owner (package memory) writes the records.
type KB struct {
	Triples map[string]*Triple // by id
	Deleted map[string]bool    // ids an operator deleted: never recreated
	Dirty   map[string]bool    // triples to write
	Dels    []string           // operator deletions to write
	Ver     uint64             // counts changes
	// graphIx and graphVer: the index the graph was last attached to, and
	// the version it reflects.
	graphIx  *index.Index
	graphVer uint64
}

// Put adds or replaces a triple.
func (k *KB) Put(t *Triple) {
	if k.Triples == nil {
		k.Triples = map[string]*Triple{}
	}
	k.Triples[t.ID] = t
	k.Ver++
}

// MarkDirty marks a triple to write.
func (k *KB) MarkDirty(id string) {
	if k.Dirty == nil {
		k.Dirty = map[string]bool{}
	}
	k.Dirty[id] = true
}

// Remove deletes a triple (an operator's delete: it is written and never
// recreated).
func (k *KB) Remove(id string) {
	delete(k.Triples, id)
	delete(k.Dirty, id)
	if k.Deleted == nil {
		k.Deleted = map[string]bool{}
	}
	k.Deleted[id] = true
	k.Ver++
}

// UnitDeleted is the cascade: unit id leaves every triple's supports, and
// triples left with none are deleted. Nothing is written: replay derives
// the same from the unit's "del" record.
func (k *KB) UnitDeleted(id string) {
	for tid, t := range k.Triples {
		i := slices.Index(t.Support, id)
		if i < 0 {
			continue
		}
		if len(t.Support) == 1 {
			delete(k.Triples, tid)
			delete(k.Dirty, tid)
		} else {
			c := *t
			c.Support = slices.Delete(slices.Clone(t.Support), i, i+1)
			k.Triples[tid] = &c
		}
		k.Ver++
	}
}

// Written marks what the owner framed (Dels[:dels] and Dirty) as written.
func (k *KB) Written(dels int) {
	k.Dels = k.Dels[dels:]
	clear(k.Dirty)
}

// SortedTriples returns the triples newest first (id breaks ties).
func SortedTriples(m map[string]*Triple) []*Triple {
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

// AttachGraph gives x the graph of the triples when they changed since it
// was last attached (or x is another index: rebuilt). The session's lock
// is held; called before a search.
func (k *KB) AttachGraph(x *index.Index) {
	if x == nil || k.graphIx == x && k.graphVer == k.Ver {
		return
	}
	var g *index.EntityGraph
	if len(k.Triples) > 0 {
		g = index.NewEntityGraph(IndexLinks(Links(SortedTriples(k.Triples), func(id string) string { return id })))
	}
	x.SetGraph(g)
	k.graphIx, k.graphVer = x, k.Ver
}

// MoveSupport adds to every triple resting on one of from the unit to, so
// the triples survive the deletion of from (written as "triple" records).
func (k *KB) MoveSupport(from []string, to string) {
	for tid, t := range k.Triples {
		if !slices.ContainsFunc(t.Support, func(id string) bool { return slices.Contains(from, id) }) || slices.Contains(t.Support, to) {
			continue
		}
		c := *t
		c.Support = append(slices.Clone(t.Support), to)
		slices.Sort(c.Support)
		k.Triples[tid] = &c
		k.MarkDirty(tid)
		k.Ver++
	}
}

// Link is one triple of a user's session in the user's graph (the
// user's graph file keeps them: short JSON keys).
type Link struct {
	Subject   string    `json:"s"`
	Predicate string    `json:"p"`
	Object    string    `json:"o"`
	Docs      []string  `json:"d"` // user-index document ids
	At        time.Time `json:"at"`
}

// Links turns triples (newest first) into graph links, naming each
// support with doc (which returns "" for a support to leave out).
func Links(ts []*Triple, doc func(unitID string) string) []Link {
	out := make([]Link, 0, len(ts))
	for _, t := range ts {
		var docs []string
		for _, id := range t.Support {
			if d := doc(id); d != "" {
				docs = append(docs, d)
			}
		}
		if len(docs) > 0 {
			out = append(out, Link{Subject: t.Subject, Predicate: t.Predicate, Object: t.Object, Docs: docs, At: t.At})
		}
	}
	return out
}

// IndexLinks converts links for index.NewEntityGraph.
func IndexLinks(ls []Link) []index.Link {
	out := make([]index.Link, len(ls))
	for i, l := range ls {
		out[i] = index.Link{Subject: l.Subject, Predicate: l.Predicate, Object: l.Object, Docs: l.Docs}
	}
	return out
}
