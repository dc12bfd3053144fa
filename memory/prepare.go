package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/pool"
)

// Prepare: how a request becomes a turn. Its messages are related to the
// stored history (session.go: plan, matchRequest), what is new is written
// as one durable record, and the window is built within the engine's
// limit; the Turn it returns (turn.go) records the reply. In the order a
// request meets them.

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

// checkFixedPart counts, before anything else, the part of a request that
// every window must hold — its leading system messages and its newest user
// message with what follows — and fails with ErrContextTooLarge as soon as
// that part and the tools pass limit. Whatever the request's size, a
// request that cannot fit costs about limit tokens of counting (a 33 MB
// one-word message is refused in milliseconds). The part is a lower bound
// of what Prepare checks under the session's lock (stored system messages
// or history may add to it), so it refuses nothing Prepare would accept.
// Finished counts are kept on the messages.
func (t *Tokenizer) checkFixedPart(ctx context.Context, enc Encoding, limit int, msgs []Message, tools int) error {
	nsys := 0
	for nsys < len(msgs) && isSystem(msgs[nsys].Role) {
		nsys++
	}
	last := len(msgs)
	for i := len(msgs) - 1; i >= nsys; i-- {
		if msgs[i].Role == "user" {
			last = i
			break
		}
	}
	sys, turn := 0, 0
	for i := range msgs {
		if i >= nsys && i < last {
			continue
		}
		n, over, err := t.messageUpTo(ctx, enc, &msgs[i], limit-tools-sys-turn)
		if err != nil {
			return fmt.Errorf("memory: count tokens: %w", err)
		}
		if i < nsys {
			sys += n
		} else {
			turn += n
		}
		if over {
			return fmt.Errorf("%w: system %d + current turn %d + tools %d tokens > limit %d (counting stopped there)",
				ErrContextTooLarge, sys, turn, tools, limit)
		}
		msgs[i].pre = precounted{enc: enc, n: int32(min(n, 1<<31-1)), ok: true}
	}
	return nil
}

// reuseCosts gives the messages of a request that repeat the stored ones
// position by position (a full-history client's history) their stored
// counts, so precount only tokenizes what is new. Called with sess.mu held.
func (sess *session) reuseCosts(enc Encoding, msgs []Message) {
	same := func(e *entry, m *Message) bool {
		return e.tokens[enc] >= 0 && (bytes.Equal(e.msg.Raw, m.Raw) || e.key == m.matchKey())
	}
	i := 0
	for ; i < len(msgs) && i < len(sess.sys) && same(sess.sys[i], &msgs[i]); i++ {
		msgs[i].pre = precounted{enc: enc, n: sess.sys[i].tokens[enc], ok: true}
	}
	for j := 0; i < len(msgs) && j < len(sess.hist) && same(sess.hist[j], &msgs[i]); i, j = i+1, j+1 {
		msgs[i].pre = precounted{enc: enc, n: sess.hist[j].tokens[enc], ok: true}
	}
}

// precount counts the messages of msgs not yet counted under enc, before
// their session is locked, so that the locked part of Prepare and Complete
// only reads counts: tokenizing a large message never holds the session's
// lock, and it stops when ctx is done.
func (t *Tokenizer) precount(ctx context.Context, enc Encoding, msgs []Message) error {
	for i := range msgs {
		if p := msgs[i].pre; p.ok && p.enc == enc {
			continue
		}
		n, err := t.MessageTokensContext(ctx, enc, &msgs[i])
		if err != nil {
			return err
		}
		msgs[i].pre = precounted{enc: enc, n: int32(min(n, 1<<31-1)), ok: true}
	}
	return nil
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

func (s *Store) prepareLocked(ctx context.Context, sess *session, um *userMem, req *TurnRequest) (*Turn, error) {
	now := s.opts.Clock.Now()
	enc := s.Encoding(req.Model)
	limit := s.limitFor(req)
	tk := s.tok
	if sess.exists && req.UserID != "" && req.UserID != sess.user {
		s.stats.userMismatch.Add(1)
		return nil, fmt.Errorf("%w: session %q", ErrUserMismatch, req.SessionID)
	}
	p := sess.plan(req, now, tk, enc, limit)
	st := TurnStats{Model: req.Model, Encoding: enc.String(), Mode: p.mode.String(), ModeDetected: req.Mode == ModeAuto,
		Match: p.match, Limit: limit, ToolsTokens: req.ToolsTokens}
	if !p.fits {
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
		t := s.asSentLocked(sess, req, st, p.sysCost+p.turnCost+req.ToolsTokens, p.mode)
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
