package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

// The memory and record steps of the forward path (forward.go): a chat
// request of a session becomes a memory.Turn whose window replaces its
// messages (prepareTurn), and the answer's reply enters the session
// (recordTurn; a streamed reply is kept by stream.go, an answer read whole
// gives it by replyMessage), or the turn fails (failTurn).

// memory is the memory step: a session's chat request becomes a turn
// (prepareTurn: the client's new messages recorded, the window built) and
// the body to forward carries the window. It returns false when it
// answered the request; memory failing otherwise forwards the client's
// body unchanged.
func (f *flow) memory(ctx *fasthttp.RequestCtx) bool {
	f.body = f.in
	if f.s.opts.Memory == nil || f.sess.ID == "" || f.route != routeChat || !ctx.IsPost() {
		return true
	}
	turn, body, handled := f.s.prepareTurn(ctx, f.sess, f.info, f.in, f.log)
	if handled {
		return false
	}
	f.turn, f.body = turn, body
	return true
}

// prepareTurn records the request's new messages in the session and returns
// the body to forward, with "messages" replaced by the window. A nil turn
// means the request goes through unchanged; handled reports that an error
// answer was written.
func (s *Server) prepareTurn(ctx *fasthttp.RequestCtx, sess sessionRef, info requestInfo, body []byte, log []any) (turn *memory.Turn, out []byte, handled bool) {
	st := s.opts.Memory
	// Who the request is for and the pool it opts into, then its messages.
	user, err := userOf(ctx, info)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_user", err.Error())
		return nil, nil, true
	}
	// X-Pool-Prefix opts the request in to the tenant's shared pool in its
	// stable block ("*": the whole pool).
	pool := string(ctx.Request.Header.Peek("X-Pool-Prefix"))
	if pool != "" {
		if perr := memory.ValidPoolPrefix(pool); perr != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_pool_prefix", "X-Pool-Prefix: "+strings.TrimPrefix(perr.Error(), "memory: "))
			return nil, nil, true
		}
	}
	msgs, err := memory.ParseMessages(info.Messages)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_messages", strings.TrimPrefix(err.Error(), "memory: "))
		return nil, nil, true
	}
	tools := 0
	if len(info.Tools) > 0 {
		tools, err = st.CountTokensContext(s.stopping, info.Model, string(info.Tools))
	}
	if err == nil {
		start := time.Now()
		turn, err = st.Prepare(s.stopping, memory.TurnRequest{Tenant: sess.Tenant, SessionID: sess.ID, UserID: user,
			Mode: memory.ParseMode(string(ctx.Request.Header.Peek("X-Session-Mode"))), Model: info.Model,
			Messages: msgs, ToolsTokens: tools, Limit: s.limits.windowFor(info.Model, info.MaxTokens), PoolPrefix: pool})
		if err == nil {
			s.mem.prepare[recallKind(turn.Stats.Recall)].Observe(time.Since(start))
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, memory.ErrClosed):
		// The sidecar is shutting down (or the request was cancelled):
		// forwarding now would bypass memory for nothing.
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "shutting_down", "the sidecar is shutting down; retry")
		return nil, nil, true
	case errors.Is(err, memory.ErrContextTooLarge):
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "context_length_exceeded", strings.TrimPrefix(err.Error(), "memory: "))
		return nil, nil, true
	case errors.Is(err, memory.ErrInvalid):
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_messages", strings.TrimPrefix(err.Error(), "memory: "))
		return nil, nil, true
	case errors.Is(err, memory.ErrUserMismatch):
		// Another end user's session: its memory is not theirs to see, and
		// the request still goes through as the client sent it.
		s.mem.userMismatch.Add(1)
		s.log.Warn("a request named another end user than its session's; forwarded without session memory", log...)
		return nil, body, false
	default:
		// Memory must never take the chat down: forward the request as the
		// client sent it.
		s.mem.bypassed.Add(1)
		s.log.Warn("session memory failed; forwarding unchanged", append(log, "err", err)...)
		return nil, body, false
	}
	if turn.Stats.AsSent {
		// The client's own messages alone fill the engine's context: the
		// request goes exactly as sent (the turn is still recorded).
		out = body
	} else {
		out, err = replaceValue(body, "messages", memory.AppendMessagesJSON(nil, turn.Messages))
	}
	if err != nil { // unreachable: parseRequest checked the body
		s.failTurn(turn)
		s.mem.bypassed.Add(1)
		return nil, body, false
	}
	ts := turn.Stats
	if w := s.opts.Windows; w != nil {
		w.Window(sess.Tenant, sess.ID, time.Now(), turn)
	}
	s.mem.turns.Add(1)
	s.mem.windowTokens.Add(uint64(ts.TotalTokens))
	s.mem.windowLimit.Add(uint64(max(ts.Limit, 0)))
	s.mem.prefixTokens.Add(uint64(ts.Prefix.Tokens))
	s.mem.prefixBytes.Add(uint64(ts.Prefix.Bytes))
	s.mem.evicted.Add(uint64(ts.Evicted))
	s.mem.recalled.Add(uint64(ts.Recalled))
	s.mem.crossSession.Add(uint64(ts.CrossSession))
	s.log.Info("session window", append(log, "mode", ts.Mode, "mode_detected", ts.ModeDetected, "match", ts.Match,
		"user", ts.User, "window_tokens", ts.TotalTokens, "limit", ts.Limit,
		"messages", ts.WindowMessages, "stored", ts.StoredMessages, "evicted", ts.Evicted, "recalled", ts.Recalled,
		"cross_session", ts.CrossSession, "pooled", ts.Pooled, "recall_tokens", ts.RecallTokens, "recall", ts.Recall, "as_sent", ts.AsSent,
		"shared_prefix_tokens", ts.Prefix.Tokens, "shared_prefix_bytes", ts.Prefix.Bytes)...)
	return turn, out, false
}

// failTurn ends a turn that got no answer: its messages leave the session
// (memory.Turn.Fail).
func (s *Server) failTurn(turn *memory.Turn) {
	if err := turn.Fail(); err != nil {
		s.mem.recordErrors.Add(1)
		s.log.Warn("taking a failed turn out of the session failed", "err", err)
	}
}

// userOf is the request's memory user scope: the X-User-ID header, else the
// body's "user" field, else "" (no end user: the session keeps its memory
// to itself unless the store's user scope is the tenant). It is checked
// like a session id.
func userOf(ctx *fasthttp.RequestCtx, info requestInfo) (string, error) {
	user := string(ctx.Request.Header.Peek("X-User-ID"))
	if user == "" {
		user = info.User
	}
	if user == "" {
		return "", nil
	}
	if err := validSessionID(user); err != nil {
		return "", fmt.Errorf("user id: %w", err)
	}
	return user, nil
}

// recording reports whether the answer's reply goes into the session: a
// turn is open and the upstream answered with success.
func (f *flow) recording() bool { return f.turn != nil && f.status < 300 }

// record is the record step, for a complete answer while recording: the
// reply (raw, a message object; cut: over memory's reply cap) enters the
// session's log before the answer's end reaches the client (issue 12 row
// 15): buffer returns, or the relay passes [DONE], only after it. usage is
// the body or event carrying the engine's prompt counts.
func (f *flow) record(usage, raw []byte, cut bool) {
	f.s.observeContext(f.info.Model, f.turn, usage)
	f.s.recordTurn(f.turn, raw, cut)
	f.turn = nil
}

// observeContext learns the engine's tokens per memory token from an
// answer's prompt tokens (usage or llama.cpp timings) to turn's window.
func (s *Server) observeContext(model string, turn *memory.Turn, body []byte) {
	if s.limits == nil || turn.Stats.AsSent {
		return
	}
	if tm, ok := engine.ParseTimings(body); ok {
		s.limits.observe(model, turn.Stats.TotalTokens, int(tm.PromptN+tm.CacheN))
	}
}

// recordTurn finishes a turn in the caller's goroutine: once it returns the
// reply is in the session's log (fsynced per the store's policy). raw is the
// assistant's reply as a message object; partial marks a reply cut short; a
// turn without any reply is aborted. The proxy calls it before the client
// sees the end of a complete answer, and for partial replies off the
// request path.
func (s *Server) recordTurn(turn *memory.Turn, raw []byte, partial bool) {
	if len(raw) == 0 {
		s.failTurn(turn) // broken before any content
		return
	}
	var msg memory.Message
	msgs, err := memory.ParseMessages(append(append([]byte{'['}, raw...), ']'))
	if err != nil || len(msgs) != 1 {
		s.log.Warn("upstream reply is not a chat message; recorded as text", "err", err)
		msg = memory.NewMessage("assistant", string(raw))
	} else {
		msg = msgs[0]
	}
	if partial {
		err = turn.CompletePartial(msg)
	} else {
		err = turn.Complete(msg)
	}
	if err != nil {
		s.mem.recordErrors.Add(1)
		s.log.Warn("recording the reply failed", "err", err)
		return
	}
	s.mem.recorded.Add(1)
}

// replyMessage returns the assistant message object of a non-streamed chat
// completion (a copy), or nil. A message over what memory keeps of a reply
// (maxBytes, memory.Store.MaxReplyBytes) comes back as a text message cut
// to maxBytes, with cut set: read from the body in place, so a huge reply
// costs no copy of itself (issue 12 row 3).
func replyMessage(body []byte, maxBytes int) (msg []byte, cut bool) {
	// The body outlives this call only through the copies made below.
	m := gjson.Get(unsafe.String(unsafe.SliceData(body), len(body)), "choices.0.message")
	if !m.IsObject() {
		return nil, false
	}
	if len(m.Raw) <= 2*maxBytes+4096 {
		return []byte(m.Raw), false
	}
	text := prefixString(m.Get("content"), maxBytes)
	if text == "" {
		text = memory.CutText(m.Get("tool_calls").Raw, maxBytes)
	}
	b, err := json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{"assistant", text})
	if err != nil {
		return nil, false
	}
	return b, true
}

// prefixString returns at most the first n bytes of the JSON string r,
// unescaping only about that much of it.
func prefixString(r gjson.Result, n int) string {
	if r.Type != gjson.String {
		return ""
	}
	raw := r.Raw
	if len(raw) > 6*n+16 { // an escape takes at most 6 bytes per byte it stands for
		raw = raw[:6*n+12]
		// Drop an escape sequence cut in the middle (at most 12 bytes).
		start := max(0, len(raw)-12)
		if i := strings.LastIndexByte(raw[start:], '\\'); i >= 0 {
			raw = raw[:start+i]
		}
		raw += `"`
	}
	return memory.CutText(gjson.Parse(raw).String(), n)
}
