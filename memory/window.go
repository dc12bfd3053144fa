package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"time"
)

// window is the result of building the Focus window.
type window struct {
	msgs        []json.RawMessage
	costs       []int
	block       json.RawMessage
	blockTokens int
	sysTokens   int
	histTokens  int // kept history + current turn
	evicted     int
	recalled    int
	summaries   int
}

// group is a span of history dropped or kept as a whole: a turn, from a
// user message up to the next one. Keeping whole turns keeps tool calls with
// their results and the user/assistant alternation strict chat templates
// require.
type group struct {
	lo, hi int // hist[lo:hi]
	cost   int
	score  float64
	drop   bool
}

// windowParams are the inputs that do not live in the session.
type windowParams struct {
	enc      Encoding
	limit    int
	tools    int
	strategy Strategy
	now      time.Time
}

// buildWindow builds the window from the session's stored state, marking
// newly evicted history as dropped and creating their units (in memory; the
// worker persists them). Call with sess.mu held.
func (s *Store) buildWindow(ctx context.Context, sess *session, p windowParams) (*window, error) {
	tk := s.tok
	w := &window{}
	for _, e := range sess.sys {
		w.sysTokens += e.cost(tk, p.enc)
	}
	hist := sess.hist
	mandStart := len(hist)
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].msg.Role == "user" {
			mandStart = i
			break
		}
	}
	mandCost := 0
	for _, e := range hist[mandStart:] {
		mandCost += e.cost(tk, p.enc)
	}
	if w.sysTokens+mandCost+p.tools > p.limit {
		return nil, fmt.Errorf("%w: system %d + current turn %d + tools %d tokens > limit %d",
			ErrContextTooLarge, w.sysTokens, mandCost, p.tools, p.limit)
	}
	query := ""
	if mandStart < len(hist) {
		query = hist[mandStart].msg.Content
	}

	// Group the history before the current turn into turns; a turn that was
	// partly evicted (its messages arrived over several requests) goes whole.
	var groups []group
	total := 0
	for lo := 0; lo < mandStart; {
		hi := lo + 1
		for hi < mandStart && hist[hi].msg.Role != "user" {
			hi++
		}
		g := group{lo: lo, hi: hi}
		anyDropped := false
		for _, e := range hist[lo:hi] {
			g.cost += e.cost(tk, p.enc)
			anyDropped = anyDropped || e.dropped
		}
		if anyDropped {
			g.drop = true
			for _, e := range hist[lo:hi] {
				if !e.dropped {
					s.evict(sess, e, 0, p)
					w.evicted++
				}
			}
		} else {
			groups = append(groups, g)
			total += g.cost
		}
		lo = hi
	}

	sysPad := max(w.sysTokens, s.opts.SystemReserve)
	toolsPad := max(p.tools, s.opts.ToolsReserve)
	budgetFor := func(blockCost int) int {
		return p.limit - sysPad - toolsPad - blockCost - mandCost
	}
	// Prefix-cache friendliness: while nothing leaves the window, the block
	// stays byte for byte what the previous window had, so the upstream's
	// cached prefix runs through the whole history. Recall runs again only
	// when the history is cut anyway (or what the block shows changed).
	var (
		block     json.RawMessage
		blockCost int
		recalled  []*Unit
		nsum      int
	)
	sess.refreshIndex() // pinned memories and summaries as they are now
	if st := &sess.sticky; s.opts.BlockRefresh == BlockRefreshOnEvict && st.set && w.evicted == 0 &&
		st.fp == blockFingerprint(sess, st.recalled) {
		// When the history outgrew the window with this block, it is cut
		// below and the block made again: a cheaper block alone would
		// change the prompt right after the system message without the
		// hysteresis an eviction brings.
		block, blockCost, recalled, nsum = st.raw, st.cost, st.recalled, st.nsum
		sess.lastRecall = "sticky"
	} else {
		block, blockCost, recalled, nsum = s.buildBlock(ctx, sess, p, query)
	}
	budget := budgetFor(blockCost)
	if budget < 0 && blockCost > 0 {
		block, blockCost, recalled, nsum = nil, 0, nil, 0
		budget = budgetFor(0)
	}
	if budget < 0 {
		// Oversized system prompt or tools: give up the reserves' padding.
		budget = p.limit - w.sysTokens - p.tools - mandCost
	}
	reblock := false
	if total > budget {
		// Evict so that a full block fits afterwards: the block is made
		// again below, once the evicted turns are memories it may recall.
		full := budgetFor(s.opts.InjectMaxTokens)
		reblock = full > 0
		target := int(float64(budget) * s.opts.EvictTo)
		if reblock {
			target = int(float64(full) * s.opts.EvictTo)
		}
		strategy := p.strategy
		if strategy == StrategySummary {
			strategy = StrategyImportance
			if sess.coveredSeq > 0 {
				strategy = StrategyTail
			}
		}
		order := make([]int, len(groups))
		for i := range order {
			order[i] = i
		}
		if strategy == StrategyImportance {
			scoreGroups(groups, hist, makeBow(query))
			slices.SortStableFunc(order, func(a, b int) int {
				switch {
				case groups[a].score < groups[b].score:
					return -1
				case groups[a].score > groups[b].score:
					return 1
				}
				return 0
			})
		}
		for _, gi := range order {
			if total <= target {
				break
			}
			g := &groups[gi]
			g.drop = true
			total -= g.cost
			for _, e := range hist[g.lo:g.hi] {
				s.evict(sess, e, g.score, p)
				w.evicted++
			}
		}
	}

	if reblock {
		block, blockCost, recalled, nsum = s.buildBlock(ctx, sess, p, query)
	}
	// A block made before this request's eviction may miss the turns that
	// just left: it is not kept as sticky, so the next request recalls.
	sess.sticky = cachedBlock{raw: block, cost: blockCost, recalled: recalled, nsum: nsum,
		fp: blockFingerprint(sess, recalled), set: w.evicted == 0 || reblock}

	w.msgs = make([]json.RawMessage, 0, len(sess.sys)+1+len(hist)-mandStart+len(groups))
	w.costs = make([]int, 0, cap(w.msgs))
	add := func(raw json.RawMessage, cost int) {
		w.msgs = append(w.msgs, raw)
		w.costs = append(w.costs, cost)
	}
	for _, e := range sess.sys {
		add(e.msg.Raw, e.cost(tk, p.enc))
	}
	if block != nil {
		add(block, blockCost)
		w.block, w.blockTokens, w.summaries = block, blockCost, nsum
		w.recalled = len(recalled)
		for _, u := range recalled {
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
	for _, g := range groups {
		if g.drop {
			continue
		}
		for _, e := range hist[g.lo:g.hi] {
			c := e.cost(tk, p.enc)
			add(e.msg.Raw, c)
			w.histTokens += c
		}
	}
	for _, e := range hist[mandStart:] {
		e.dropped = false
		c := e.cost(tk, p.enc)
		add(e.msg.Raw, c)
		w.histTokens += c
	}
	if got := w.sysTokens + w.blockTokens + w.histTokens + p.tools; got > p.limit {
		// Unreachable by construction; refuse rather than overflow.
		return nil, fmt.Errorf("memory: internal error: window %d tokens > limit %d", got, p.limit)
	}
	return w, nil
}

// scoreGroups sets each group's importance: 0.4 semantic similarity to the
// newest user message + 0.3 recency + 0.2 user emphasis + 0.1 structure,
// each in [0, 1]; a group takes the best of its messages per feature.
func scoreGroups(groups []group, hist []*entry, q *bow) {
	n := len(groups)
	for i := range groups {
		g := &groups[i]
		sem, emph, strct := 0.0, 0.0, 0.0
		for _, e := range hist[g.lo:g.hi] {
			e.features()
			sem = max(sem, cosine(q, e.bow))
			emph = max(emph, e.emph)
			strct = max(strct, e.strct)
		}
		recency := float64(i+1) / float64(n)
		g.score = 0.4*sem + 0.3*recency + 0.2*emph + 0.1*strct
	}
}

// evict marks e as left the window and gives it a working unit.
func (s *Store) evict(sess *session, e *entry, importance float64, p windowParams) {
	e.dropped = true
	s.stats.evicted.Add(1)
	id := msgUnitID(e.seq)
	if sess.units[id] != nil || sess.deleted[id] {
		return
	}
	if sess.redundant(e) {
		sess.drops = append(sess.drops, e.seq) // no unit: remember it left (dedupe.go)
		return
	}
	if importance == 0 {
		e.features()
		importance = 0.2*e.emph + 0.1*e.strct
	}
	sess.putUnit(unitFromEntry(e, s.tok, p.enc, importance, p.now))
}

// Block layout. The text is assembled from stored strings in a fixed order,
// so the same memories give the same bytes. It is a sequence of segments,
// each ending in "\n" and starting with a character that is neither
// whitespace nor "/": the cl100k and o200k pre-tokenizers then always split
// between segments, so the block's token count is exactly the sum of its
// segments' counts, each cached. A new combination of memories costs no
// tokenization (TestBlockCountIsAdditive checks the claim).
const (
	blockHeader     = "Memory from earlier in this conversation, kept by the sidecar because it no longer fits the context window.\n"
	blockSummaries  = "## Summary of earlier turns\n"
	blockRecalled   = "## Recalled from earlier turns\n"
	blockPinned     = "## Core memory\n"
	maxRecalledText = 2000 // bytes of one recalled unit in the block
)

// summarySegment and unitSegment render one block segment.
func summarySegment(u *Unit) string { return "- " + strings.TrimSpace(u.Content) + "\n" }

func unitSegment(u *Unit) string {
	return "- [" + u.Role + "] " + strings.TrimSpace(truncateRunes(u.Content, maxRecalledText)) + "\n"
}

// buildBlock makes the injected system message: pinned (system and core)
// memories ordered by id, summaries oldest→newest (the newest that fit
// InjectMaxTokens), then recalled memories ordered by id (chosen by
// recallLocked through the working memory). It returns nil when there is
// nothing to inject. The same memories give the same bytes.
func (s *Store) buildBlock(ctx context.Context, sess *session, p windowParams, query string) (json.RawMessage, int, []*Unit, int) {
	if len(sess.units) == 0 || s.opts.InjectMaxTokens == 0 {
		return nil, 0, nil, 0
	}
	sess.refreshIndex()
	tk := s.tok
	budget := s.opts.InjectMaxTokens - MessageFraming - tk.Count(p.enc, blockHeader)
	fit := func(us []*Unit, header string, seg func(*Unit) string) []*Unit {
		if len(us) == 0 {
			return nil
		}
		b := budget - tk.Count(p.enc, header)
		var kept []*Unit
		for _, u := range us {
			if c := tk.Count(p.enc, seg(u)); c <= b {
				b -= c
				kept = append(kept, u)
			}
		}
		if len(kept) > 0 {
			budget = b
		}
		return kept
	}
	pinned := fit(sess.pinned, blockPinned, summarySegment)
	// Newest summaries first while they fit, shown oldest first.
	var keptSums []*Unit
	if sums := sess.sums; len(sums) > 0 {
		b := budget - tk.Count(p.enc, blockSummaries)
		for i := len(sums) - 1; i >= 0; i-- {
			c := tk.Count(p.enc, summarySegment(sums[i]))
			if c > b {
				break
			}
			b -= c
			keptSums = append(keptSums, sums[i])
		}
		if len(keptSums) > 0 {
			budget = b
		}
		slices.Reverse(keptSums)
	}
	skip := make(map[string]bool, len(keptSums))
	for _, u := range keptSums {
		skip[u.ID] = true
	}
	cands, mode := s.recallLocked(ctx, sess, query, p.now, skip)
	sess.lastRecall = mode
	recalled := fit(cands, blockRecalled, unitSegment)

	var h maphash.Hash
	h.SetSeed(keySeed)
	h.WriteByte(byte(p.enc))
	for _, part := range [][]*Unit{pinned, keptSums, recalled} {
		for _, u := range part {
			h.WriteString(u.ID)
			h.WriteByte(0)
		}
		h.WriteByte(1)
	}
	key := h.Sum64() ^ sess.unitsVer*0x9E3779B97F4A7C15
	if c := &sess.block; c.key == key && c.key != 0 {
		return c.raw, c.cost, c.recalled, c.nsum
	}
	raw, cost := s.assembleBlock(p, pinned, keptSums, recalled)
	if raw == nil {
		recalled, keptSums = nil, nil
	}
	sess.block = cachedBlock{key: key, raw: raw, cost: cost, recalled: recalled, nsum: len(keptSums)}
	return raw, cost, recalled, len(keptSums)
}

// blockFingerprint hashes what a block shows: every pinned memory and
// summary of the session and the recalled units, ids and text.
func blockFingerprint(sess *session, recalled []*Unit) uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	for _, part := range [][]*Unit{sess.pinned, sess.sums, recalled} {
		for _, u := range part {
			h.WriteString(u.ID)
			h.WriteByte(0)
			h.WriteString(u.Content)
			h.WriteByte(0)
		}
		h.WriteByte(1)
	}
	return h.Sum64()
}

func (s *Store) assembleBlock(p windowParams, pinned, sums, recalled []*Unit) (json.RawMessage, int) {
	if len(pinned) == 0 && len(sums) == 0 && len(recalled) == 0 {
		return nil, 0
	}
	segs := make([]string, 0, 4+len(pinned)+len(sums)+len(recalled))
	segs = append(segs, blockHeader)
	if len(pinned) > 0 {
		segs = append(segs, blockPinned)
		for _, u := range pinned {
			segs = append(segs, summarySegment(u))
		}
	}
	if len(sums) > 0 {
		segs = append(segs, blockSummaries)
		for _, u := range sums {
			segs = append(segs, summarySegment(u))
		}
	}
	if len(recalled) > 0 {
		segs = append(segs, blockRecalled)
		for _, u := range recalled {
			segs = append(segs, unitSegment(u))
		}
	}
	content := strings.Join(segs, "")
	cost := MessageFraming
	for _, sg := range segs {
		cost += s.tok.Count(p.enc, sg)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{"system", content}); err != nil {
		return nil, 0
	}
	return json.RawMessage(bytes.TrimRight(buf.Bytes(), "\n")), cost
}
