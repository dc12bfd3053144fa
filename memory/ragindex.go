package memory

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// The RAG index is per session: memory units belong to sessions, so a
// session's index holds exactly its units (tenant isolation by
// construction, no filtering at query time) and deleting the session
// deletes its index. Sharing across sessions goes through the pool.
//
// The index lives next to the session log, <hash>.idx, written atomically
// (index.Save) at most every Options.IndexSaveInterval by the worker and on
// Close. It is derived data: on load it is checked against the units from
// the log, and a missing, corrupt or stale file is rebuilt from them (the
// stored vectors of documents whose text still matches are reused). Deleting
// a memory deletes it from the index at once.
//
// Each message unit is indexed together with the message before it (a
// question and its answer retrieve each other); the unit's own text is what
// gets injected.
//
// Messages still in the window are documents too, under the id their unit
// gets when they leave it (msg-<seq>) and in the same text, so the unit
// takes the document over without a new embedding: Store.Recall (the MCP
// tool) finds what the session said as soon as it is recorded, extraction
// or not. The recall block, which shows only what the window does not,
// searches units alone (searchSession). A message that leaves the history
// (a failed turn undone) or the window without a unit of its own takes its
// document with it (forgetEntryDoc).

// maxDocBytes bounds the text of one indexed document.
const maxDocBytes = 16 << 10

func indexPath(sess *session) string { return strings.TrimSuffix(sess.path, ".log") + ".idx" }

// docText is the indexed text of u.
func (sess *session) docText(u *Unit) string {
	if (u.Type == UnitTask || u.Type == UnitContext) && u.FromSeq == u.ToSeq {
		return sess.messageDocText(u.Content, u.FromSeq)
	}
	return sanitize.Truncate(u.Content, maxDocBytes)
}

// messageDocText is the indexed text of message seq holding text: the text,
// then the message before it.
func (sess *session) messageDocText(text string, seq uint64) string {
	if seq > 1 {
		if prev := sess.prevMessageText(seq); prev != "" {
			text += "\n" + prev
		}
	}
	return sanitize.Truncate(text, maxDocBytes)
}

// msgSeq parses a message unit id (msgUnitID).
func msgSeq(id string) (uint64, bool) {
	rest, ok := strings.CutPrefix(id, "msg-")
	if !ok || len(rest) != 12 {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 64)
	return n, err == nil
}

// windowEntry returns the history message still in the window whose
// document id is id (a message without a unit yet), or nil.
func (sess *session) windowEntry(id string) *entry {
	seq, ok := msgSeq(id)
	if !ok || sess.units[id] != nil {
		return nil
	}
	if i := sess.histIndex(seq); i >= 0 && !sess.hist[i].dropped {
		return sess.hist[i]
	}
	return nil
}

// windowDoc is the document of e, a message in the window.
func (sess *session) windowDoc(e *entry) index.Doc {
	return index.Doc{ID: msgUnitID(e.seq), Text: sess.messageDocText(e.text(), e.seq), Meta: index.Meta{Time: e.at}}
}

// forgetEntryDoc removes the window document of e, a message leaving the
// history, or the window without a unit of its own. Called with sess.mu
// held.
func (sess *session) forgetEntryDoc(e *entry) {
	e.indexed = false
	id := msgUnitID(e.seq)
	if sess.ix != nil && sess.units[id] == nil && sess.ix.Delete(id) {
		sess.ixVer++
	}
}

// prevMessageText is the text of the history message before seq.
func (sess *session) prevMessageText(seq uint64) string {
	if i := sess.histIndex(seq); i > 0 {
		return sess.hist[i-1].text()
	}
	if u := sess.units[msgUnitID(seq-1)]; u != nil {
		return u.Content
	}
	return ""
}

// unitMeta is what the index's reranker reads.
func unitMeta(u *Unit) index.Meta {
	t := u.CreatedAt
	if u.TouchedAt.After(t) {
		t = u.TouchedAt
	}
	return index.Meta{Time: t, Importance: max(u.Importance, 0), AccessCount: int64(u.AccessCount)}
}

func metaEqual(a, b index.Meta) bool {
	return a.Time.Equal(b.Time) && a.Importance == b.Importance && a.AccessCount == b.AccessCount
}

// indexLocked returns the session's index, loading it on first use, with
// every unit indexed when the embedder is local (offline: microseconds per
// unit); with a remote embedder the worker indexes new units. nil when the
// index is off. Called with sess.mu held.
func (rt *retriever) indexLocked(ctx context.Context, sess *session) *index.Index {
	if rt.opts.Recall.IndexDisabled {
		return nil
	}
	if sess.ix == nil {
		rt.loadIndexLocked(ctx, sess)
	}
	if rt.localEmbedder {
		rt.indexPendingLocked(ctx, sess)
	}
	return sess.ix
}

// loadIndexLocked loads the session's index file and reconciles it with the
// units; a missing or corrupt file gives an empty index that the pending
// units then fill.
func (rt *retriever) loadIndexLocked(ctx context.Context, sess *session) {
	path := indexPath(sess)
	x, err := index.Load(path, rt.ixOpts)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			rt.opts.Logger.Warn("memory: session index unusable, rebuilding from units", "file", path, "err", err)
			rt.stats.indexRebuilds.Add(1)
		} else if len(sess.units) > 0 {
			rt.stats.indexRebuilds.Add(1)
		}
		if x, err = index.New(rt.ixOpts); err != nil {
			// Options were validated at Open; unreachable.
			rt.opts.Logger.Error("memory: new index", "err", err)
			return
		}
		sess.ix = x
		sess.ixVer, sess.ixSaved = 0, 0
		if len(sess.units) > 0 {
			sess.ixVer = 1 // write the rebuilt index
		}
		return
	}
	var keep []index.Doc
	stale := false
	for _, u := range sess.units {
		d, ok := x.Get(u.ID)
		if !ok {
			continue
		}
		text := sess.docText(u)
		if d.Text != text {
			stale = true
			continue
		}
		m := unitMeta(u)
		if !metaEqual(d.Meta, m) {
			stale = true
		}
		keep = append(keep, index.Doc{ID: u.ID, Text: text, Meta: m, Vector: d.Vector})
		u.indexed = true
	}
	for _, e := range sess.hist {
		id := msgUnitID(e.seq)
		if e.dropped || sess.units[id] != nil {
			continue
		}
		d, ok := x.Get(id)
		if !ok {
			continue
		}
		w := sess.windowDoc(e)
		if d.Text != w.Text {
			stale = true
			continue
		}
		if !metaEqual(d.Meta, w.Meta) {
			stale = true
		}
		w.Vector = d.Vector
		keep = append(keep, w)
		e.indexed = true
	}
	if stale || x.Len() != len(keep) {
		// Documents of deleted or changed units: rebuild from the rest,
		// reusing their vectors (no embedding).
		if err := x.Rebuild(ctx, keep); err != nil {
			rt.opts.Logger.Warn("memory: reconcile session index", "err", err)
			for _, u := range sess.units {
				u.indexed = false
			}
			for _, e := range sess.hist {
				e.indexed = false
			}
			x, _ = index.New(rt.ixOpts)
		}
		sess.ixVer, sess.ixSaved = 1, 0
	}
	sess.ix = x
}

// pendingDocsLocked returns the documents of units whose latest state is
// not indexed and of messages in the window not indexed yet, reusing
// stored vectors when the text is unchanged.
func (rt *retriever) pendingDocsLocked(sess *session) []index.Doc {
	if sess.ix == nil {
		return nil
	}
	var docs []index.Doc
	add := func(d index.Doc) {
		if old, ok := sess.ix.Get(d.ID); ok && old.Text == d.Text {
			d.Vector = old.Vector
		}
		docs = append(docs, d)
	}
	for _, u := range sess.units {
		if !u.indexed {
			add(index.Doc{ID: u.ID, Text: sess.docText(u), Meta: unitMeta(u)})
		}
	}
	for _, e := range sess.hist {
		if e.indexed || e.dropped || sess.units[msgUnitID(e.seq)] != nil || sess.deleted[msgUnitID(e.seq)] {
			continue
		}
		if strings.TrimSpace(e.text()) == "" {
			e.indexed = true // nothing to find
			continue
		}
		add(sess.windowDoc(e))
	}
	slices.SortFunc(docs, func(a, b index.Doc) int { return strings.Compare(a.ID, b.ID) })
	return docs
}

// markIndexedLocked records that docs were upserted: units still in that
// state are indexed; documents of units deleted meanwhile are removed.
func (rt *retriever) markIndexedLocked(sess *session, x *index.Index, docs []index.Doc) {
	for _, d := range docs {
		if u := sess.units[d.ID]; u != nil {
			if sess.docText(u) == d.Text && metaEqual(unitMeta(u), d.Meta) {
				u.indexed = true
			}
			continue
		}
		if e := sess.windowEntry(d.ID); e != nil {
			if w := sess.windowDoc(e); w.Text == d.Text && metaEqual(w.Meta, d.Meta) {
				e.indexed = true
			}
			continue
		}
		x.Delete(d.ID)
	}
	sess.ixVer++
}

// updateMetaOnly applies the documents whose text the index already holds
// as metadata updates (no tokenizing, no embedding) and returns the others.
func updateMetaOnly(x *index.Index, docs []index.Doc) []index.Doc {
	rest := docs[:0]
	for _, d := range docs {
		if d.Vector != nil && x.UpdateMeta(d.ID, d.Meta) == nil {
			continue
		}
		rest = append(rest, d)
	}
	return rest
}

// indexPendingLocked indexes pending units under the session's lock.
func (rt *retriever) indexPendingLocked(ctx context.Context, sess *session) {
	docs := rt.pendingDocsLocked(sess)
	if len(docs) == 0 {
		return
	}
	all := slices.Clone(docs)
	if docs = updateMetaOnly(sess.ix, docs); len(docs) == 0 {
		rt.markIndexedLocked(sess, sess.ix, all)
		return
	}
	if err := sess.ix.Upsert(ctx, docs...); err != nil {
		rt.indexFailed("memory: index units", len(docs), err)
		return
	}
	rt.markIndexedLocked(sess, sess.ix, all)
}

// syncIndex is the worker's part: it indexes pending units with the
// session unlocked while embedding, then saves the index if it changed and
// the last save is IndexSaveInterval old (always when force).
func (rt *retriever) syncIndex(sess *session, force bool) {
	sess.mu.Lock()
	if rt.opts.Recall.IndexDisabled || sess.gone.Load() || !sess.exists {
		sess.mu.Unlock()
		return
	}
	if sess.ix == nil {
		rt.loadIndexLocked(rt.ctx, sess)
	}
	x := sess.ix
	docs := rt.pendingDocsLocked(sess)
	sess.mu.Unlock()
	if x == nil {
		return
	}
	ctx := rt.ctx
	if rt.localEmbedder {
		ctx = context.Background() // offline: also indexes on Close
	}
	if len(docs) > 0 && ctx.Err() == nil {
		var err error
		if rest := updateMetaOnly(x, slices.Clone(docs)); len(rest) > 0 {
			err = x.Upsert(ctx, rest...)
		}
		sess.mu.Lock()
		if err != nil {
			rt.indexFailed("memory: index units", len(docs), err)
		} else if sess.ix == x {
			rt.markIndexedLocked(sess, x, docs)
		}
		sess.mu.Unlock()
	}
	if rt.reembed(ctx, x) {
		sess.mu.Lock()
		if sess.ix == x {
			sess.ixVer++
		}
		sess.mu.Unlock()
	}
	rt.saveIndex(sess, x, force)
}

// reembed embeds an index's documents again when its embedder moved to
// another vector space (a remote model changed) and no update did it; it
// reports whether it did.
func (rt *retriever) reembed(ctx context.Context, x *index.Index) bool {
	if ctx.Err() != nil || !x.Stale() {
		return false
	}
	if err := x.Reembed(ctx); err != nil {
		rt.indexFailed("memory: re-embed an index for a new vector space", x.Len(), err)
		return false
	}
	return true
}

// indexFailed counts an index update that failed; the units stay pending
// and the next sync tries again. One whose embedding failed is logged at
// debug level: the embedder logs its outages once.
func (rt *retriever) indexFailed(msg string, n int, err error) {
	rt.stats.indexErrors.Add(1)
	if errors.Is(err, index.ErrEmbed) {
		rt.opts.Logger.Debug(msg, "n", n, "err", err)
		return
	}
	rt.opts.Logger.Warn(msg, "n", n, "err", err)
}

// saveIndex writes the index file if it changed since the last save.
func (rt *retriever) saveIndex(sess *session, x *index.Index, force bool) {
	sess.mu.Lock()
	now := rt.opts.Clock.Now()
	due := sess.ix == x && sess.exists && !sess.gone.Load() && sess.ixVer != sess.ixSaved &&
		(force || now.Sub(sess.ixLastSave) >= rt.opts.Recall.IndexSaveInterval)
	ver := sess.ixVer
	path := indexPath(sess)
	if due {
		sess.ixLastSave = now
	}
	sess.mu.Unlock()
	if !due {
		return
	}
	if err := x.Save(path); err != nil {
		rt.stats.indexErrors.Add(1)
		rt.opts.Logger.Warn("memory: save session index", "err", err)
		return
	}
	rt.stats.indexSaves.Add(1)
	sess.mu.Lock()
	if sess.ix == x && ver > sess.ixSaved {
		sess.ixSaved = ver
	}
	gone := sess.gone.Load() && !sess.exists
	sess.mu.Unlock()
	if gone {
		// Deleted while saving: do not leave the file behind.
		os.Remove(path)
	}
}
