package memory

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/pool"
)

// The window sent upstream is, in order:
//
//	client system messages | stable block | history that fits | recall block | current turn
//
// The stable block (pinned memories, summaries) changes only when history
// leaves the window or what it shows changed; history leaves in large steps
// (Window.EvictTo). The recall block is made for each turn from the newest
// user message and sits right before it; once the turn is complete it stays
// in the transcript there (entry.block), so it is part of the history the
// next windows show. Between evictions every prompt is the previous one,
// byte for byte, plus the reply, the new turn's recall block (only what
// the window does not already hold) and the new message: the engine's
// prefix cache keeps every earlier token.

// window is the result of building the window.
type window struct {
	msgs         []json.RawMessage
	costs        []int
	stable       json.RawMessage
	stableTokens int
	recall       json.RawMessage
	recallTokens int
	recallHashes []uint64 // textHash of each memory the recall block shows
	recallSeq    uint64   // the message the recall block goes before (new blocks only)
	sysTokens    int
	histTokens   int // kept history + current turn
	evicted      int
	recalled     int
	crossSession int
	summaries    int
	pooled       int // pool entries in the stable block
	recallMode   string
	toolCtx      bool // the recall block shows the previous turn's tool context
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
	// shifts: the engine moves the KV it holds (WindowOptions.EngineShifts).
	shifts bool
	// recallPart is the part of the recall block's share the history
	// budget leaves it this turn (build sets it).
	recallPart float64
	now        time.Time
	// toolCtx is the condensed tool context to show in the recall block
	// (toolctx.go), "" for none.
	toolCtx string
	// pool is the view of the shared pool the request named
	// (TurnRequest.PoolPrefix), shown in the stable block; nil for none.
	pool *pool.View
	// recall chooses the memories for the recall block: the caller's
	// recall through the session's working memory (recallLocked).
	recall func(q recallQuery, skip map[string]bool) ([]recallItem, string)
}

// budget is how the limit is shared out for one window.
type budget struct {
	history int // kept history, the current turn excluded
	recall  int // the recall block
	stable  bool
}

// build builds the window from the session's stored state: it marks
// newly evicted history as dropped and gives it units (in memory; the
// worker persists them), then recalls for the newest user message. The
// caller checked with checkFits that the system messages, the current turn
// and the tools fit. Call with sess.mu held.
func (wb *windowBuilder) build(sess *session, p windowParams) (*window, error) {
	w := &window{}
	tk := wb.tok
	for _, e := range sess.sys {
		w.sysTokens += e.cost(tk, p.enc)
	}
	cur, turnCost := currentTurn(sess.hist, nil, tk, p.enc)
	groups, total := wb.historyGroups(sess, cur, p, w)
	// A message that asks nothing gets Recall.StatementShare of the recall
	// block's budget. While the engine shifts its KV, history takes the
	// rest (evicting costs it little); otherwise the block's whole share
	// stays reserved, so the history budget does not move from turn to
	// turn.
	blockPart, reservePart := 1.0, 1.0
	if cur < len(sess.hist) && !asks(sess.hist[cur].text()) {
		blockPart = wb.opts.Recall.statementShare()
		if p.shifts {
			reservePart = blockPart
		}
	}
	p.recallPart = reservePart

	stable := wb.stableBlock(sess, p, false)
	b := wb.shareLimit(p, w.sysTokens, turnCost, stable.cost)
	if total > b.history {
		// History overflows: it leaves in one large step, after which the
		// stable block may show what changed meanwhile (new summaries).
		fresh := wb.stableBlock(sess, p, true)
		if fresh.cost > stable.cost {
			b = wb.shareLimit(p, w.sysTokens, turnCost, fresh.cost)
		}
		w.evicted += wb.evictOverflow(sess, groups, total, b.history, query(sess, cur, 0), p)
		stable = wb.stableBlock(sess, p, true)
		b = wb.shareLimit(p, w.sysTokens, turnCost, stable.cost)
	}
	if !b.stable {
		stable = cachedBlock{}
	}
	sess.sticky = stable

	w.msgs = make([]json.RawMessage, 0, len(sess.sys)+2+len(sess.hist)-cur+len(groups))
	w.costs = make([]int, 0, cap(w.msgs))
	add := func(raw json.RawMessage, cost int) {
		w.msgs = append(w.msgs, raw)
		w.costs = append(w.costs, cost)
	}
	for _, e := range sess.sys {
		add(e.msg.Raw, e.cost(tk, p.enc))
	}
	if stable.raw != nil {
		add(stable.raw, stable.cost)
		w.stable, w.stableTokens, w.summaries, w.pooled = stable.raw, stable.cost, stable.nsum, stable.pooled
	}
	for _, g := range groups {
		if g.drop {
			continue
		}
		for _, e := range sess.hist[g.lo:g.hi] {
			if e.block != nil {
				c := e.block.cost(tk, p.enc)
				add(e.block.msg.Raw, c)
				w.histTokens += c
			}
			c := e.cost(tk, p.enc)
			add(e.msg.Raw, c)
			w.histTokens += c
		}
	}
	switch {
	case cur < len(sess.hist) && sess.hist[cur].block != nil:
		// The turn was sent before (a regenerate, or a retry of a turn
		// whose reply was kept): its block stays as it was sent.
		blk := sess.hist[cur].block
		if c := blk.cost(tk, p.enc); c <= b.recall {
			w.recall, w.recallTokens, w.recallHashes = blk.msg.Raw, c, sess.hist[cur].blockHashes
			w.recallMode = "kept"
			add(w.recall, w.recallTokens)
		}
	case b.recall > 0 && cur < len(sess.hist):
		blockBudget := b.recall
		if reservePart > 0 {
			blockBudget = min(b.recall, int(float64(b.recall)*blockPart/reservePart))
		}
		wb.recallBlock(sess, p, cur, groups, stable, blockBudget, w)
		if w.recall != nil {
			add(w.recall, w.recallTokens)
			w.recallSeq = sess.hist[cur].seq
		}
	}
	for _, e := range sess.hist[cur:] {
		e.dropped = false
		c := e.cost(tk, p.enc)
		add(e.msg.Raw, c)
		w.histTokens += c
	}
	if got := w.sysTokens + w.stableTokens + w.recallTokens + w.histTokens + p.tools; got > p.limit {
		// Unreachable by construction (MEM-001 is checked by checkFits and
		// kept by shareLimit); a window over the limit is never sent.
		return nil, fmt.Errorf("memory: internal error: window %d tokens > limit %d", got, p.limit)
	}
	return w, nil
}

// asks reports whether text asks something: it holds a question mark
// (ASCII, full-width, Spanish opening or Arabic).
func asks(text string) bool { return strings.ContainsAny(text, "?？¿؟") }

// historyGroups splits the history before the current turn (which starts at
// cur) into turns. A turn that was partly evicted (its messages arrived over
// several requests) goes whole: its remaining messages are evicted now.
// It returns the groups still in the window and their total cost.
func (wb *windowBuilder) historyGroups(sess *session, cur int, p windowParams, w *window) ([]group, int) {
	hist := sess.hist
	var groups []group
	total := 0
	for lo := 0; lo < cur; {
		hi := lo + 1
		for hi < cur && hist[hi].msg.Role != "user" {
			hi++
		}
		g := group{lo: lo, hi: hi}
		anyDropped := false
		for _, e := range hist[lo:hi] {
			g.cost += e.costWithBlock(wb.tok, p.enc)
			anyDropped = anyDropped || e.dropped
		}
		if anyDropped {
			for _, e := range hist[lo:hi] {
				if !e.dropped {
					wb.evict(sess, e, 0, p)
					w.evicted++
				}
			}
		} else {
			groups = append(groups, g)
			total += g.cost
		}
		lo = hi
	}
	return groups, total
}

// shareLimit shares the limit out. The client's system messages and tools
// are charged at least their reserves (Window.SystemReserve, ToolsReserve),
// the stable block its cost, the recall block its share (Recall.Share of
// the limit, whatever it holds this turn, so that the history budget does
// not move with it), the current turn its cost; history gets the rest.
// When that is negative the recall block shrinks first, then the stable
// block goes, then the reserves' padding.
func (wb *windowBuilder) shareLimit(p windowParams, sysTokens, turnCost, stableCost int) budget {
	b := budget{recall: int(wb.opts.Recall.share() * p.recallPart * float64(p.limit)), stable: true}
	sysPad := max(sysTokens, wb.opts.Window.SystemReserve)
	toolsPad := max(p.tools, wb.opts.Window.ToolsReserve)
	rest := p.limit - sysPad - toolsPad - stableCost - turnCost
	if rest-b.recall < 0 {
		b.recall = max(rest, 0)
	}
	if rest < 0 {
		b.stable = false
		rest += stableCost
	}
	if rest < 0 {
		rest = p.limit - sysTokens - p.tools - turnCost // ≥ 0 by checkFits
	}
	b.history = rest - b.recall
	return b
}

// evictOverflow drops whole turns until the history is at most
// Window.EvictTo × its budget, by the strategy's order; when the engine
// shifts its KV, the oldest turns first until Window.ShiftEvictTo × the
// budget (what stays is one chunk of the engine's cache, moved, not
// computed). It returns how many messages left.
func (wb *windowBuilder) evictOverflow(sess *session, groups []group, total, histBudget int, query string, p windowParams) int {
	to, strategy := wb.opts.Window.EvictTo, p.strategy
	if p.shifts {
		to, strategy = wb.opts.Window.ShiftEvictTo, StrategyTail
	}
	target := int(float64(max(histBudget, 0)) * to)
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
		scoreGroups(groups, sess.hist, makeBow(query))
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
	n := 0
	for _, gi := range order {
		if total <= target {
			break
		}
		g := &groups[gi]
		g.drop = true
		total -= g.cost
		for _, e := range sess.hist[g.lo:g.hi] {
			wb.evict(sess, e, g.score, p)
			n++
		}
	}
	return n
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

// costWithBlock is e's cost in the window: the message and the recall
// block kept before it.
func (e *entry) costWithBlock(t *Tokenizer, enc Encoding) int {
	c := e.cost(t, enc)
	if e.block != nil {
		c += e.block.cost(t, enc)
	}
	return c
}

// evict marks e as left the window and gives it a working unit.
func (wb *windowBuilder) evict(sess *session, e *entry, importance float64, p windowParams) {
	e.dropped = true
	wb.evicted.Add(1)
	id := msgUnitID(e.seq)
	if sess.units[id] != nil || sess.deleted[id] {
		return
	}
	if sess.redundant(e) {
		sess.drops = append(sess.drops, e.seq) // no unit: remember it left (dedupe.go)
		sess.forgetEntryDoc(e)
		return
	}
	if importance == 0 {
		e.features()
		importance = 0.2*e.emph + 0.1*e.strct
	}
	sess.putUnit(unitFromEntry(e, wb.tok, p.enc, importance, p.now))
}

// windowBuilder builds windows (window.go, block.go): the token budget
// shared out, the history that fits, eviction in large steps, the stable
// and recall blocks. It does no I/O and holds no lock: it works on a
// session its caller locked, and the memories a recall block shows come
// from windowParams.recall. It owns its counters.
//
// Invariants: a window never exceeds its limit (MEM-001, with checkFits);
// it starts with the client's system messages and ends with the current
// turn; between evictions the previous prompt without its recall block is
// a prefix of the next (block.go).
type windowBuilder struct {
	opts *Options
	tok  *Tokenizer

	evicted   atomic.Int64 // messages that left the window
	toolShown atomic.Int64 // recall blocks that showed a tool context
}
