package memory

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Turn is one request's view of its session: the window to send upstream,
// and the handle that records the reply. Every Turn must end with exactly
// one Complete, CompletePartial or Abort (later calls are no-ops), or the
// session's next request waits up to Options.PendingWait for it.
type Turn struct {
	// Messages is the window to send upstream, in order: the client's
	// system messages, the stable block (pinned memories and summaries, if
	// any), the history that fits, the recall block (if any), then the
	// current turn (the newest user message and what follows it). Each
	// message of the conversation is the stored raw JSON, byte for byte.
	// Read-only.
	Messages []json.RawMessage
	// Block is the recall block (a system message right before the newest
	// user message), nil when none. It is also in Messages.
	Block json.RawMessage
	// Stable is the stable block (right after the client's system
	// messages), nil when none. It is also in Messages.
	Stable json.RawMessage
	// Stats describe the window.
	Stats TurnStats

	store   *Store
	sess    *session
	lastSeq uint64 // seq of the last history message when prepared
	// The recall block made for this turn, kept in the transcript before
	// message blockSeq once the turn completes (nil: none new).
	block       json.RawMessage
	blockTokens int
	blockHashes []uint64
	blockSeq    uint64
	// What Fail takes back: the history messages this request appended,
	// and the system messages it replaced (when sysChanged).
	added      int
	sysChanged bool
	prevSys    []*entry
	pending    chan struct{}
	enc        Encoding
	done       atomic.Bool
}

// TurnStats describe one window, for logs and metrics.
type TurnStats struct {
	Model    string
	Encoding string
	// Mode is how the request was taken: "full" or "append".
	// ModeDetected is true when no header named it (ModeAuto).
	Mode         string
	ModeDetected bool
	// Match is how the request related to the stored history: "new",
	// "extend", "trimmed" (a full-history client dropped old turns itself),
	// "diverged" (edit, branch or regenerate: stored history was cut),
	// "append", or "retry" (an append repeating the stored turn whose
	// reply the upstream broke off: that partial reply is discarded).
	Match string
	// User is the user scope of the session ("" for the tenant's default).
	User string
	// Limit is the hard limit; TotalTokens = System + Stable + History +
	// Recall + Tools ≤ Limit (History includes the current turn).
	Limit, TotalTokens, SystemTokens, StableTokens, HistoryTokens, RecallTokens, ToolsTokens int
	// BlockTokens is StableTokens + RecallTokens.
	BlockTokens int
	// WindowMessages is len(Messages); StoredMessages the stored history.
	WindowMessages, StoredMessages int
	// Appended is how many messages this request added to the log.
	Appended int
	// Evicted is how many messages left the window in this request.
	Evicted int
	// Recalled memories in the recall block (CrossSession of them from
	// the user's other sessions), Summaries and Pooled (shared pool
	// entries, TurnRequest.PoolPrefix) in the stable block.
	Recalled, CrossSession, Summaries, Pooled int
	// Recall is how the recalled memories were chosen: "full" (a full
	// retrieval), "reuse" (the light probe found the same topic: the
	// previous set, still valid, plus the probe's hits) or "" (no recall:
	// no query or nothing to recall).
	Recall string
	// Prefix is what this window shares with the session's previous one.
	Prefix PrefixStats
	// AsSent is true when the client's own messages did not fit the
	// limit: Messages are the request's messages as sent, nothing added.
	AsSent bool
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

// Abort ends a turn without a reply; the request's messages stay in the
// history (a client that sends its history again finds them there).
func (t *Turn) Abort() { _ = t.finish(nil, false) }

// Fail ends a turn whose upstream answer was an error (4xx, 5xx, or broken
// before any content) or never came: a failed turn is not history, so the
// messages the request appended leave the session again (an "undo" record),
// and a client that retries the same message has it stored once. When the
// history moved on meanwhile (another request of the session appended after
// them, past PendingWait) they stay: nothing is reordered.
func (t *Turn) Fail() error { return t.finishFailed() }

func (t *Turn) finishFailed() error {
	if !t.done.CompareAndSwap(false, true) {
		return nil
	}
	sess := t.sess
	sess.mu.Lock()
	err := t.undoLocked()
	if sess.pending == t.pending {
		close(t.pending)
		sess.pending = nil
	}
	sess.mu.Unlock()
	return err
}

// undoLocked removes the turn's appended messages when they are still the
// history's tail, and brings back the system messages it replaced. Called
// with sess.mu held.
func (t *Turn) undoLocked() error {
	s, sess := t.store, t.sess
	n := len(sess.hist)
	if sess.gone.Load() || !sess.exists || t.added > n || t.added > 0 && sess.hist[n-1].seq != t.lastSeq {
		return nil // history moved on (or the session went): nothing is reordered
	}
	if t.added == 0 && !t.sysChanged {
		return nil
	}
	now := s.opts.Clock.Now()
	var recs []*record
	if t.sysChanged {
		r := &record{K: "sys", T: now.UnixNano(), Seq: sess.nextSeq, Msgs: []json.RawMessage{}}
		for _, e := range t.prevSys {
			r.Msgs = append(r.Msgs, e.msg.Raw)
		}
		recs = append(recs, r)
	}
	if t.added > 0 {
		keep := n - t.added
		recs = append(recs, &record{K: "undo", T: now.UnixNano(), Keep: &keep})
	}
	var framed []byte
	for _, r := range recs {
		var err error
		if framed, err = encodeRecord(framed, r); err != nil {
			return err
		}
	}
	if err := s.jrn.writeLocked(sess, framed, now); err != nil {
		return fmt.Errorf("memory: undo failed turn: %w", err)
	}
	if t.sysChanged {
		sys := make([]*entry, len(t.prevSys))
		for i, e := range t.prevSys {
			sys[i] = newEntry(sess.nextSeq, e.msg, e.at)
			sys[i].tokens = e.tokens
			sess.nextSeq++
		}
		sess.sys = sys
	}
	for _, r := range recs[len(recs)-min(1, t.added):] {
		if err := sess.apply(r, nil, s.tok); err != nil {
			return err
		}
	}
	sess.prevPrompt, sess.prevCosts = nil, nil
	s.stats.undone.Add(int64(t.added))
	return nil
}

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
	sess.turns++
	if sess.pending == t.pending {
		close(t.pending)
		sess.pending = nil
	}
	sess.mu.Unlock()
	s.wk.enqueue(sess)
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
		// The client already sent this reply back to us; the block stays
		// where it was sent all the same.
		framed, blk, err := t.blockRecord(nil, now)
		if err != nil || blk < 0 {
			return err
		}
		if err := s.jrn.writeLocked(sess, framed, now); err != nil {
			return fmt.Errorf("memory: record recall block: %w", err)
		}
		t.attachBlock(blk)
		return nil
	default:
		// History moved on: keep the reply as an archive unit, not in order
		// (unless a unit already holds it).
		sess.nextSeq++
		if sess.redundant(e) {
			return nil
		}
		u := unitFromEntry(e, s.tok, t.enc, 0, now)
		u.ID = orphanUnitID(e.seq)
		u.Tier = PlaceArchive
		sess.putUnit(u)
		s.stats.orphan.Add(1)
		return nil
	}
	framed, blk, err := t.blockRecord(nil, now)
	if err != nil {
		return err
	}
	framed, err = encodeRecord(framed, &record{K: "msg", T: now.UnixNano(), Seq: e.seq, Msg: e.msg.Raw,
		Enc: t.enc.String(), Tok: []int{e.cost(s.tok, t.enc)}, Partial: partial})
	if err != nil {
		return err
	}
	if err := s.jrn.writeLocked(sess, framed, now); err != nil {
		return fmt.Errorf("memory: record reply: %w", err)
	}
	t.attachBlock(blk)
	sess.hist = append(sess.hist, e)
	sess.nextSeq++
	sess.updated = now
	s.stats.appended.Add(1)
	s.stats.completes.Add(1)
	return nil
}

// blockRecord appends to dst the "blk" record that keeps the turn's recall
// block in the transcript, and returns the index in history of the message
// it goes before; -1 (dst unchanged) when the turn made none or that
// message is gone. Called with sess.mu held.
func (t *Turn) blockRecord(dst []byte, now time.Time) ([]byte, int, error) {
	if t.block == nil {
		return dst, -1, nil
	}
	i := t.sess.histIndex(t.blockSeq)
	if i < 0 {
		return dst, -1, nil
	}
	out, err := encodeRecord(dst, &record{K: "blk", T: now.UnixNano(), Seq: t.blockSeq, Msg: t.block,
		Enc: t.enc.String(), Tok: []int{t.blockTokens}, H: t.blockHashes})
	if err != nil {
		return dst, -1, err
	}
	return out, i, nil
}

// attachBlock keeps the turn's recall block before history message i
// (from blockRecord), as replaying its record does.
func (t *Turn) attachBlock(i int) {
	if i < 0 {
		return
	}
	var m Message
	if json.Unmarshal(t.block, &m) != nil {
		return
	}
	m.Raw = t.block
	b := newEntry(0, m, t.store.opts.Clock.Now())
	b.tokens[t.enc] = int32(t.blockTokens)
	t.sess.hist[i].block, t.sess.hist[i].blockHashes = b, t.blockHashes
}

// MaxReplyBytes is the most of one reply that Complete keeps
// (Options.Storage.MaxReplyBytes): callers that accumulate a streamed reply
// may stop accumulating beyond it.
func (s *Store) MaxReplyBytes() int { return s.opts.Storage.MaxReplyBytes }

// capReply returns m, or when its text and tool calls exceed
// MaxReplyBytes, an assistant message holding the first MaxReplyBytes of
// its text (or, without text, of its tool calls), and marks it partial.
// A reply's cost in memory, on disk and in tokenizing is thereby bounded
// whatever the upstream sends.
func (e *env) capReply(m *Message, partial *bool) *Message {
	maxBytes := e.opts.Storage.MaxReplyBytes
	if len(m.Content)+len(m.toolText)+len(m.Name) <= maxBytes && len(m.Raw) <= 2*maxBytes+4096 {
		return m
	}
	text := m.Content
	if text == "" {
		text = m.toolText
	}
	role := m.Role
	if role == "" {
		role = "assistant"
	}
	c := NewMessage(role, CutText(text, maxBytes))
	*partial = true
	e.stats.repliesCut.Add(1)
	return &c
}

// CutText returns the longest prefix of s of at most n bytes that does not
// split a UTF-8 sequence.
func CutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
