package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/histogram"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/memory"
)

// memMetrics count what session memory did on the request path.
type memMetrics struct {
	turns        atomic.Uint64 // chat requests that went through a window
	windowTokens atomic.Uint64 // tokens of those windows
	prefixTokens atomic.Uint64 // tokens each shared with its session's previous window
	prefixBytes  atomic.Uint64
	evicted      atomic.Uint64
	recalled     atomic.Uint64
	crossSession atomic.Uint64 // of recalled: from the user's other sessions
	bypassed     atomic.Uint64 // memory failed; the request went through unchanged
	recorded     atomic.Uint64 // replies recorded (complete or partial)
	recordErrors atomic.Uint64 // replies that could not be recorded
	userMismatch atomic.Uint64 // requests naming another end user than their session's
	// contextRetries counts turns the upstream refused for its context
	// and that were sent again with a window built for it.
	contextRetries atomic.Uint64
	// windowLimit sums the limits those windows were built within, so
	// windowTokens / windowLimit is how full the Focus (the context
	// window) runs.
	windowLimit atomic.Uint64
	// prepare times memory.Prepare, window and recall, by how recall was
	// chosen (recallKinds).
	prepare [len(recallKinds)]histogram.Histogram
}

// recallKinds label sidecar_memory_prepare_seconds: memory.TurnStats.Recall,
// with "none" for a turn that recalled nothing.
var recallKinds = [...]string{"full", "reuse", "none"}

// recallKind is the index in recallKinds of a turn's Recall.
func recallKind(recall string) int {
	switch recall {
	case "full":
		return 0
	case "reuse":
		return 1
	}
	return 2
}

// export registers memory's families in reg: the prepare histograms, and a
// collector that mirrors m's counters and stats() at each scrape.
func (m *memMetrics) export(reg *obs.Registry, stats func() memory.Stats) {
	for i, k := range recallKinds {
		m.prepare[i].ExportTo(reg.Histogram(fmt.Sprintf("sidecar_memory_prepare_seconds{recall=%q}", k),
			"Time session memory took to prepare a turn (window and recall) on the request path, by how recall was chosen (full search, reuse of the working memory, none).", histogram.Bounds()))
	}
	reg.OnScrape(func() { m.mirror(reg, stats()) })
}

func (m *memMetrics) mirror(reg *obs.Registry, st memory.Stats) {
	for _, c := range []struct {
		name, help string
		v          uint64
	}{
		{"sidecar_memory_turns_total", "Chat requests whose window was built from session memory.", m.turns.Load()},
		{"sidecar_memory_window_tokens_total", "Tokens of the windows sent upstream.", m.windowTokens.Load()},
		{"sidecar_memory_window_limit_tokens_total", "The token limits those windows were built within (what fits the engine's context beside the reply, else the configured window): window_tokens over this is the Focus (context window) utilisation.", m.windowLimit.Load()},
		{"sidecar_memory_prefix_shared_tokens_total", "Tokens each window shared with its session's previous window (prompt-cache friendliness).", m.prefixTokens.Load()},
		{"sidecar_memory_prefix_shared_bytes_total", "Bytes each window shared with its session's previous window.", m.prefixBytes.Load()},
		{"sidecar_memory_evicted_messages_total", "Messages that left the window (kept as memory units).", m.evicted.Load()},
		{"sidecar_memory_recalled_total", "Memories shown in recall blocks.", m.recalled.Load()},
		{"sidecar_memory_recalled_cross_session_total", "Recalled memories that came from the user's other sessions.", m.crossSession.Load()},
		{"sidecar_memory_bypassed_total", "Requests forwarded unchanged because session memory failed.", m.bypassed.Load()},
		{"sidecar_memory_replies_recorded_total", "Assistant replies recorded (complete ones before the client sees the answer's end, partial ones after).", m.recorded.Load()},
		{"sidecar_memory_record_errors_total", "Assistant replies that could not be recorded (the answer went out regardless).", m.recordErrors.Load()},
		{"sidecar_memory_context_retries_total", "Turns the upstream refused for its context (before any byte reached the client) and that were sent again with a window built for the context it stated.", m.contextRetries.Load()},
		{"sidecar_memory_as_sent_total", "Turns whose client messages alone did not fit the engine's context: forwarded exactly as sent, no memory added.", uint64(st.AsSent)},
		{"sidecar_memory_user_mismatch_total", "Requests that named another end user than their session's: forwarded without session memory.", m.userMismatch.Load()},
		{"sidecar_memory_failed_turn_messages_total", "Messages of turns whose upstream answer failed, taken out of their session again.", uint64(st.Undone)},
		{"sidecar_memory_summaries_total", "Summaries made in the background.", uint64(st.Summaries)},
		{"sidecar_memory_queue_full_total", "Background syncs deferred because the queue was full.", uint64(st.QueueFull)},
		{"sidecar_memory_write_errors_total", "Background memory writes that failed.", uint64(st.WriteErrors)},
	} {
		reg.SetCounter(c.name, c.help, int64(c.v))
	}
	for _, c := range []struct {
		name, help string
		v          int64
	}{
		{"full_recalls", "Recalls that ran a full top-k search (topic switch or first turn).", st.FullRecalls},
		{"recall_by_words", "Index searches whose query embedding failed (the embeddings endpoint down, slow or in a new vector space): the turn recalled by words.", st.RecallByWords},
		{"index_errors", "Memory index updates, searches or saves that failed.", st.IndexErrors},
		{"probe_reuses", "Recalls answered by the working memory (same topic).", st.ProbeReuses},
		{"extract_dropped", "Fact-extraction jobs dropped because the queue was full.", st.ExtractDropped},
		{"fact_ops_rejected", "Fact operations from the model rejected by the strict parser.", st.FactOpsRejected},
		{"triples", "Knowledge triples extracted (new ones).", st.Triples},
		{"triples_rejected", "Triple lines from the model rejected by the strict parser or for unresolved supports.", st.TriplesRejected},
		{"logs_repaired", "Session and pool logs repaired on open (damaged records skipped, torn tails cut).", st.Quarantined},
		{"log_records_lost", "Damaged log records skipped on open (every intact record is kept).", st.RecordsLost},
		{"replies_cut", "Replies recorded cut to the reply size cap.", st.RepliesCut},
		{"sessions_expired", "Sessions deleted by the session TTL.", st.SessionsExpired},
		{"sessions_evicted", "Sessions deleted to stay under the disk budget.", st.SessionsEvicted},
		{"quarantine_removed", "Quarantined files deleted (age or disk budget).", st.QuarantineRemoved},
		{"disk_budget_kv_trims", "Times the KV archive was trimmed to stay under the disk budget.", st.SharedTrims},
		{"log_reopens", "Idle session logs reopened (open files are bounded).", st.FileReopens},
		{"sessions_unloaded", "Idle sessions unloaded from memory (memory budget or session bound); they load again on their next turn.", st.SessionsUnloaded},
		{"users_unloaded", "Idle user indexes unloaded from memory (memory budget or bound).", st.UsersUnloaded},
		{"reviews", "Memory reviews finished (any decision).", st.Reviews},
		{"review_errors", "Memory reviews abandoned because a model call failed (nothing changed).", st.ReviewErrors},
		{"reviews_dropped", "Memory reviews not queued because the background queue was full.", st.ReviewsDropped},
		{"tool_context_injected", "Condensed tool contexts shown in a session's next turn.", st.ToolContextInjected},
		{"tool_context_rejected", "Tool-context condensings rejected (malformed, too long) or failed: nothing shown.", st.ToolContextRejected},
		{"tool_context_late", "Tool contexts ready only after the next turn was prepared (dropped).", st.ToolContextLate},
		{"tool_context_dropped", "Tool-context condensings not queued because the background queue was full.", st.ToolContextDropped},
		{"l4_runs", "L4 compression runs over a session's facts past the threshold (clustering passes, and importance prunes without embeddings).", st.L4Runs},
		{"l4_facts_merged", "Facts replaced by L4 merges that reached the fidelity threshold.", st.L4FactsMerged},
		{"l4_facts_pruned", "Facts deleted by L4's fallback without embeddings (the most important kept).", st.L4FactsPruned},
		{"l4_dropped", "L4 compression runs not queued because the background queue was full.", st.L4Dropped},
		{"pool_events_published", "Shared pool events delivered to event streams (GET /v1/pool/events).", st.PoolEventsPublished},
		{"pool_event_streams_lagged", "Pool event streams ended because their client fell behind (it lists the pool again).", st.PoolSubscribersLagged},
		{"pool_event_streams_refused", "Pool event streams refused: too many open (429).", st.PoolSubscribeRefused},
		{"pool_context_turns", "Windows whose stable block showed shared pool entries (X-Pool-Prefix).", st.PoolContextTurns},
		{"pool_context_errors", "Windows that went without the shared pool they asked for because reading it failed.", st.PoolContextErrors},
	} {
		reg.SetCounter("sidecar_memory_"+c.name+"_total", c.help, c.v)
	}
	for _, c := range []struct {
		mode, how string
		v         int64
	}{{"full", "header", st.FullNamed}, {"full", "detected", st.FullDetected}, {"append", "header", st.AppendNamed}, {"append", "detected", st.AppendDetected}} {
		reg.SetCounter(fmt.Sprintf("sidecar_memory_turns_by_mode_total{mode=%q,how=%q}", c.mode, c.how),
			"Session turns by the mode taken (full or append) and how it was chosen (header or detected).", c.v)
	}
	for _, c := range []struct {
		decision string
		v        int64
	}{{memory.ReviewPromote, st.ReviewsPromoted}, {memory.ReviewKeep, st.ReviewsKept}, {memory.ReviewDelete, st.ReviewsDeleted},
		{memory.ReviewMalformed, st.ReviewsMalformed}, {memory.ReviewUndecided, st.ReviewsUndecided}, {memory.ReviewStale, st.ReviewsStale}} {
		reg.SetCounter(fmt.Sprintf("sidecar_memory_reviews_by_decision_total{decision=%q}", c.decision),
			"Memory reviews by decision (promote, keep and delete changed the fact; malformed, undecided and stale did not).", c.v)
	}
	for _, c := range []struct {
		outcome string
		v       int64
	}{{"kept", st.L4Merged}, {"rejected", st.L4Rejected}, {"skipped", st.L4Skipped}, {"malformed", st.L4Malformed}, {"stale", st.L4Stale}, {"error", st.L4Errors}} {
		reg.SetCounter(fmt.Sprintf("sidecar_memory_l4_merges_total{outcome=%q}", c.outcome),
			"L4 merges by outcome (kept replaced its originals; rejected fell below the fidelity threshold; skipped, malformed, stale and error changed nothing).", c.v)
	}
	calls := st.FactCalls + st.EpisodeCalls + st.SummaryCalls + st.ReviewCalls + st.ToolContextCalls + st.L4Calls
	for _, c := range []struct {
		kind string
		v    int64
	}{{"facts", st.FactCalls}, {"episode", st.EpisodeCalls}, {"summary", st.SummaryCalls}, {"review", st.ReviewCalls}, {"tool_context", st.ToolContextCalls}, {"l4_merge", st.L4Calls}} {
		reg.SetCounter(fmt.Sprintf("sidecar_memory_background_calls_total{kind=%q}", c.kind), "The sidecar's own upstream calls for memory, by kind.", c.v)
	}
	perTurn := 0.0
	if st.Completes > 0 {
		perTurn = float64(calls) / float64(st.Completes)
	}
	reg.SetGauge("sidecar_memory_background_calls_per_turn", "The sidecar's own upstream calls per completed client turn.", perTurn)
	reg.SetGauge("sidecar_memory_full_recall_rate", "Full recalls over all recalls.", st.FullRecallRate)
	reg.SetGauge("sidecar_memory_sessions_loaded", "Sessions held in memory.", float64(st.Sessions))
	for _, g := range []struct {
		name, help string
		v          int64
	}{
		{"sidecar_memory_disk_bytes", "Bytes of session data on disk (logs, indexes, pools, quarantine) at the last retention sweep.", st.DiskBytes},
		{"sidecar_kv_archive_disk_bytes", "Bytes of KV archive blocks on disk at the last retention sweep.", st.SharedDiskBytes},
		{"sidecar_disk_budget_bytes", "The disk budget of sessions and KV archive together (0: none).", st.MaxDiskBytes},
		{"sidecar_memory_open_files", "Session and pool log files open now.", int64(st.OpenFiles)},
		{"sidecar_memory_users_loaded", "User indexes held in memory.", int64(st.Users)},
		{"sidecar_memory_resident_bytes", "Estimated bytes held in memory by loaded sessions and user indexes.", st.ResidentBytes},
		{"sidecar_memory_budget_bytes", "The memory budget of loaded sessions and user indexes (negative: none).", st.MemoryBudget},
		{"sidecar_memory_open_files_max", "The bound on open log files (from RLIMIT_NOFILE unless set).", int64(st.MaxOpenFiles)},
		{"sidecar_memory_pool_event_streams", "Shared pool event streams open now (GET /v1/pool/events).", st.PoolSubscribers},
	} {
		reg.SetGauge(g.name, g.help, float64(g.v))
	}
}

// prepareTurn records the request's new messages in the session and returns
// the body to forward, with "messages" replaced by the window. A nil turn
// means the request goes through unchanged; handled reports that an error
// answer was written.
func (s *Server) prepareTurn(ctx *fasthttp.RequestCtx, sess sessionRef, info requestInfo, body []byte, log []any) (turn *memory.Turn, out []byte, handled bool) {
	st := s.opts.Memory
	msgs, err := memory.ParseMessages(info.Messages)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_messages", strings.TrimPrefix(err.Error(), "memory: "))
		return nil, nil, true
	}
	tools := 0
	if len(info.Tools) > 0 {
		tools, err = st.CountTokensContext(s.stopping, info.Model, string(info.Tools))
	}
	user, uerr := userOf(ctx, info)
	if uerr != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_user", uerr.Error())
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

// handleSessions serves the sessions API: GET /v1/sessions/{id},
// GET /v1/sessions/{id}/memory, DELETE /v1/sessions/{id}, and
// GET|PUT /v1/sessions/{id}/snapshot (snapshot.go), scoped by tenant.
// tail is the raw path after /v1/sessions (see route.go).
func (s *Server) handleSessions(ctx *fasthttp.RequestCtx, tail []byte) {
	if s.opts.Memory == nil {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "memory_disabled", "session memory is disabled on this sidecar")
		return
	}
	if len(tail) == 0 {
		s.listSessions(ctx) // GET /v1/sessions
		return
	}
	// tail is what follows /v1/sessions: "/{id}", "/{id}/memory" or
	// "/{id}/snapshot", the id one escaped segment (so ".." is a name
	// here, not a step up).
	segs, err := pathSegments(tail)
	wantMemory := len(segs) == 2 && segs[1] == "memory"
	wantSnapshot := len(segs) == 2 && segs[1] == "snapshot"
	if err != nil || len(segs) == 0 || len(segs) > 2 || len(segs) == 2 && !wantMemory && !wantSnapshot {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_path", "session path must be /v1/sessions (the list) or /v1/sessions/{id}[/memory|/snapshot] with the id URL-escaped")
		return
	}
	id := segs[0]
	if err := validSessionID(id); err != nil || id == "" {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_session_id", "session id must be one URL-escaped path segment of 1..256 bytes without control characters")
		return
	}
	tenant, ok := s.requireTenant(ctx)
	if !ok {
		return
	}
	if wantSnapshot {
		s.handleSnapshot(ctx, tenant, id) // the end user must match exactly
		return
	}
	// A caller that names an end user sees only that user's sessions.
	if user := string(ctx.Request.Header.Peek("X-User-ID")); user != "" {
		if sv, err := s.opts.Memory.Session(tenant, id); err == nil && sv.User != user {
			writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "session_not_found", "no session of this id for this API key and user")
			return
		}
	}
	var v any
	switch {
	case ctx.IsGet() && wantMemory:
		v, err = s.opts.Memory.Memory(tenant, id)
	case ctx.IsGet():
		var sv memory.SessionView
		if sv, err = s.opts.Memory.Session(tenant, id); err == nil && s.opts.Engine != nil {
			es, ok := s.engine.SessionStats(tenant, id)
			v = struct {
				memory.SessionView
				Engine *engine.SessionStats `json:"engine,omitempty"`
			}{sv, ptrIf(es, ok)}
		} else {
			v = sv
		}
	case ctx.IsDelete() && !wantMemory:
		err = s.DeleteSession(ctx, tenant, id)
		v = map[string]any{"id": id, "object": "session.deleted", "deleted": err == nil}
	default:
		writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use GET or DELETE")
		ctx.Response.Header.Set("Allow", "GET, DELETE") // after writeError, which resets the response
		return
	}
	if errors.Is(err, memory.ErrNotFound) {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "session_not_found", "no session of this id for this API key")
		return
	}
	if err != nil {
		s.log.Error("session admin failed", "session", id, "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "session store failed; see the sidecar's log")
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, v)
}

func ptrIf[T any](v T, ok bool) *T {
	if !ok {
		return nil
	}
	return &v
}

// DeleteSession deletes a session's memory and then what follows it: the
// console's last window (Options.Windows) and the engine's saved KV (a
// failure there is logged; the session is gone either way). The sessions
// API and the console's admin API (package admin) both delete through it.
func (s *Server) DeleteSession(ctx context.Context, tenant, id string) error {
	if err := s.opts.Memory.Delete(tenant, id); err != nil {
		return err
	}
	s.forgetWindow(tenant, id)
	if s.opts.Engine != nil {
		if err := s.engine.Forget(ctx, tenant, id); err != nil {
			s.log.Warn("dropping a deleted session's KV failed", "session", id, "err", err)
		}
	}
	return nil
}

// forgetWindow tells Options.Windows that a session is gone or replaced.
func (s *Server) forgetWindow(tenant, id string) {
	if w := s.opts.Windows; w != nil {
		w.Forget(tenant, id)
	}
}

// WindowCounters returns the windows the chat path built, their tokens
// and their limits, and the memory.Prepare latencies of the turns that
// recalled (full or reuse): the cumulative counters the console's KV
// series and alert thresholds read (package admin).
func (s *Server) WindowCounters() (turns, windowTokens, windowLimit uint64, recall histogram.Snapshot) {
	for i, k := range recallKinds {
		if k != "none" {
			recall = recall.Add(s.mem.prepare[i].Snapshot())
		}
	}
	return s.mem.turns.Load(), s.mem.windowTokens.Load(), s.mem.windowLimit.Load(), recall
}
