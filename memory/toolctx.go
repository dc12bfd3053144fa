package memory

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
)

// Tool-result context. When a request brings tool results (OpenAI "tool"
// messages, or legacy "function" ones) with the assistant's tool_calls,
// those calls and results are condensed after the turn completes, in the
// background, by the Extractor's model ("tool_context" jobs on the
// extraction queue), into one or two sentences (knowledge.ParseToolContext:
// sanitized, at most ToolContext.MaxBytes, else rejected). The sentences
// are shown in the recall block of the session's next Prepare only —
// within the block's share of the window, after the recalled memories —
// and then dropped: never a unit, never indexed, never in the log. When
// the condensing fails, is malformed or is not back before the next turn
// is prepared, nothing is shown. The tool messages themselves are recorded
// and windowed like every message.

// ToolContextStats count tool-result context (Stats embeds them).
type ToolContextStats struct {
	ToolContextCalls    int64 // condensing calls made
	ToolContextReady    int64 // condensed contexts kept for a next turn
	ToolContextInjected int64 // condensed contexts shown in a next turn
	ToolContextRejected int64 // answers rejected (malformed, too long) or failed calls
	ToolContextLate     int64 // contexts ready after the next turn was prepared (dropped)
	ToolContextDropped  int64 // condensing jobs not queued: the extraction queue was full
}

// toolCtxStat are knowledge's tool-context counters.
type toolCtxStat struct {
	calls, ready, rejected, late, dropped atomic.Int64
}

// stats returns the counters; injected is the window builder's count of
// contexts shown.
func (t *toolCtxStat) stats(injected int64) ToolContextStats {
	return ToolContextStats{ToolContextCalls: t.calls.Load(), ToolContextReady: t.ready.Load(), ToolContextInjected: injected,
		ToolContextRejected: t.rejected.Load(), ToolContextLate: t.late.Load(), ToolContextDropped: t.dropped.Load()}
}

// sessToolCtx is a session's tool-result context, in memory only.
type sessToolCtx struct {
	prepares   uint64   // Prepare calls since load
	src        []*entry // the tool calls and results of the Prepare numbered srcPrepare
	srcPrepare uint64
	text       string // condensed context for the Prepare numbered forPrepare
	forPrepare uint64
}

// toolTurnLocked is called by each Prepare before the window is built: it
// returns the condensed context to show in this turn (and forgets it), and
// when the request brings tool results keeps the turn's tool calls and
// results for condensing. Called with sess.mu held, after add joined
// sess.hist.
func (kn *learner) toolTurnLocked(sess *session, add []*entry) string {
	tc := &sess.tc
	show := ""
	if tc.text != "" && tc.forPrepare == tc.prepares {
		show = tc.text
	}
	tc.text = ""
	tc.prepares++
	tc.src = nil
	if !kn.opts.ToolContext.Enabled || kn.opts.Extraction.Extractor == nil {
		return show
	}
	results := false
	for _, e := range add {
		results = results || isToolResult(e)
	}
	if !results {
		return show
	}
	// The calls usually came as the previous turn's reply, recorded by
	// Complete; the request brings only the results. So the calls and
	// results are those of the stored turn since its user message (add is
	// already in sess.hist).
	var src []*entry
	for i := len(sess.hist) - 1; i >= 0 && sess.hist[i].msg.Role != "user"; i-- {
		if e := sess.hist[i]; isToolResult(e) || e.msg.Role == "assistant" && e.msg.toolText != "" {
			src = append(src, e)
		}
	}
	slices.Reverse(src)
	tc.src, tc.srcPrepare = src, tc.prepares
	return show
}

func isToolResult(e *entry) bool { return e.msg.Role == "tool" || e.msg.Role == "function" }

// maybeToolCtxLocked queues the condensing of the last request's tool
// calls and results once its turn finished (and no later one started).
// Called with sess.mu held, from the worker.
func (kn *learner) maybeToolCtxLocked(sess *session) {
	tc := &sess.tc
	if tc.src == nil || sess.pending != nil || kn.ctx.Err() != nil {
		return
	}
	src := tc.src
	tc.src = nil
	if tc.srcPrepare != tc.prepares {
		return // a later turn already started
	}
	job := &extractJob{sess: sess, kind: jobToolCtx, prompt: kn.toolCtxPrompt(src), model: sess.lastModel, enc: sess.lastEnc, forPrepare: tc.prepares}
	if !kn.q.TryPut(job) {
		kn.tcs.dropped.Add(1)
		return
	}
	sess.refs.Add(1) // resident until the job ran (runExtract)
}

// toolCtxPrompt is the condensing prompt; each message gets an equal share
// of ToolContext.PromptBytes.
func (kn *learner) toolCtxPrompt(src []*entry) string {
	ls := make([]knowledge.ToolLine, len(src))
	for i, e := range src {
		if e.msg.Role == "assistant" {
			ls[i] = knowledge.ToolLine{Call: true, Text: e.msg.toolText}
		} else {
			ls[i] = knowledge.ToolLine{Name: e.msg.Name, Text: e.msg.Content}
		}
	}
	return knowledge.ToolContextPrompt(ls, kn.opts.ToolContext.PromptBytes)
}

// runToolCtx makes one condensing call and keeps its answer for the
// session's next Prepare.
func (kn *learner) runToolCtx(job *extractJob) {
	kn.tcs.calls.Add(1)
	sess := job.sess
	ctx, cancel := context.WithTimeout(kn.ctx, kn.opts.Extraction.Timeout)
	out, err := kn.opts.Extraction.Extractor.Extract(ctx, ExtractRequest{Tenant: sess.tenant, SessionID: sess.id, Model: job.model,
		Kind: jobToolCtx.String(), Prompt: job.prompt})
	cancel()
	text := ""
	if err == nil {
		text, err = knowledge.ParseToolContext(out, kn.opts.ToolContext.MaxBytes)
	}
	if err != nil {
		kn.tcs.rejected.Add(1)
		kn.logBackground(err, "memory: tool context", "session", sess.id, "err", err)
		return
	}
	if text == "" {
		return // [SKIP]
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.gone.Load() || sess.tc.prepares != job.forPrepare {
		kn.tcs.late.Add(1)
		return
	}
	sess.tc.text, sess.tc.forPrepare = text, job.forPrepare
	kn.tcs.ready.Add(1)
}
