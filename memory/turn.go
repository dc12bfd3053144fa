package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/pool"
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

// TurnRequest is one chat request as Prepare sees it.
type TurnRequest struct {
	// Tenant scopes everything (sessions, users, pools). SessionID names
	// the conversation and must not be empty.
	Tenant, SessionID string
	// UserID is the end user within the tenant: sessions of one user
	// recall each other's turns, facts and episodes. Empty: no end user
	// named; the session recalls only its own memory (unless
	// Recall.TenantUserScope makes the tenant one user). A session keeps
	// the user it was created with; a request naming another one fails
	// with ErrUserMismatch.
	UserID string
	// Mode is how the client sends its conversation; ModeAuto detects it.
	Mode Mode
	// Model is the request's model: window limit, encoding, and the model
	// of the sidecar's own calls for this session.
	Model string
	// Messages are the request's messages; they are retained by the store.
	Messages []Message
	// ToolsTokens is the token cost of the request's tools/functions (see
	// CountTokensContext), charged against the limit.
	ToolsTokens int
	// Limit is what the engine behind the proxy can take for this request,
	// counted in the store's tokens (its context less what the reply
	// needs); zero when unknown. The window's limit is the smaller of it
	// and Store.Limit(Model), which stays a ceiling.
	Limit int
	// PoolPrefix, when set, opts the request in to the tenant's shared
	// pool: the entries whose key starts with it (PoolPrefixAll: every
	// entry) are shown in the stable block as "[SHARED:key] value" lines,
	// newest first, within Pool.ContextTokens (see ValidPoolPrefix). The
	// pool is the tenant's, shared by every session of it: nothing of it
	// reaches a window without this opt-in. Empty: no pool.
	PoolPrefix string

	// asSent is set when the client's own messages do not fit the limit:
	// the window is then the request as sent (see Prepare).
	asSent bool
	// pool is the view of PoolPrefix, read before the session is locked.
	pool *pool.View
}

// limitFor is the window limit of req: Store.Limit(req.Model), lowered to
// req.Limit when that is known and smaller.
func (s *Store) limitFor(req *TurnRequest) int {
	l := s.Limit(req.Model)
	if req.Limit > 0 && req.Limit < l {
		l = req.Limit
	}
	return l
}

// Prepare records a request's new messages and builds its window.
//
// It relates req.Messages to the stored history (see Mode), appends what is
// new to the session's log as one durable write (the only write on the
// request path), and returns the window for the model's limit with the
// tools' cost charged against it.
//
// When the client's system messages, its newest user message (with what
// follows it) and the tools do not fit the limit (see TurnRequest.Limit)
// even with nothing else, the request is recorded as usual but its window
// is the client's messages exactly as sent (Stats.AsSent): memory is only
// ever added within the engine's context, and a request the engine would
// take from the client directly still reaches it.
//
// Errors: ErrInvalid, ErrUserMismatch (nothing was written), ErrClosed, or
// I/O errors (nothing was acknowledged).
func (s *Store) Prepare(ctx context.Context, req TurnRequest) (*Turn, error) {
	if req.SessionID == "" {
		return nil, fmt.Errorf("%w: empty session id", ErrInvalid)
	}
	if req.ToolsTokens < 0 {
		return nil, fmt.Errorf("%w: negative tools tokens", ErrInvalid)
	}
	if req.Mode > ModeAppend {
		return nil, fmt.Errorf("%w: unknown mode %d", ErrInvalid, req.Mode)
	}
	if req.Mode != ModeAppend && len(req.Messages) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrInvalid)
	}
	if req.PoolPrefix != "" {
		if err := ValidPoolPrefix(req.PoolPrefix); err != nil {
			return nil, err
		}
	}
	msgs := append([]Message(nil), req.Messages...)
	for i := range msgs {
		if msgs[i].Role == "" {
			return nil, fmt.Errorf("%w: message %d has no role", ErrInvalid, i)
		}
		if len(msgs[i].Raw) == 0 {
			raw, _ := msgs[i].MarshalJSON()
			msgs[i].Raw = raw
		}
	}
	req.Messages = msgs
	ctx, stop := s.withStore(ctx) // counting stops when the store closes too
	defer stop()
	if req.PoolPrefix != "" && s.opts.Pool.ContextTokens > 0 {
		// The pool is read (and, in a fleet, brought up to date) before
		// the session is locked. A pool that fails leaves it out: the
		// turn goes on without it.
		pv, err := s.poolView(req.Tenant, req.PoolPrefix)
		if err != nil {
			s.stats.poolCtxErrors.Add(1)
			s.opts.Logger.Warn("memory: shared pool for the context", "session", req.SessionID, "err", err)
		}
		req.pool = pv
	}
	enc := s.Encoding(req.Model)
	if err := s.tok.checkFixedPart(ctx, enc, s.limitFor(&req), msgs, req.ToolsTokens); errors.Is(err, ErrContextTooLarge) {
		req.asSent = true
	} else if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		sess, err := s.reg.session(req.Tenant, req.SessionID, true)
		if err != nil {
			return nil, err
		}
		defer s.reg.unpin(sess) // at most one per attempt
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
		// The user's cross-session index loads (and may load other
		// sessions of the user) before this session is locked.
		um := s.users.userFor(sess, req.UserID)
		sess.mu.Lock()
		if sess.gone.Load() {
			// Deleted or dropped from memory meanwhile: look it up again.
			sess.mu.Unlock()
			if attempt < 3 {
				continue
			}
			return nil, fmt.Errorf("memory: session %q keeps vanishing: %w", req.SessionID, ErrNotFound)
		}
		if s.opts.SharedLog != nil {
			// What other replicas of a fleet wrote comes first.
			sctx, cancel := context.WithTimeout(ctx, s.opts.SharedLogTimeout)
			err := s.jrn.syncLocked(sctx, sess)
			cancel()
			if err != nil {
				sess.mu.Unlock()
				return nil, err
			}
		}
		t, err := s.prepareLocked(ctx, sess, um, &req)
		sess.mu.Unlock()
		return t, err
	}
}

// plan is what a request adds to its session, worked out before anything
// is written.
type plan struct {
	mode       Mode
	match      string
	sysChanged bool
	sys        []*entry // the session's system messages after the request
	keep       int      // stored history messages kept (the rest is cut)
	add        []*entry // new history messages
	// dropPartial: the request retries the stored turn whose reply the
	// upstream broke off (a partial reply): that reply is discarded and
	// the stored messages are the turn (see retryOfPartial).
	dropPartial bool
}

// retryOfPartial reports whether tail, the new messages of an append,
// repeats the turn that ends hist with a partial reply: a client whose
// stream broke retries the same message, which is then stored once.
func retryOfPartial(hist []*entry, tail []Message) bool {
	n := len(hist)
	if len(tail) == 0 || n < len(tail)+1 || tail[len(tail)-1].Role != "user" {
		return false
	}
	if last := hist[n-1]; last.msg.Role != "assistant" || !last.partial {
		return false
	}
	for i := range tail {
		if hist[n-1-len(tail)+i].key != tail[i].matchKey() {
			return false
		}
	}
	return true
}

// plan relates the request to the stored history. Called with sess.mu
// held.
func (sess *session) plan(req *TurnRequest, now time.Time) plan {
	msgs := req.Messages
	nsys := 0
	for nsys < len(msgs) && isSystem(msgs[nsys].Role) {
		nsys++
	}
	reqSys, rest := msgs[:nsys], msgs[nsys:]
	var p plan
	var tail []Message
	p.mode, p.keep, tail, p.match = matchRequest(sess, rest, req.Mode)
	if p.mode == ModeAppend && retryOfPartial(sess.hist[:p.keep], tail) {
		p.dropPartial, p.keep, tail, p.match = true, p.keep-1, nil, "retry"
	}
	p.sysChanged = !sameMessages(reqSys, sess.sys)
	if p.mode == ModeAppend && nsys == 0 {
		p.sysChanged = false // an append without system messages keeps the stored ones
	}
	seq := sess.nextSeq
	p.sys = sess.sys
	if p.sysChanged {
		p.sys = make([]*entry, 0, len(reqSys))
		for _, m := range reqSys {
			p.sys = append(p.sys, newEntry(seq, m, now))
			seq++
		}
	}
	p.add = make([]*entry, 0, len(tail))
	for _, m := range tail {
		p.add = append(p.add, newEntry(seq, m, now))
		seq++
	}
	return p
}

// currentTurn returns where the current turn starts in hist+add (the newest
// user message; everything after it belongs to the turn too) and its cost.
func currentTurn(hist, add []*entry, tk *Tokenizer, enc Encoding) (start, cost int) {
	n := len(hist) + len(add)
	at := func(i int) *entry {
		if i < len(hist) {
			return hist[i]
		}
		return add[i-len(hist)]
	}
	start = n
	for i := n - 1; i >= 0; i-- {
		cost += at(i).cost(tk, enc)
		if at(i).msg.Role == "user" {
			return i, cost
		}
	}
	return n, 0 // no user message: nothing is mandatory
}

// checkFits is the one context-limit check (MEM-001): the client's system
// messages, the current turn and the tools must fit the limit with nothing
// else. It runs before anything is written.
func checkFits(sysCost, turnCost, tools, limit int) error {
	if sysCost+turnCost+tools > limit {
		return fmt.Errorf("%w: system %d + current turn %d + tools %d tokens > limit %d",
			ErrContextTooLarge, sysCost, turnCost, tools, limit)
	}
	return nil
}

func (s *Store) prepareLocked(ctx context.Context, sess *session, um *userMem, req *TurnRequest) (*Turn, error) {
	now := s.opts.Clock.Now()
	enc := s.Encoding(req.Model)
	limit := s.limitFor(req)
	tk := s.tok
	if sess.exists && req.UserID != "" && req.UserID != sess.user {
		s.stats.userMismatch.Add(1)
		return nil, fmt.Errorf("%w: session %q", ErrUserMismatch, req.SessionID)
	}
	p := sess.plan(req, now)
	st := TurnStats{Model: req.Model, Encoding: enc.String(), Mode: p.mode.String(), ModeDetected: req.Mode == ModeAuto,
		Match: p.match, Limit: limit, ToolsTokens: req.ToolsTokens}

	sysCost := 0
	for _, e := range p.sys {
		sysCost += e.cost(tk, enc)
	}
	_, turnCost := currentTurn(sess.hist[:p.keep], p.add, tk, enc)
	if !req.asSent && checkFits(sysCost, turnCost, req.ToolsTokens, limit) != nil {
		req.asSent = true
	}

	// One write for everything new.
	var recs []*record
	if p.sysChanged {
		r := &record{K: "sys", T: now.UnixNano(), Seq: sess.nextSeq, Enc: enc.String(), Msgs: []json.RawMessage{}}
		for _, e := range p.sys {
			r.Msgs = append(r.Msgs, e.msg.Raw)
			r.Tok = append(r.Tok, e.cost(tk, enc))
		}
		recs = append(recs, r)
	}
	if p.keep < len(sess.hist) {
		k := p.keep
		kind := "trunc"
		if p.dropPartial {
			kind = "undo"
		}
		recs = append(recs, &record{K: kind, T: now.UnixNano(), Keep: &k})
	}
	for _, e := range p.add {
		recs = append(recs, &record{K: "msg", T: now.UnixNano(), Seq: e.seq, Msg: e.msg.Raw, Enc: enc.String(), Tok: []int{e.cost(tk, enc)}})
	}
	var framed []byte
	for _, r := range recs {
		var err error
		if framed, err = encodeRecord(framed, r); err != nil {
			return nil, err
		}
	}
	if len(framed) > 0 {
		if !sess.exists {
			sess.user = um.user // the meta record names the session's user
		}
		if err := s.jrn.writeLocked(sess, framed, now); err != nil {
			return nil, err
		}
		s.stats.appendBytes.Add(int64(len(framed)))
		s.stats.appended.Add(int64(len(p.add)))
		if p.sysChanged {
			s.stats.appended.Add(int64(len(p.sys)))
		}
	}
	// Apply: the same transitions replay performs.
	prevSys := sess.sys
	if p.sysChanged {
		sess.sys = p.sys
	}
	if p.keep < len(sess.hist) {
		k := p.keep
		kind := "trunc"
		if p.dropPartial {
			kind = "undo"
		}
		if err := sess.apply(&record{K: kind, T: now.UnixNano(), Keep: &k}, nil, tk); err != nil {
			return nil, err
		}
	}
	sess.hist = append(sess.hist, p.add...)
	sess.nextSeq += uint64(len(p.add))
	if p.sysChanged {
		sess.nextSeq += uint64(len(p.sys))
	}
	sess.updated = now
	sess.lastModel, sess.lastEnc = req.Model, enc
	st.Appended = len(p.add)
	if p.sysChanged {
		st.Appended += len(p.sys)
	}
	st.User = sess.user

	if req.asSent {
		t := s.asSentLocked(sess, req, st, sysCost+turnCost+req.ToolsTokens, p.mode)
		t.added, t.sysChanged, t.prevSys = len(p.add), p.sysChanged, prevSys
		return t, nil
	}
	s.know.maybeDecayLocked(sess, now)
	toolCtx := s.know.toolTurnLocked(sess, p.add)
	recall := func(q recallQuery, skip map[string]bool) ([]recallItem, string) {
		return s.recall.recallLocked(ctx, sess, um, q, now, skip)
	}
	shifts := s.opts.Window.EngineShifts != nil && s.opts.Window.EngineShifts(req.Model)
	w, err := s.win.build(sess, windowParams{enc: enc, limit: limit, tools: req.ToolsTokens, strategy: s.opts.Window.Strategy,
		shifts: shifts, now: now, toolCtx: toolCtx, pool: req.pool, recall: recall})
	if err != nil {
		return nil, err
	}
	st.SystemTokens, st.StableTokens, st.HistoryTokens, st.RecallTokens = w.sysTokens, w.stableTokens, w.histTokens, w.recallTokens
	st.BlockTokens = w.stableTokens + w.recallTokens
	st.TotalTokens = w.sysTokens + st.BlockTokens + w.histTokens + req.ToolsTokens
	st.WindowMessages, st.StoredMessages = len(w.msgs), len(sess.hist)
	st.Evicted, st.Recalled, st.CrossSession, st.Summaries, st.Pooled = w.evicted, w.recalled, w.crossSession, w.summaries, w.pooled
	if w.pooled > 0 {
		s.stats.poolCtxTurns.Add(1)
	}
	st.Recall = w.recallMode
	st.Prefix = prefixStats(sess.prevPrompt, w.msgs, w.costs)
	sess.prevPrompt, sess.prevCosts = w.msgs, w.costs

	if sess.pending != nil {
		// The previous turn outlived PendingWait; stop others waiting on it.
		close(sess.pending)
	}
	sess.pending = make(chan struct{})
	t := &Turn{Messages: w.msgs, Block: w.recall, Stable: w.stable, Stats: st, store: s, sess: sess, pending: sess.pending, enc: enc,
		added: len(p.add), sysChanged: p.sysChanged, prevSys: prevSys,
		block: w.recall, blockTokens: w.recallTokens, blockHashes: w.recallHashes, blockSeq: w.recallSeq}
	if w.recallSeq == 0 {
		t.block = nil // none, or kept from before
	}
	if n := len(sess.hist); n > 0 {
		t.lastSeq = sess.hist[n-1].seq
	}
	s.stats.prepares.Add(1)
	s.stats.countMode(p.mode, req.Mode == ModeAuto)
	return t, nil
}

// asSentLocked finishes a turn whose client messages alone do not fit the
// limit: the window is the request's messages as sent, and fixed their
// counted cost (the client's system messages, current turn and tools).
func (s *Store) asSentLocked(sess *session, req *TurnRequest, st TurnStats, fixed int, mode Mode) *Turn {
	st.AsSent = true
	st.TotalTokens = fixed
	st.WindowMessages, st.StoredMessages = len(req.Messages), len(sess.hist)
	msgs := make([]json.RawMessage, len(req.Messages))
	for i := range req.Messages {
		msgs[i] = req.Messages[i].Raw
	}
	sess.prevPrompt, sess.prevCosts = nil, nil
	if sess.pending != nil {
		close(sess.pending)
	}
	sess.pending = make(chan struct{})
	t := &Turn{Messages: msgs, Stats: st, store: s, sess: sess, pending: sess.pending, enc: s.Encoding(req.Model)}
	if n := len(sess.hist); n > 0 {
		t.lastSeq = sess.hist[n-1].seq
	}
	s.stats.prepares.Add(1)
	s.stats.asSent.Add(1)
	s.stats.countMode(mode, req.Mode == ModeAuto)
	return t
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

// waitPending waits (bounded by PendingWait and ctx) for the session's open
// turn to finish, so that its reply is recorded before the next request's
// messages in append mode.
func (s *Store) waitPending(ctx context.Context, sess *session) error {
	if s.opts.PendingWait < 0 {
		return nil
	}
	sess.mu.Lock()
	ch := sess.pending
	sess.mu.Unlock()
	if ch == nil {
		return nil
	}
	t := time.NewTimer(s.opts.PendingWait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return fmt.Errorf("memory: wait for previous turn: %w", ctx.Err())
	}
	return nil
}
