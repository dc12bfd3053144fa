package proxy

import (
	"fmt"
	"sync/atomic"

	"github.com/kvsidecar/kvsidecar/internal/histogram"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/memory"
)

// What session memory did on the request path (memMetrics, counted by
// memory.go) and what the store reports of itself (mirror), exported with
// the proxy's metrics at each scrape, as kvmetrics.go does for the KV
// cache; WindowCounters is what the console reads of them.

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
