package memory

import (
	"bytes"
	"cmp"
	"encoding/json"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
	"github.com/kvsidecar/kvsidecar/memory/internal/pool"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// Block layout. A block's text is assembled from stored strings in a fixed
// order, so the same memories give the same bytes. It is a sequence of
// segments, each ending in "\n" and starting with a character that is
// neither whitespace nor "/": the cl100k and o200k pre-tokenizers then
// always split between segments, so a block's token count is exactly the
// sum of its segments' counts, each cached. A new combination of memories
// costs no tokenization (TestBlockCountIsAdditive checks the claim).
// RecallBlockPrefix starts the content of every recall block, so tools
// (benchmarks, tests) can tell the block from the client's messages.
const RecallBlockPrefix = "Memory recalled for the next message"

const (
	stableHeader    = "Memory kept by the sidecar from earlier in this conversation.\n"
	blockSummaries  = "## Summary of earlier turns\n"
	blockPinned     = "## Core memory\n"
	recallHeader    = RecallBlockPrefix + " (earlier turns no longer in context, oldest first):\n"
	maxRecalledText = 2000 // bytes of one recalled memory in the block
	blockTimeLayout = "2006-01-02"
)

// cachedBlock is a block as shown in a window.
type cachedBlock struct {
	raw  json.RawMessage
	cost int
	enc  Encoding
	// sums are the summaries shown (oldest first); nsum is len(sums).
	sums []*Unit
	nsum int
	// fp fingerprints what the block was made of (every pinned memory and
	// the summaries shown, with their text, and the pool view), so a kept
	// block is dropped as soon as any of it changed.
	fp uint64
	// pooled is how many pool entries the block shows.
	pooled int
	// set marks a block that was made (raw may be nil: nothing to show).
	set bool
}

func summarySegment(u *Unit) string { return "- " + strings.TrimSpace(u.Content) + "\n" }

// stableBlock returns the block after the client's system messages: pinned
// (system and core) memories by id, then the newest summaries that fit
// Window.StableMaxTokens, oldest first, then, for a request that named a
// pool prefix, the pool's entries under it, newest first, within
// Pool.ContextTokens (package pool's views). Unless refresh, the session's block
// of the previous window is kept while everything it was made of is
// unchanged, so the prompt's start stays byte-identical until history next
// leaves the window (new summaries wait for that) or the pool under the
// prefix changes; a changed or deleted memory it shows is never kept.
func (wb *windowBuilder) stableBlock(sess *session, p windowParams, refresh bool) cachedBlock {
	sess.refreshIndex()
	if st := &sess.sticky; !refresh && st.set && st.enc == p.enc && st.fp == stableFingerprint(sess, st.sums, p.pool) {
		return *st
	}
	b := cachedBlock{set: true, enc: p.enc}
	limit := wb.opts.Window.StableMaxTokens
	tk := wb.tok
	var pool []string
	if p.pool != nil && wb.opts.Pool.ContextTokens > 0 {
		left := wb.opts.Pool.ContextTokens - tk.Count(p.enc, poolBlockHeader)
		for _, it := range p.pool.Items {
			if c := tk.Count(p.enc, it.Seg); c <= left {
				left -= c
				pool = append(pool, it.Seg)
			}
		}
	}
	b.pooled = len(pool)
	if len(pool) == 0 && (limit <= 0 || (len(sess.pinned) == 0 && len(sess.sums) == 0)) {
		b.fp = stableFingerprint(sess, nil, p.pool)
		return b
	}
	budget := limit - MessageFraming - tk.Count(p.enc, stableHeader)
	var pinned []*Unit
	if len(sess.pinned) > 0 && limit > 0 {
		left := budget - tk.Count(p.enc, blockPinned)
		for _, u := range sess.pinned {
			if c := tk.Count(p.enc, summarySegment(u)); c <= left {
				left -= c
				pinned = append(pinned, u)
			}
		}
		if len(pinned) > 0 {
			budget = left
		}
	}
	if len(sess.sums) > 0 && limit > 0 {
		left := budget - tk.Count(p.enc, blockSummaries)
		for i := len(sess.sums) - 1; i >= 0; i-- {
			c := tk.Count(p.enc, summarySegment(sess.sums[i]))
			if c > left {
				break
			}
			left -= c
			b.sums = append(b.sums, sess.sums[i])
		}
		slices.Reverse(b.sums)
	}
	b.nsum = len(b.sums)
	b.fp = stableFingerprint(sess, b.sums, p.pool)
	if len(pinned) == 0 && len(b.sums) == 0 && len(pool) == 0 {
		return b
	}
	segs := []string{stableHeader}
	if len(pinned) > 0 {
		segs = append(segs, blockPinned)
		for _, u := range pinned {
			segs = append(segs, summarySegment(u))
		}
	}
	if len(b.sums) > 0 {
		segs = append(segs, blockSummaries)
		for _, u := range b.sums {
			segs = append(segs, summarySegment(u))
		}
	}
	if len(pool) > 0 {
		// Last: the pool changes more often than what comes before it.
		segs = append(segs, poolBlockHeader)
		segs = append(segs, pool...)
	}
	b.raw, b.cost = wb.assembleBlock(p.enc, segs)
	return b
}

// stableFingerprint hashes every pinned memory of the session and the
// summaries shown, ids and current text ("" once deleted), and the pool
// view (its entries' keys and versions).
func stableFingerprint(sess *session, sums []*Unit, pv *pool.View) uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	for _, u := range sess.pinned {
		h.WriteString(u.ID)
		h.WriteByte(0)
		h.WriteString(u.Content)
		h.WriteByte(0)
	}
	h.WriteByte(1)
	for _, u := range sums {
		h.WriteString(u.ID)
		h.WriteByte(0)
		if cur := sess.units[u.ID]; cur != nil {
			h.WriteString(cur.Content)
		}
		h.WriteByte(0)
	}
	h.WriteByte(2)
	if pv != nil {
		h.WriteString(strconv.FormatUint(pv.FP, 16))
	}
	return h.Sum64()
}

// shortQueryTerms: a newest message with fewer index terms than this
// ("and then?", "why?") is recalled for together with the message before
// it; any other alone, so that the previous reply's words do not outweigh
// the question's ("What is my passport number?" after a packing list asks
// about the passport, not the packing).
const shortQueryTerms = 2

// query is the recall query for the current turn starting at cur: the
// newest user message, plus up to ctxBytes of the message before it when
// the newest message is short.
func query(sess *session, cur, ctxBytes int) string {
	if cur >= len(sess.hist) {
		return ""
	}
	q := sess.hist[cur].text()
	if ctxBytes > 0 && cur > 0 && len(index.Tokenize(q)) < shortQueryTerms {
		if prev := sess.hist[cur-1].text(); prev != "" {
			q += "\n" + sanitize.Truncate(prev, ctxBytes)
		}
	}
	return q
}

// recallItem is one memory a recall chose: a unit of this session, or a
// document of the user's cross-session index.
type recallItem struct {
	id    string
	role  string
	text  string
	at    time.Time
	cross bool  // from another session of the user
	unit  *Unit // nil for cross-session documents
	// weak marks a lexical hit that does not pass the recall gate: it
	// counts for the working memory's topic probe, it is not shown.
	weak bool
}

// segment renders the item; its date heads the group of items of that day
// (dateSegment).
func (it *recallItem) segment() string {
	var b strings.Builder
	b.WriteString("- ")
	if it.role != "" {
		b.WriteString(it.role)
	}
	if it.cross {
		if it.role != "" {
			b.WriteString(", ")
		}
		b.WriteString("another session")
	}
	if it.role != "" || it.cross {
		b.WriteString(": ")
	}
	b.WriteString(strings.TrimSpace(sanitize.Truncate(it.text, maxRecalledText)))
	b.WriteByte('\n')
	return b.String()
}

// dateSegment heads the items of one day ("" for undated items).
func dateSegment(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return "On " + t.UTC().Format(blockTimeLayout) + ":\n"
}

// recallBlock makes the recall block for the current turn (starting at cur)
// within budget tokens: the memories recallLocked chose for its query, best
// first while they fit, without those whose text is already in the window
// or repeated, shown oldest first with their dates. Recalled units of the
// session are touched (access count, recency).
func (wb *windowBuilder) recallBlock(sess *session, p windowParams, cur int, groups []group, stable cachedBlock, budget int, w *window) {
	q := query(sess, cur, max(wb.opts.Recall.QueryContextBytes, 0))
	skip := make(map[string]bool, len(stable.sums))
	for _, u := range stable.sums {
		skip[u.ID] = true
	}
	items, mode := p.recall(recallQuery{text: q, focus: sess.hist[cur].text()}, skip)
	w.recallMode = mode
	if len(items) == 0 && p.toolCtx == "" {
		return
	}
	seen := make(map[uint64]bool, len(sess.hist)-cur+2*len(groups)+len(items))
	for _, g := range groups {
		if !g.drop {
			for _, e := range sess.hist[g.lo:g.hi] {
				seen[e.contentHash()] = true
				for _, h := range e.blockHashes {
					seen[h] = true // shown by an earlier block still in the window
				}
			}
		}
	}
	for _, e := range sess.hist[cur:] {
		seen[e.contentHash()] = true
	}
	tk := wb.tok
	left := budget - MessageFraming - tk.Count(p.enc, recallHeader)
	toolSeg := ""
	if p.toolCtx != "" {
		// The previous turn's tool context is fitted first (it is about
		// this turn) and shown last.
		toolSeg = knowledge.ToolCtxHeader + p.toolCtx + "\n"
		if c := tk.Count(p.enc, toolSeg); c <= left {
			left -= c
		} else {
			toolSeg = ""
		}
	}
	kept := make([]*recallItem, 0, len(items))
	segs := make(map[*recallItem]string, len(items))
	days := map[string]bool{}
	for i := range items {
		it := &items[i]
		h := textHash(it.text)
		if seen[h] {
			continue
		}
		seg := it.segment()
		c := tk.Count(p.enc, seg)
		day := dateSegment(it.at)
		if day != "" && !days[day] {
			c += tk.Count(p.enc, day)
		}
		if c <= left {
			left -= c
			seen[h] = true
			days[day] = true
			kept = append(kept, it)
			segs[it] = seg
		}
	}
	if len(kept) == 0 && toolSeg == "" {
		return
	}
	slices.SortFunc(kept, func(a, b *recallItem) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	parts := make([]string, 0, 2*len(kept)+1)
	parts = append(parts, recallHeader)
	day := ""
	for _, it := range kept {
		if d := dateSegment(it.at); d != day {
			if d != "" {
				parts = append(parts, d)
			}
			day = d
		}
		parts = append(parts, segs[it])
		if it.cross {
			w.crossSession++
		}
		if u := it.unit; u != nil {
			u.AccessCount++
			u.LastAccess = p.now
			if u.Category != "" {
				touch(u, p.now)
			}
			if sess.accessDirty == nil {
				sess.accessDirty = map[string]bool{}
			}
			sess.accessDirty[u.ID] = true
		}
	}
	if toolSeg != "" {
		parts = append(parts, toolSeg)
		w.toolCtx = true
		wb.toolShown.Add(1)
	}
	w.recall, w.recallTokens = wb.assembleBlock(p.enc, parts)
	w.recalled = len(kept)
	w.recallHashes = make([]uint64, 0, len(kept))
	for _, it := range kept {
		w.recallHashes = append(w.recallHashes, textHash(it.text))
	}
}

// assembleBlock makes a system message of segs; its cost is the sum of the
// segments' cached counts plus the message framing.
func (wb *windowBuilder) assembleBlock(enc Encoding, segs []string) (json.RawMessage, int) {
	content := strings.Join(segs, "")
	cost := MessageFraming
	for _, sg := range segs {
		cost += wb.tok.Count(enc, sg)
	}
	var buf bytes.Buffer
	je := json.NewEncoder(&buf)
	je.SetEscapeHTML(false)
	if err := je.Encode(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{"system", content}); err != nil {
		return nil, 0
	}
	return json.RawMessage(bytes.TrimRight(buf.Bytes(), "\n")), cost
}

// textHash identifies a memory's text for deduplication; it is never 0
// (an entry's cached hash uses 0 for "not computed").
func textHash(text string) uint64 { return maphash.String(keySeed, strings.TrimSpace(text)) | 1 }
