package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
)

// Turn is one request's view of its session: the window to send upstream,
// and the handle that records the reply. Every Turn must end with exactly
// one Complete, CompletePartial or Abort (later calls are no-ops), or the
// session's next request waits up to Options.PendingWait for it.
type Turn struct {
	// Messages is the window to send upstream, in order: the client's
	// system messages, the injected block (if any), then history. Each is
	// the stored raw JSON, byte for byte. Read-only.
	Messages []json.RawMessage
	// Block is the injected memory message, nil when none. It is also in
	// Messages.
	Block json.RawMessage
	// Stats describe the window.
	Stats TurnStats

	store   *Store
	sess    *session
	lastSeq uint64 // seq of the last history message when prepared
	pending chan struct{}
	enc     Encoding
	done    atomic.Bool
}

// TurnStats describe one window, for logs and metrics.
type TurnStats struct {
	Model    string
	Encoding string
	Mode     string
	// Match is how the request related to the stored history: "new",
	// "extend", "trimmed" (a full-history client dropped old turns itself),
	// "diverged" (edit, branch or regenerate: stored history was cut) or
	// "append".
	Match string
	// Limit is the hard limit; TotalTokens = System + Block + History +
	// Tools ≤ Limit.
	Limit, TotalTokens, SystemTokens, BlockTokens, HistoryTokens, ToolsTokens int
	// WindowMessages is len(Messages); StoredMessages the stored history.
	WindowMessages, StoredMessages int
	// Appended is how many messages this request added to the log.
	Appended int
	// Evicted is how many messages left the window in this request.
	Evicted int
	// Recalled memories and Summaries in the block.
	Recalled, Summaries int
	// Recall is how the recalled memories were chosen: "full" (a full
	// recall refreshed them), "reuse" (the light probe found the same
	// topic and the previous set was kept) or "" (no recall: no query or
	// no memories).
	Recall string
	// Prefix is what this window shares with the session's previous one.
	Prefix PrefixStats
}

// Prepare records a request's new messages and builds its window.
//
// It matches msgs against the stored history (ModeFull) or appends them
// (ModeAppend), appends what is new to the session's log as one durable
// write (the only write on the request path), and returns the window for
// model's limit with toolsTokens (the token cost of the request's
// tools/functions, see CountTokens) charged against it. tenant scopes the
// session; sessionID must not be empty. msgs are retained by the store.
//
// Errors: ErrInvalid, ErrContextTooLarge (nothing was written), ErrClosed,
// or I/O errors (nothing was acknowledged).
func (s *Store) Prepare(ctx context.Context, tenant, sessionID string, mode Mode, model string, msgs []Message, toolsTokens int) (*Turn, error) {
	if sessionID == "" {
		return nil, fmt.Errorf("%w: empty session id", ErrInvalid)
	}
	if toolsTokens < 0 {
		return nil, fmt.Errorf("%w: negative tools tokens", ErrInvalid)
	}
	if mode == ModeFull && len(msgs) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrInvalid)
	}
	msgs = append([]Message(nil), msgs...)
	for i := range msgs {
		if msgs[i].Role == "" {
			return nil, fmt.Errorf("%w: message %d has no role", ErrInvalid, i)
		}
		if len(msgs[i].Raw) == 0 {
			raw, _ := msgs[i].MarshalJSON()
			msgs[i].Raw = raw
		}
	}
	ctx, stop := s.withStore(ctx) // counting stops when the store closes too
	defer stop()
	enc := s.Encoding(model)
	if err := s.checkFixedPart(ctx, enc, s.Limit(model), msgs, toolsTokens); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		sess, err := s.session(tenant, sessionID, true)
		if err != nil {
			return nil, err
		}
		if err := s.waitPending(ctx, sess); err != nil {
			return nil, err
		}
		// Count what the session does not hold yet before locking it.
		sess.mu.Lock()
		sess.reuseCosts(enc, msgs)
		sess.mu.Unlock()
		if err := s.tok.precount(ctx, enc, msgs); err != nil {
			return nil, fmt.Errorf("memory: count tokens: %w", err)
		}
		sess.mu.Lock()
		if sess.gone.Load() {
			// Deleted or dropped from memory meanwhile: look it up again.
			sess.mu.Unlock()
			if attempt < 3 {
				continue
			}
			return nil, fmt.Errorf("memory: session %q keeps vanishing: %w", sessionID, ErrNotFound)
		}
		t, err := s.prepareLocked(ctx, sess, mode, model, msgs, toolsTokens)
		sess.mu.Unlock()
		return t, err
	}
}

func (s *Store) prepareLocked(ctx context.Context, sess *session, mode Mode, model string, msgs []Message, toolsTokens int) (*Turn, error) {
	now := s.opts.Clock.Now()
	enc := s.Encoding(model)
	limit := s.Limit(model)
	tk := s.tok
	st := TurnStats{Model: model, Encoding: enc.String(), Mode: mode.String(), Limit: limit, ToolsTokens: toolsTokens}

	nsys := 0
	for nsys < len(msgs) && isSystem(msgs[nsys].Role) {
		nsys++
	}
	reqSys, rest := msgs[:nsys], msgs[nsys:]
	sysChanged := !sameMessages(reqSys, sess.sys)
	if mode == ModeAppend && nsys == 0 {
		sysChanged = false
	}
	keep, tail := len(sess.hist), rest
	switch {
	case mode == ModeAppend:
		st.Match = "append"
	case len(sess.hist) == 0 && len(sess.sys) == 0:
		st.Match = "new"
	default:
		keep, tail, st.Match = matchHistory(sess.hist, rest)
	}

	// Prospective state, to check the current turn fits before writing.
	seq := sess.nextSeq
	var sysEntries []*entry
	if sysChanged {
		for _, m := range reqSys {
			sysEntries = append(sysEntries, newEntry(seq, m, now))
			seq++
		}
	}
	newEntries := make([]*entry, 0, len(tail))
	for _, m := range tail {
		newEntries = append(newEntries, newEntry(seq, m, now))
		seq++
	}
	{
		sysCost := 0
		sys := sess.sys
		if sysChanged {
			sys = sysEntries
		}
		for _, e := range sys {
			sysCost += e.cost(tk, enc)
		}
		mand := 0
		seen := false
		for i := len(newEntries) - 1; i >= 0 && !seen; i-- {
			mand += newEntries[i].cost(tk, enc)
			seen = newEntries[i].msg.Role == "user"
		}
		for i := keep - 1; i >= 0 && !seen; i-- {
			mand += sess.hist[i].cost(tk, enc)
			seen = sess.hist[i].msg.Role == "user"
		}
		if sysCost+mand+toolsTokens > limit {
			return nil, fmt.Errorf("%w: system %d + current turn %d + tools %d tokens > limit %d",
				ErrContextTooLarge, sysCost, mand, toolsTokens, limit)
		}
	}

	// One write for everything new.
	var framed []byte
	var err error
	var recs []*record
	if sysChanged {
		r := &record{K: "sys", T: now.UnixNano(), Seq: sess.nextSeq, Enc: enc.String()}
		if len(sysEntries) == 0 {
			r.Msgs = []json.RawMessage{}
		}
		for _, e := range sysEntries {
			r.Msgs = append(r.Msgs, e.msg.Raw)
			r.Tok = append(r.Tok, e.cost(tk, enc))
		}
		recs = append(recs, r)
	}
	if keep < len(sess.hist) {
		k := keep
		recs = append(recs, &record{K: "trunc", T: now.UnixNano(), Keep: &k})
	}
	for _, e := range newEntries {
		recs = append(recs, &record{K: "msg", T: now.UnixNano(), Seq: e.seq, Msg: e.msg.Raw, Enc: enc.String(), Tok: []int{e.cost(tk, enc)}})
	}
	for _, r := range recs {
		if framed, err = encodeRecord(framed, r); err != nil {
			return nil, err
		}
	}
	if len(framed) > 0 {
		if err := s.writeLocked(sess, framed, now); err != nil {
			return nil, err
		}
		s.stats.appendBytes.Add(int64(len(framed)))
		s.stats.appended.Add(int64(len(newEntries) + len(sysEntries)))
	}
	// Apply: the same transitions replay performs.
	if sysChanged {
		sess.sys = sysEntries
	}
	if keep < len(sess.hist) {
		k := keep
		if err := sess.apply(&record{K: "trunc", T: now.UnixNano(), Keep: &k}, nil, tk); err != nil {
			return nil, err
		}
	}
	sess.hist = append(sess.hist, newEntries...)
	sess.nextSeq = seq
	sess.updated = now
	sess.lastModel, sess.lastEnc = model, enc
	st.Appended = len(newEntries) + len(sysEntries)

	s.maybeDecayLocked(sess, now)
	sess.lastRecall = ""
	w, err := s.buildWindow(ctx, sess, windowParams{enc: enc, limit: limit, tools: toolsTokens, strategy: s.opts.Strategy, now: now})
	if err != nil {
		return nil, err
	}
	st.SystemTokens, st.BlockTokens, st.HistoryTokens = w.sysTokens, w.blockTokens, w.histTokens
	st.TotalTokens = w.sysTokens + w.blockTokens + w.histTokens + toolsTokens
	st.WindowMessages, st.StoredMessages = len(w.msgs), len(sess.hist)
	st.Evicted, st.Recalled, st.Summaries = w.evicted, w.recalled, w.summaries
	st.Recall = sess.lastRecall
	st.Prefix = prefixStats(sess.prevPrompt, w.msgs, w.costs)
	sess.prevPrompt, sess.prevCosts = w.msgs, w.costs

	if sess.pending != nil {
		// The previous turn outlived PendingWait; stop others waiting on it.
		close(sess.pending)
	}
	sess.pending = make(chan struct{})
	t := &Turn{Messages: w.msgs, Block: w.block, Stats: st, store: s, sess: sess, pending: sess.pending, enc: enc}
	if n := len(sess.hist); n > 0 {
		t.lastSeq = sess.hist[n-1].seq
	}
	s.stats.prepares.Add(1)
	return t, nil
}

func sameMessages(msgs []Message, es []*entry) bool {
	if len(msgs) != len(es) {
		return false
	}
	for i := range msgs {
		if msgs[i].matchKey() != es[i].key {
			return false
		}
	}
	return true
}

// matchHistory relates a full-history request (system messages removed) to
// the stored history. It returns how many stored messages to keep, the
// request's messages to append, and the kind of match.
func matchHistory(hist []*entry, req []Message) (keep int, tail []Message, kind string) {
	// Equal raw bytes imply equal keys; hash only what differs (typically
	// assistant messages the client re-serialized).
	same := func(e *entry, m *Message) bool {
		return bytes.Equal(e.msg.Raw, m.Raw) || e.key == m.matchKey()
	}
	k := 0
	for k < len(hist) && k < len(req) && same(hist[k], &req[k]) {
		k++
	}
	if k == len(hist) {
		return k, req[k:], "extend"
	}
	// The client trimmed its oldest turns: req starts inside hist and
	// covers all of hist's end.
	if len(req) > 0 {
		k0 := req[0].matchKey()
		for p := 1; p < len(hist); p++ {
			n := len(hist) - p
			if hist[p].key != k0 || n > len(req) {
				continue
			}
			ok := true
			for j := 1; j < n && ok; j++ {
				ok = same(hist[p+j], &req[j])
			}
			if ok {
				return len(hist), req[n:], "trimmed"
			}
		}
	}
	return k, req[k:], "diverged"
}

// Complete records the assistant's reply after the response was sent
// (streamed or not) and queues the background writes (units, summaries).
// Build a streamed reply with NewMessage("assistant", text). If the history
// moved on meanwhile (a full-history client already sent this reply back),
// the reply is not appended twice.
func (t *Turn) Complete(assistant Message) error { return t.finish(&assistant, false) }

// CompletePartial is Complete for a reply cut short (client disconnected,
// upstream broke mid-stream): what was produced is recorded and marked
// partial.
func (t *Turn) CompletePartial(assistant Message) error { return t.finish(&assistant, true) }

// Abort ends a turn that produced nothing (upstream error before any
// output). The request's messages stay in the history.
func (t *Turn) Abort() { _ = t.finish(nil, false) }

func (t *Turn) finish(m *Message, partial bool) error {
	if !t.done.CompareAndSwap(false, true) {
		return nil
	}
	s, sess := t.store, t.sess
	if m != nil {
		m = s.capReply(m, &partial)
		// Counted before locking; when the store is closing the count is
		// left for later (the reply is still recorded).
		one := []Message{*m}
		if s.tok.precount(s.ctx, t.enc, one) == nil {
			m = &one[0]
		}
	}
	sess.mu.Lock()
	err := t.recordLocked(m, partial)
	if sess.pending == t.pending {
		close(t.pending)
		sess.pending = nil
	}
	sess.mu.Unlock()
	s.enqueue(sess)
	return err
}

func (t *Turn) recordLocked(m *Message, partial bool) error {
	s, sess := t.store, t.sess
	if sess.gone.Load() && !sess.exists {
		return fmt.Errorf("memory: complete turn: %w", ErrNotFound)
	}
	if m == nil {
		return nil
	}
	if m.Role == "" {
		m.Role = "assistant"
	}
	if len(m.Raw) == 0 {
		raw, _ := m.MarshalJSON()
		m.Raw = raw
	}
	if m.Content == "" && m.toolText == "" && m.nonText == 0 {
		return nil // nothing was produced
	}
	now := s.opts.Clock.Now()
	e := newEntry(sess.nextSeq, *m, now)
	e.partial = partial
	// Where the reply belongs: right after the last message of the request.
	pos := 0
	if t.lastSeq != 0 {
		pos = sess.histIndex(t.lastSeq) + 1
		if pos == 0 {
			pos = -1 // that message was cut by a later divergent request
		}
	}
	switch {
	case pos == len(sess.hist):
	case pos >= 0 && pos < len(sess.hist) && sess.hist[pos].key == e.key:
		return nil // the client already sent this reply back to us
	default:
		// History moved on: keep the reply as an archive unit, not in order
		// (unless a unit already holds it).
		sess.nextSeq++
		if sess.redundant(e) {
			return nil
		}
		u := unitFromEntry(e, s.tok, t.enc, 0, now)
		u.ID = orphanUnitID(e.seq)
		u.Tier = TierArchive
		sess.putUnit(u)
		s.stats.orphan.Add(1)
		return nil
	}
	framed, err := encodeRecord(nil, &record{K: "msg", T: now.UnixNano(), Seq: e.seq, Msg: e.msg.Raw,
		Enc: t.enc.String(), Tok: []int{e.cost(s.tok, t.enc)}, Partial: partial})
	if err != nil {
		return err
	}
	if err := s.writeLocked(sess, framed, now); err != nil {
		return fmt.Errorf("memory: record reply: %w", err)
	}
	sess.hist = append(sess.hist, e)
	sess.nextSeq++
	sess.updated = now
	s.stats.appended.Add(1)
	s.stats.completes.Add(1)
	return nil
}

// PrefixStats is how much of a window equals the previous window of the
// same session, from the start.
type PrefixStats struct {
	// Messages are whole messages shared.
	Messages int
	// Bytes is the common byte prefix of the two windows serialized as
	// JSON arrays (AppendMessagesJSON).
	Bytes int
	// Tokens is the cost of the whole shared messages.
	Tokens int
}

// CommonPrefix compares two windows (Turn.Messages of consecutive turns).
// Tokens is left 0; Turn.Stats.Prefix has it.
func CommonPrefix(prev, cur []json.RawMessage) PrefixStats {
	return prefixStats(prev, cur, nil)
}

func prefixStats(prev, cur []json.RawMessage, costs []int) PrefixStats {
	var p PrefixStats
	if len(prev) == 0 || len(cur) == 0 {
		return p
	}
	p.Bytes = 1 // '['
	i := 0
	for ; i < len(prev) && i < len(cur); i++ {
		if i > 0 {
			p.Bytes++ // ','
		}
		a, b := prev[i], cur[i]
		n := commonBytes(a, b)
		p.Bytes += n
		if n < len(a) || n < len(b) {
			return p
		}
		p.Messages++
		if i < len(costs) {
			p.Tokens += costs[i]
		}
	}
	if len(prev) == len(cur) {
		p.Bytes++ // ']'
	}
	return p
}

func commonBytes(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
