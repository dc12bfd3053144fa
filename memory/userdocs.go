package memory

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// userDocPrefix is the prefix of the session's documents in its user's
// index.
func userDocPrefix(sess *session) string { return sess.hash + "|" }

func isUserDocID(id string) bool { return strings.Contains(id, "|") }

// userDocID names a memory of sess in its user's index; role is the
// message's role or the unit's, reduced to [a-z_].
func userDocID(sess *session, role, unitID string) string {
	r := make([]byte, 0, len(role))
	for i := 0; i < len(role) && i < 16; i++ {
		c := role[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if (c >= 'a' && c <= 'z') || c == '_' {
			r = append(r, c)
		}
	}
	return userDocPrefix(sess) + string(r) + "|" + unitID
}

// userDocText is what the user's index holds of a memory: its text, then the
// message before it as context after a record separator.
func userDocText(text, context string) string {
	text = sanitize.Truncate(text, maxDocBytes)
	if context == "" {
		return text
	}
	return text + "\x1e" + sanitize.Truncate(context, maxDocBytes/4)
}

// userItem makes the recall item of a document of the user's index.
func userItem(id, text string, m index.Meta) recallItem {
	role := ""
	if _, rest, ok := strings.Cut(id, "|"); ok {
		role, _, _ = strings.Cut(rest, "|")
	}
	text, _, _ = strings.Cut(text, "\x1e")
	return recallItem{id: id, role: role, text: text, at: m.Time, cross: true}
}

// unitDocID is the id of u's document in the user's index: a message
// still in the history is its entry's document (named with the message's
// role), any other unit its own (named with unitRole). Called with sess.mu
// held.
func (sess *session) unitDocID(u *Unit) string {
	if u.ID == msgUnitID(u.FromSeq) {
		if i := sess.histIndex(u.FromSeq); i >= 0 {
			return userDocID(sess, sess.hist[i].msg.Role, u.ID)
		}
	}
	return userDocID(sess, unitRole(u), u.ID)
}

// userDocsLocked returns the session's documents for its user's index that
// are not there yet in their current text, and the ids there that the
// session no longer has. Messages are documents as soon as they are
// stored (they only ever become units of the same id, so they are visited
// once, by seq); units when they are not a message of the history (facts,
// episodes, added memories, orphan replies, messages cut from the history)
// and not summaries, visited when the units changed. Deleted units were
// queued by deleteUnit. Called with sess.mu held.
func (sess *session) userDocsLocked() (docs []index.Doc, stale []string, marks map[string]uint64) {
	marks = map[string]uint64{}
	want := func(id, text string, m index.Meta) {
		if text == "" {
			return
		}
		h := textHash(text)
		marks[id] = h
		if old, ok := sess.uidx[id]; ok && old == h {
			return
		}
		docs = append(docs, index.Doc{ID: id, Text: text, Meta: m})
	}
	from := len(sess.hist)
	for from > 0 && (sess.uidx == nil || sess.hist[from-1].seq > sess.uSeq) {
		from--
	}
	for i := from; i < len(sess.hist); i++ {
		e := sess.hist[i]
		ctx := ""
		if i > 0 {
			ctx = sess.hist[i-1].text()
		}
		want(userDocID(sess, e.msg.Role, msgUnitID(e.seq)), userDocText(e.text(), ctx), index.Meta{Time: e.at})
	}
	if sess.uidx == nil || sess.uUnitsVer != sess.unitsVer {
		for _, u := range sess.units {
			if u.Type == UnitSummary || (u.ID == msgUnitID(u.FromSeq) && sess.histIndex(u.FromSeq) >= 0) {
				continue // summaries stay in their session; a message's document is its entry's
			}
			m := unitMeta(u)
			if !u.At.IsZero() {
				m.Time = u.At
			}
			want(sess.unitDocID(u), userDocText(u.Content, ""), m)
		}
	}
	stale, sess.userDel = sess.userDel, nil
	return docs, stale, marks
}

// unitRole is the role a unit's document names: its category for
// categorized memories, else its message role.
func unitRole(u *Unit) string {
	if u.Category != "" {
		return string(u.Category)
	}
	return u.Role
}

// setUserMarksLocked records what the user's index holds of the session
// after a sync. Called with sess.mu held.
func (sess *session) setUserMarksLocked(marks map[string]uint64, stale []string, seq, ver uint64) {
	if sess.uidx == nil {
		sess.uidx = make(map[string]uint64, len(marks))
	}
	for id, h := range marks {
		sess.uidx[id] = h
	}
	for _, id := range stale {
		delete(sess.uidx, id)
	}
	sess.uSeq, sess.uUnitsVer = seq, ver
}

// syncUserDocs brings the session's documents in its user's index up to
// date: new and changed ones are added (embedded with no lock held),
// deleted ones removed. The first sync after the session loaded also
// removes documents of the session the index holds but the session no
// longer has, and skips those already there in the same text.
func (rt *retriever) syncUserDocs(sess *session, um *userMem) {
	x := um.index()
	if x == nil {
		return
	}
	// Two at once would both count the documents neither found (the
	// user's per-session counts, which hasOthers reads, drift) and race
	// on the marks.
	sess.uSync.Lock()
	defer sess.uSync.Unlock()
	sess.mu.Lock()
	if sess.gone.Load() || !sess.exists {
		sess.mu.Unlock()
		return
	}
	if sess.uGen != um.gen {
		// Marks describe what another copy of the user's index got (it was
		// unloaded and loaded again since): start over with this one.
		sess.uidx, sess.uSeq, sess.uUnitsVer, sess.uKbVer, sess.uGen = nil, 0, 0, 0, um.gen
	}
	first := sess.uidx == nil
	links, linksChanged := sess.userLinksLocked(first)
	docs, stale, marks := sess.userDocsLocked()
	seq, ver := uint64(0), sess.unitsVer
	if n := len(sess.hist); n > 0 {
		seq = sess.hist[n-1].seq
	}
	prefix := userDocPrefix(sess)
	if linksChanged {
		// Under sess.mu (order sess.mu → um.mu, as in searchUser): a
		// delete after this drops them; one before it returned above.
		um.setLinks(sess.hash, links)
	}
	sess.mu.Unlock()
	if first {
		x.Range(func(id string, _ index.Meta) bool {
			if _, ok := marks[id]; !ok && strings.HasPrefix(id, prefix) {
				stale = append(stale, id)
			}
			return true
		})
		docs = slices.DeleteFunc(docs, func(d index.Doc) bool {
			old, ok := x.Get(d.ID)
			return ok && old.Text == d.Text
		})
	}
	ctx := rt.ctx
	if rt.localEmbedder {
		ctx = context.Background() // offline: also on Close
	}
	if rt.reembed(ctx, x) {
		um.changed()
	}
	if len(docs) == 0 && len(stale) == 0 {
		sess.mu.Lock()
		sess.setUserMarksLocked(marks, stale, seq, ver)
		sess.mu.Unlock()
		return
	}
	if !rt.localEmbedder && ctx.Err() != nil {
		return // closing: a remote embedder is not called any more
	}
	added := 0
	for _, d := range docs {
		if _, ok := x.Get(d.ID); !ok {
			added++
		}
	}
	if len(docs) > 0 {
		if err := x.Upsert(ctx, docs...); err != nil {
			rt.indexFailed("memory: user index", len(docs), err)
			return
		}
	}
	for _, id := range stale {
		if x.Delete(id) {
			added--
		}
	}
	um.countDocs(sess.hash, added)
	sess.mu.Lock()
	if sess.gone.Load() && !sess.exists {
		sess.mu.Unlock()
		rt.dropUserDocs(um, prefix) // deleted meanwhile
		return
	}
	// Marks describe what was sent; a change made meanwhile is caught by
	// the next sync (unitsVer or the last seq moved).
	sess.setUserMarksLocked(marks, stale, seq, ver)
	sess.mu.Unlock()
	um.changed()
	rt.capUser(um)
}

// forgetSessionDocs drops the documents of the session whose log was at
// logPath (deleted by retention) from the loaded indexes of its tenant's
// users. Unloaded ones drop them when next loaded (their log is gone).
func (rg *registry) forgetSessionDocs(logPath string) {
	hash := strings.TrimSuffix(filepath.Base(logPath), ".log")
	tdir := filepath.Dir(filepath.Dir(logPath))
	rg.mu.Lock()
	var ums []*userMem
	for _, um := range rg.users {
		if um.tenantDir == tdir {
			ums = append(ums, um)
		}
	}
	rg.mu.Unlock()
	for _, um := range ums {
		if um.hasDocsOf(hash) {
			rg.recall.dropUserDocs(um, hash+"|")
		}
	}
}

// hasDocsOf reports whether the index holds documents of the session
// hashed h, or its graph links of it.
func (um *userMem) hasDocsOf(h string) bool {
	um.mu.Lock()
	defer um.mu.Unlock()
	return um.docs[h] > 0 || len(um.links[h]) > 0
}

// dropUserDocs removes every document with prefix (a session's: its hash
// and "|") from the user's index, and the session's links from its graph.
func (rt *retriever) dropUserDocs(um *userMem, prefix string) {
	x := um.index()
	if x == nil {
		return
	}
	um.setLinks(strings.TrimSuffix(prefix, "|"), nil)
	var ids []string
	x.Range(func(id string, _ index.Meta) bool {
		if strings.HasPrefix(id, prefix) {
			ids = append(ids, id)
		}
		return true
	})
	for _, id := range ids {
		if x.Delete(id) {
			um.countDocs(docSession(id), -1)
		}
	}
	if len(ids) > 0 {
		um.changed()
	}
}

// capUser keeps the user's index within Recall.UserMaxDocs: past 110% of
// it, the oldest documents leave until 90% remain.
func (rt *retriever) capUser(um *userMem) {
	x, limit := um.index(), rt.opts.Recall.UserMaxDocs
	if x == nil || x.Len() <= limit+limit/10 {
		return
	}
	type aged struct {
		id string
		t  time.Time
	}
	var all []aged
	x.Range(func(id string, m index.Meta) bool {
		all = append(all, aged{id, m.Time})
		return true
	})
	slices.SortFunc(all, func(a, b aged) int {
		if c := a.t.Compare(b.t); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	for _, a := range all[:max(0, len(all)-limit*9/10)] {
		if x.Delete(a.id) {
			um.countDocs(docSession(a.id), -1)
		}
	}
	um.changed()
}
