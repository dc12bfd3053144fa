package memory

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
)

// recallQuery is what recall searches for: text ranks the memories (the
// newest user message, with a little context when it is short), focus
// gates them (the newest user message alone: a memory must cover enough
// of it, see Recall.MinCoverage). window also searches the messages still
// in the window (Store.Recall: the caller does not see the window; the
// recall block shows only what the window does not) and never answers
// nothing when a memory holds the query's words: the gate then lets the
// best few of them through.
type recallQuery struct {
	text, focus string
	window      bool
}

// minShown is how many memories a window query shows at least when
// memories hold some of its words but none passes the gate.
const minShown = 3

// recallLocked chooses the memories to show for query (the newest user
// message with a little context) through the session's working memory:
//
//   - the active set is expired (Recall.ActiveSetDecay after each memory's
//     last activation);
//   - if it is not empty, a light probe (the Recall.ProbeK best lexical
//     hits, no query embedding) is compared with the active set and its
//     Hebbian neighbours: an overlap of at least Recall.ReuseOverlap means
//     the same topic, and the full retrieval is skipped: the previous set
//     (what of it still exists, with its current text) is shown again
//     together with the probe's hits, which are activated;
//   - otherwise a full retrieval (the Recall.K best hybrid hits of the
//     session's index and the user's cross-session index) replaces the set;
//     its best Recall.ActiveSetSize hits join the active set and
//     strengthen their links (so do the probe's hits in the
//     neighbourhood on reuse).
//
// The gating decides only whether the full retrieval runs: a reused set is
// rebuilt from current memory each turn, so a deleted or changed memory is
// never shown stale. Index hits count when a query term matched (BM25 > 0)
// or their cosine similarity reaches Recall.MinScore; Recaller hits when
// their score does. The ids in skip and pinned memories are left out. The
// result is best first. Called with sess.mu held.
func (rt *retriever) recallLocked(ctx context.Context, sess *session, um *userMem, query recallQuery, now time.Time, skip map[string]bool) ([]recallItem, string) {
	o := &rt.opts.Recall
	if strings.TrimSpace(query.text) == "" || o.K <= 0 {
		return nil, ""
	}
	wm := &sess.wm
	wm.expire(now, o.ActiveSetDecay)
	if len(wm.active) > 0 && o.ProbeK > 0 {
		// The probe tells the topic: every lexical hit counts there, the
		// weak ones included; only those passing the gate are shown. On
		// the active topic the lexical search stands for the full one
		// (no query embedding, no graph): its K best that pass the gate
		// are shown with the previous set, so a new question on the topic
		// still finds what only it asks about.
		words := rt.searchAll(ctx, sess, um, query, max(o.K, o.ProbeK), index.ModeBM25, skip)
		probe := words[:min(len(words), o.ProbeK)]
		hood := wm.neighbourhood(now, o.LinkHalfLife)
		if len(probe) > 0 && overlap(itemIDs(probe), hood) >= o.ReuseOverlap {
			rt.stats.probeReuses.Add(1)
			items := append(strong(words), strong(rt.gated(ctx, sess, um, query, rt.itemsFor(sess, um, wm.injected, skip)))...)
			items = uniqueItems(items, o.K+len(words))
			var active []string
			for _, it := range probe {
				if hood[it.id] {
					active = append(active, it.id)
				}
			}
			if len(items) > 0 || !query.window {
				wm.activate(active, now, o.ActiveSetSize)
				wm.coactivate(active, now, o.LinkHalfLife)
				wm.injected = slices.Sorted(slices.Values(itemIDs(items)))
				return items, "reuse"
			}
			// Nothing of the topic passes for this query: a full retrieval.
		}
	}
	// Every hit joins the working memory (the topic), as before the gate;
	// only those passing it are shown.
	all := rt.searchAll(ctx, sess, um, query, o.K, index.ModeHybrid, skip)
	full := strong(all)
	if len(full) == 0 && query.window {
		full = all[:min(len(all), minShown)]
	}
	if len(all) == 0 {
		wm.injected = nil
		return nil, ""
	}
	rt.stats.fullRecalls.Add(1)
	wm.injected = slices.Sorted(slices.Values(itemIDs(full)))
	ids := itemIDs(all)
	top := ids[:min(len(ids), o.ActiveSetSize)]
	wm.activate(top, now, o.ActiveSetSize)
	wm.coactivate(top, now, o.LinkHalfLife)
	return full, "full"
}

// gated marks the items of an earlier recall that do not pass the gate for
// this query: the same topic, but not what this question is about.
func (rt *retriever) gated(ctx context.Context, sess *session, um *userMem, q recallQuery, items []recallItem) []recallItem {
	own, user := rt.indexLocked(ctx, sess), um.index()
	// What the entities of the question reach through the graph stays
	// relevant, as it was when a full recall found it.
	var reach [2]map[string]bool
	reached := [2]bool{}
	for i := range items {
		x, k := own, 0
		if items[i].cross {
			x, k = user, 1
		}
		var cov float64
		if x != nil {
			cov, _ = x.Coverage(q.gate(), items[i].id)
			if !rt.relevant(cov, 0) && !reached[k] {
				reach[k], reached[k] = x.GraphReach(q.gate(), rt.opts.Recall.K), true
			}
		}
		items[i].weak = !rt.relevant(cov, 0) && !reach[k][items[i].id]
	}
	return items
}

// strong returns the items that pass the recall gate.
func strong(items []recallItem) []recallItem {
	out := items[:0:0]
	for _, it := range items {
		if !it.weak {
			out = append(out, it)
		}
	}
	return out
}

func itemIDs(items []recallItem) []string {
	ids := make([]string, len(items))
	for i := range items {
		ids[i] = items[i].id
	}
	return ids
}

// uniqueItems drops repeated ids, keeping the first, and cuts to n.
func uniqueItems(items []recallItem, n int) []recallItem {
	seen := make(map[string]bool, len(items))
	out := items[:0]
	for _, it := range items {
		if !seen[it.id] && len(out) < n {
			seen[it.id] = true
			out = append(out, it)
		}
	}
	return out
}

// searchAll returns up to k memories for query, best first: the session's
// own (its index, or the Recaller when the index is off or fails) and the
// user's other sessions' (the user's cross-session index), interleaved by
// rank since the two indexes' scores are not comparable.
func (rt *retriever) searchAll(ctx context.Context, sess *session, um *userMem, query recallQuery, k int, mode index.Mode, skip map[string]bool) []recallItem {
	own := rt.searchSession(ctx, sess, query, k, mode, skip)
	cross := rt.searchUser(ctx, sess, um, query, k, mode)
	if len(cross) == 0 {
		return own
	}
	if len(own) == 0 {
		return cross
	}
	out := make([]recallItem, 0, min(k, len(own)+len(cross)))
	for i := 0; len(out) < k && (i < len(own) || i < len(cross)); i++ {
		if i < len(own) {
			out = append(out, own[i])
		}
		if i < len(cross) && len(out) < k {
			out = append(out, cross[i])
		}
	}
	return out
}

// relevant is the recall gate: a memory covers enough of the question's
// words (Recall.MinCoverage; see index.Index.Coverage), or its embedding is
// similar enough (cos, Recall.MinScore). A memory sharing one frequent word
// with the question stays out: each recalled token is reprocessed by the
// engine on the turn it appears, so only what is about the question is
// worth it.
func (rt *retriever) relevant(coverage, cos float64) bool {
	o := &rt.opts.Recall
	return o.MinCoverage < 0 || coverage >= o.MinCoverage || cos >= o.MinScore
}

// gateHit judges a search hit: found when a retriever really matched it
// (a keyword, the graph, or an embedding close enough), weak when found
// but not passing the recall gate. What the graph reached through an
// entity of the query and a link holding more of the query is relevant.
func (rt *retriever) gateHit(h index.Hit) (found, weak bool) {
	cos := rt.gateCosine(h)
	found = h.BM25 > 0 || h.Graph > 0 || cos >= rt.opts.Recall.MinScore
	return found, h.Graph == 0 && !rt.relevant(h.Coverage, cos)
}

// gateCosine is the similarity the gate compares with Recall.MinScore: the
// cosine of the offline embedder, whose vectors share features only through
// shared words and spellings; for a model's embeddings, the cosine when it
// stands Recall.MinCosineZ standard deviations above the query's similarity
// with the memories searched, else 0.
func (rt *retriever) gateCosine(h index.Hit) float64 {
	o := &rt.opts.Recall
	if rt.localEmbedder || o.MinCosineZ < 0 {
		return h.Cosine
	}
	if h.CosineZ >= o.MinCosineZ {
		return max(h.Cosine, o.MinScore)
	}
	return 0
}

// gate returns the part of the query a memory must cover: the newest user
// message, or the whole query when that message has no index terms.
func (q recallQuery) gate() string {
	if len(index.Tokenize(q.focus)) > 0 {
		return q.focus
	}
	return q.text
}

// unitItem makes the recall item of a session unit.
func unitItem(u *Unit) recallItem {
	at := u.At
	if at.IsZero() {
		at = u.CreatedAt
	}
	role := u.Role
	if u.Category != "" && u.Category != CategoryEpisode {
		role = string(u.Category)
	}
	return recallItem{id: u.ID, role: role, text: u.Content, at: at, unit: u}
}

// searchSession searches the session's own memory units.
func (rt *retriever) searchSession(ctx context.Context, sess *session, query recallQuery, k int, mode index.Mode, skip map[string]bool) []recallItem {
	usable := func(id string) bool {
		if skip[id] {
			return false
		}
		if u := sess.units[id]; u != nil {
			return !u.Category.Pinned()
		}
		return query.window && sess.windowEntry(id) != nil
	}
	item := func(id string) recallItem {
		if u := sess.units[id]; u != nil {
			return unitItem(u)
		}
		return entryItem(sess.windowEntry(id))
	}
	var out []recallItem
	searched := false // the index answered
	if x := rt.indexLocked(ctx, sess); x != nil && x.Len() > 0 {
		// The index searches with the graph of the session's triples
		// (attached again when they changed or the index was rebuilt).
		sess.kb.AttachGraph(x)
		hits, err := x.SearchFocus(ctx, query.text, query.gate(), k, mode, usable)
		if err == nil {
			searched = true
			for _, h := range hits {
				if found, weak := rt.gateHit(h); found {
					it := item(h.ID)
					it.weak = weak
					out = append(out, it)
				}
			}
		} else {
			rt.searchFailed(sess, x, "memory: index search failed, using the Recaller", err)
		}
	}
	if !searched {
		sess.refreshIndex()
		var hits []RecallHit
		if len(sess.cands) > 0 {
			var err error
			if hits, err = rt.opts.Recall.Recaller.Recall(ctx, query.text, sess.cands, k+recallExtra); err != nil {
				rt.opts.Logger.Warn("memory: recall failed", "err", err)
			}
		}
		for _, h := range hits {
			if u := sess.units[h.ID]; u != nil && usable(h.ID) && h.Score >= rt.opts.Recall.MinScore && len(out) < k {
				out = append(out, unitItem(u))
			}
		}
	}
	if query.window {
		out = append(out, rt.windowByWords(sess, query, k-len(out), skip, !searched)...)
	}
	return out
}

// entryItem makes the recall item of a message still in the window.
func entryItem(e *entry) recallItem {
	return recallItem{id: msgUnitID(e.seq), role: e.msg.Role, text: e.text(), at: e.at}
}

// windowByWords returns up to k messages in the window that the session's
// index does not hold yet (with a remote embedder the worker indexes them
// after the turn), or all of them when the index did not answer (off or
// failing), found by their words: one holding enough of the query's focus
// (Recall.MinCoverage of its terms) passes the gate, one holding less is
// weak. Best first.
func (rt *retriever) windowByWords(sess *session, query recallQuery, k int, skip map[string]bool, all bool) []recallItem {
	if k <= 0 {
		return nil
	}
	q := makeBow(query.text)
	focus := makeBow(query.gate())
	if q.norm == 0 {
		return nil
	}
	type scoredEntry struct {
		e     *entry
		score float64
		cover float64
	}
	var found []scoredEntry
	for _, e := range sess.hist {
		if (e.indexed && !all) || e.dropped || skip[msgUnitID(e.seq)] || sess.units[msgUnitID(e.seq)] != nil {
			continue
		}
		e.features()
		if sc := cosine(q, e.bow); sc > 0 {
			found = append(found, scoredEntry{e, sc, bowCovered(focus, e.bow)})
		}
	}
	slices.SortStableFunc(found, func(a, b scoredEntry) int { return cmp.Compare(b.score, a.score) })
	out := make([]recallItem, 0, min(k, len(found)))
	for _, f := range found[:min(k, len(found))] {
		it := entryItem(f.e)
		it.weak = !rt.relevant(f.cover, f.score)
		out = append(out, it)
	}
	return out
}

// searchUser searches the user's cross-session index, leaving out the
// current session's documents (its own memory comes from its index).
func (rt *retriever) searchUser(ctx context.Context, sess *session, um *userMem, query recallQuery, k int, mode index.Mode) []recallItem {
	x := um.index()
	if x == nil || !um.hasOthers(sess.hash) {
		return nil // nothing but this session's own documents
	}
	um.attachGraph(x)
	own := userDocPrefix(sess)
	hits, err := x.SearchFocus(ctx, query.text, query.gate(), k, mode, func(id string) bool { return !strings.HasPrefix(id, own) })
	if err != nil {
		rt.searchFailed(sess, x, "memory: user index search failed", err)
		return nil
	}
	out := make([]recallItem, 0, len(hits))
	for _, h := range hits {
		if found, weak := rt.gateHit(h); found {
			it := userItem(h.ID, h.Text, h.Meta)
			it.weak = weak
			out = append(out, it)
		}
	}
	return out
}

// searchFailed counts a failed search of x, an index of sess or of its
// user. One whose embedding failed is logged at debug level (the embedder
// logs its outages once; the turn recalls by words); when x's vectors are
// of an older vector space than its embedder's, the session is queued so
// the worker embeds them again.
func (rt *retriever) searchFailed(sess *session, x *index.Index, msg string, err error) {
	rt.stats.indexErrors.Add(1)
	if errors.Is(err, index.ErrEmbed) {
		rt.stats.recallByWords.Add(1)
		rt.opts.Logger.Debug(msg, "err", err)
		if x.Stale() {
			rt.enqueue(sess)
		}
		return
	}
	rt.opts.Logger.Warn(msg, "err", err)
}

// itemsFor returns the items of ids (a previous recalled set) that still
// exist, with their current text.
func (rt *retriever) itemsFor(sess *session, um *userMem, ids []string, skip map[string]bool) []recallItem {
	out := make([]recallItem, 0, len(ids))
	x := um.index()
	for _, id := range ids {
		if isUserDocID(id) {
			if x == nil {
				continue
			}
			if d, ok := x.Get(id); ok {
				out = append(out, userItem(d.ID, d.Text, d.Meta))
			}
			continue
		}
		if u := sess.units[id]; u != nil && !skip[id] && !u.Category.Pinned() {
			out = append(out, unitItem(u))
		} else if e := sess.windowEntry(id); e != nil && !skip[id] {
			out = append(out, entryItem(e))
		}
	}
	return out
}

// retriever owns recall (recall.go, ragindex.go, userdocs.go): the
// sessions' indexes (loaded, reconciled with the units, kept up to date,
// saved), the users' cross-session indexes' documents, and the choice of
// the memories a turn shows through the session's working memory. It
// holds no lock of its own: it works on sessions their caller locked
// (…Locked) or locks them itself, and on user indexes (userMem.mu).
//
// Invariants: an index is derived data, rebuilt from the units when
// missing, corrupt or stale; what it shows is never stale (a reused set is
// rebuilt from current memory); a deleted unit leaves the indexes at once;
// a user's index holds only that user's sessions, never another tenant's;
// with a remote embedder nothing is embedded under a session's lock.
type retriever struct {
	*env
	ixOpts index.Options
	// localEmbedder: the index embeds offline, so units are indexed on
	// the request path.
	localEmbedder bool
	// enqueue asks the worker to sync a session (an index to embed again).
	enqueue func(*session)
}
