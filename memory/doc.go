// Package memory owns conversation state for the sidecar: per-session durable
// message logs, token counting, the Focus window sent upstream, the memory
// units that hold what left the window, summaries, user memory across
// sessions, and the blocks that bring memory back into the window.
//
// # Rooms
//
// Store is a thin front (store.go, prepare.go, turn.go, views.go,
// admin.go): Open, Shutdown, Prepare (prepare.go; the Turn it returns then
// completes or fails: turn.go), the session views, Delete, and one-line
// calls into the subsystems it owns. Each subsystem
// owns its state, its lock and its goroutines, and states its invariants
// in its doc comment; what it needs of the others it is given at Open
// (Open builds them, wires them, then starts their goroutines):
//
//   - registry (resident.go): what is loaded — sessions and user memories,
//     their sizes, unloading — and the closed flag.
//   - sessionJournal (sessionlog.go, shared.go): the sessions' logs —
//     replay (apply), appends, deletion, a fleet's shared log.
//   - windowBuilder (window.go, block.go): the window; no I/O.
//   - retriever (recall.go, ragindex.go, userdocs.go): the indexes and
//     what a turn recalls through working memory.
//   - userScope (users.go, userlist.go): which user a session recalls
//     with, and loading a user's index.
//   - learner (extract.go, triples.go, review.go, l4.go, toolctx.go,
//     categories.go, usergraph.go): the knowledge subsystem's glue to the
//     sessions — which job is due, its prompt's facts, applying the
//     model's answer under the session's lock; the queue's goroutines.
//   - worker (worker.go): the background writes and summaries; its
//     goroutine.
//
// and, as packages under memory/internal (importing nothing of memory):
// knowledge (the memory model's prompts and strict parsers, categories
// and decay policy, triples, L4's clusters, fidelity and keywords, the
// extraction queue, and their options), journal (the log files and their
// format), pool (the shared pool),
// reviewlog (the reviewer's decisions), userlist (the users' session
// lists), retention (the disk sweep and its goroutine), memerr (the
// sentinels memory re-exports), sanitize (text safety). The shared types
// (Message, Unit, Triple, Category, Review, PoolEntry, …) are memory's, or
// aliases of the package that owns them.
// Beside the subsystems: session.go (a session, its history entries, and
// how a request relates to that history: plan, matchRequest),
// message.go (Message and its wire form), units.go (Unit: what leaves the
// window), text.go (bags of words for
// similarity), recallapi.go (Store.Recall, what MCP's session_recall
// searches), review_log.go (the reviewer's decisions, Store.Reviews),
// options.go and options_background.go (Options: EnsureDefaults,
// Validate).
//
// # What it owns
//
//   - A Store (Open … Close) rooted at Options.Dir, normally
//     <data-dir>/sessions. Each session is one append-only log file at
//     Dir/<hash(tenant)>/<xx>/<hash(tenant, session)>.log; no client string is
//     ever used as a file name. Logs are durable.Log files (magic
//     "KVSMLOG2", records framed with a length, a payload CRC-32C and a
//     header CRC-32C). On open a damaged record is skipped and every intact
//     record around it kept (the reader resynchronises), a torn tail is cut,
//     a damaged magic or meta record is rewritten; the damaged bytes go to
//     Dir/quarantine/. A log of another session is quarantined whole and the
//     session starts afresh. Version 1 logs ("KVSMLOG1") are converted.
//     Loading fails only on I/O errors (package memory/internal/journal,
//     sessionlog.go load).
//   - Token counting (Tokenizer) with tiktoken-go and its embedded offline BPE
//     files: o200k_base for gpt-4o / gpt-4.1 / gpt-4.5 / gpt-5 / o1 / o3 / o4
//     style names, cl100k_base otherwise, both overridable. Counts are cached
//     per text hash in a bounded cache, so a request tokenizes only new text.
//     A message costs its content tokens plus 4 tokens of chat framing.
//     Counting is linear in the text for any input (long runs of one
//     character class are counted in 128-byte pieces, an estimate within a
//     token per cut; ordinary text is exact), runs before the session is
//     locked, and stops with the request's context or Close. A turn that
//     cannot fit the window is refused after counting about the window's
//     worth (tokens.go counts; prepare.go's checkFixedPart, precount and
//     reuseCosts are the Prepare path's use of it).
//   - Counters (stats.go, Store.Stats); deleting a session (delete.go);
//     the prompt prefix shared by consecutive windows (prefix.go).
//   - Open files and disk (storage.go, retention.go): log descriptors are
//     bounded (durable.Files, a quarter of RLIMIT_NOFILE by default); a
//     retention goroutine (package memory/internal/retention's Sweeper,
//     stopped by Shutdown) deletes sessions past Storage.SessionTTL and keeps
//     Dir plus the KV archive under Storage.MaxDiskBytes; a recorded reply
//     is capped at Storage.MaxReplyBytes.
//   - What stays in memory (resident.go): loaded sessions and user indexes
//     in least-recently-used lists with estimated sizes; idle ones leave
//     beyond Options.MemoryBudget (256 MiB) or MaxLoadedSessions (4096),
//     after their index is saved, and load again on their next turn. A
//     session looked up (registry.session pins it until unpin), with a turn
//     in flight, background work queued or unwritten units never leaves.
//     No per-turn work depends on how many sessions are held.
//   - The window builder (Store.Prepare, window.go): the client's system
//     messages, the stable block (block.go: pinned memories, summaries and,
//     on request, shared pool entries, kept byte for byte until history
//     next leaves the window or the pool under the prefix changes), the
//     history that fits, the per-turn recall block, and the current turn
//     (the newest user message and what follows it). History leaves in
//     large steps (Window.EvictTo), so the prompt's start moves rarely and
//     the upstream's prefix cache keeps hitting; only the tail changes
//     with the recall block. While the engine moves the KV a prompt keeps
//     (Window.EngineShifts: llama.cpp's KV shifting), the oldest turns
//     leave in small steps instead (Window.ShiftEvictTo): what stays is one
//     run of the previous prompt, which the engine moves, not computes. A
//     message that asks nothing gets Recall.StatementShare of the recall
//     block.
//   - A background worker goroutine that persists memory units, access counts
//     and summaries after the response (Turn.Complete), plus the summarizer
//     goroutines it starts. Close stops and waits for all of them; Shutdown
//     does the same within a deadline.
//   - A RAG index (package index, hybrid BM25 + vectors, index.DefaultRerank)
//     per session over its memory units — evicted turns (each indexed with
//     the message before it), replies, summaries, facts, episodes — and the
//     messages still in the window (under the id and text their unit gets
//     when they leave it), kept next to the log as <hash>.idx, saved
//     atomically by the worker and on Close, and rebuilt from the units and
//     the history when missing, corrupt or stale (ragindex.go). The recall
//     block searches units only (it shows what the window does not);
//     Store.Recall (the MCP tool) searches every turn.
//   - User memory (users.go; its index documents userdocs.go): a user is
//     a scope inside a tenant (TurnRequest.UserID; "" is the tenant's
//     default user). One index per
//     (tenant, user) holds every message, fact, episode and added memory of
//     the user's sessions, so a new session recalls the earlier ones; it is
//     derived from the logs and checked against them when loaded; the
//     user's sessions are found through the user's session list
//     (userlist.go, <user hash>.usess, appended when a session is created),
//     never by reading the tenant's other logs. The index loads only once
//     the user has a second session (a single session recalls only its
//     own memory), and an index of one session's documents is not saved.
//     The pool is what users share.
//   - Per-turn recall (recall.go, block.go): the query is the newest user
//     message (with the message before it when it is short); the session's
//     index and the user's index are searched, their hits interleaved,
//     deduplicated against the window and each other, fitted into
//     Recall.Share of the limit best first, and shown oldest first, dated.
//   - Session working memory (workingmem.go): an active set (ActiveSetSize,
//     ActiveSetDecay) with Hebbian links between memories recalled together.
//     Each turn a light probe (ProbeK lexical hits, no query embedding) is
//     compared with the active set and its neighbours; an overlap ≥
//     ReuseOverlap skips the full retrieval (the previous set, rebuilt from
//     current memory, plus the probe's hits), otherwise a full retrieval
//     (Recall.K over both indexes) replaces it (Stats.FullRecallRate). The
//     gating only saves work: what it shows is never stale. In memory only
//     (a context snapshot carries it).
//   - Context snapshots (snapshot.go): ExportSession returns a session
//     captured whole for a .hctx file — the log's records that replay,
//     plus the working memory — and ImportSession creates a session from
//     one (another tenant, id or store: triple ids follow the new
//     session), checked whole by replaying it first; nothing is written
//     unless it all replays, and only for the snapshot's own end user.
//   - Memory categories and decay (categories.go): system and core memories
//     never decay and are always injected; facts and episodes decay per
//     period untouched, episodes expire; BOOST is rate-limited; review
//     flags mark promotion and decay candidates. Decay is computed from
//     each unit's DecayedAt, so a pass that runs late (after a restart,
//     when the last pass is more than DecayEvery old) catches up exactly.
//   - Extraction (extract.go; the grammar in memory/internal/knowledge):
//     with an Extractor, a bounded queue
//     and goroutines the Store owns turn new messages into fact operations
//     ([ADD], [UPDATE:id], [BOOST:id], [DELETE:id], [SKIP], parsed strictly:
//     a bad line is rejected alone) and every EpisodeEvery messages into an
//     episode. Never on the request path; a full queue drops (counted).
//     Coalesced per session: one job in flight, at most one started per
//     completed client turn (likewise summaries), each covering everything
//     that waited, so the sidecar's own calls per client turn are bounded
//     whatever a request's message count. Calls carry the session's model
//     (ExtractRequest, SummaryRequest); package cmd/sidecar/internal/llm makes them.
//   - Knowledge triples (triples.go): the fact-extraction call also asks
//     for "[TRIPLE] subject | predicate | object | supports" lines, cut
//     from the reply before knowledge.ParseFactOps and parsed as strictly
//     (knowledge.ParseTriples); supports are fact ids of the prompt or "+n", the n-th
//     [ADD] of the reply, and a triple whose supports do not all resolve is
//     rejected. Triples live in their session's log ("triple" and "tdel"
//     records); the session's triples are attached to its index as an
//     index.EntityGraph, fused in hybrid recall; the user's index gets the
//     graph of all the user's sessions' triples (usergraph.go: derived,
//     synced with the documents, saved as <user hash>.ugraph beside the
//     .uidx, reconciled from the logs on load, the newest maxUserTriples
//     links), so a new session reaches earlier sessions' facts through
//     the entities its question names. Store.Triples and
//     Store.DeleteTriple serve the console per tenant and user.
//   - The memory reviewer (review.go, its decisions logs package
//     memory/internal/reviewlog,
//     Options.Reviewer): a fact whose
//     importance reaches PromoteAt (2.5) or decays below DemoteBelow (0.5)
//     is reviewed by the Extractor in the background (an extraction job of
//     kind "review"; at most one in flight per tenant and user; a fact is
//     not reviewed twice in the same state, across restarts too: the
//     decisions log says which were), in up to MaxRounds calls each
//     answering exactly one line: [SEARCH:keywords] (a lexical search of
//     the scope's memory, shown in the next round) or [PROMOTE] (→ core),
//     [KEEP] (importance reset to DemoteBelow), [DELETE] (the ordinary
//     delete path). Malformed answers, running out of rounds, and verdicts
//     about a fact changed meanwhile change nothing. Every outcome is
//     appended to the scope's decisions log (<tenant>/users/<hash>.rev,
//     bounded, durable), which Reviews serves newest first.
//   - Tool-result context (toolctx.go, Options.ToolContext): when a
//     request brings tool results, the turn's tool calls (usually the
//     previous reply) and results are condensed after it by the Extractor
//     (kind "tool_context") into at most ToolContext.MaxBytes, shown in the
//     recall block of the session's next Prepare only and then dropped;
//     never a unit, never indexed, never written. A failed, malformed or
//     late condensing shows nothing.
//   - L4 compression (l4.go, Options.L4): past L4.Threshold facts in a
//     session, facts whose embeddings are similar (union-find) are merged
//     by the Extractor (kind "l4_merge", [MERGE] or [SKIP]) in the
//     background; a merge replaces its facts only when its fidelity (0.6 ×
//     mean embedding similarity + 0.4 × keyword retention) reaches
//     L4.Fidelity, and carries its figures and lost keywords
//     (Unit.Merged); refused clusters are remembered ("l4" records).
//     Without embeddings (Recall.IndexDisabled) the most important facts
//     are kept.
//   - The shared pool (package memory/internal/pool, served through
//     pool.go): per-tenant keyed entries with versions,
//     creator and updater sessions, metadata, conditional writes
//     (ErrConflict), prefix listing, in one framed and checksummed log per
//     tenant, compacted on open. Its writes and deletes are published to
//     bounded subscribers (PoolSubscribe; a slow one is
//     ended as lagged, a reconnecting one replayed from the newest
//     events), and a request that names a prefix
//     (TurnRequest.PoolPrefix) gets the entries under it, newest first,
//     in its stable block within Pool.ContextTokens.
//
// # Invariants
//
//   - Tenant isolation: sessions are keyed by (tenant, session id); a
//     session of another tenant is indistinguishable from a missing one
//     (ErrNotFound).
//   - Durability: a message is acknowledged (Prepare or Complete returns nil)
//     only after its record is written, and, with FsyncAlways (the default),
//     fsynced. An acknowledged record survives kill -9 and restart.
//   - The only write on the request path is the log append of the new
//     messages in Prepare. Units, summaries, tier changes and access counts
//     are written by the worker after Complete or Abort.
//   - MEM-001: the window Prepare returns, plus the tools cost the caller
//     passes, never exceeds the limit (the model's hard limit, lowered to
//     the engine's context the caller passes in TurnRequest.Limit) counted
//     with the same tokenizer, always starts with the client's leading
//     system (and developer) messages, and always contains the newest user
//     message and everything after it. When that is impossible the window
//     is the client's messages exactly as sent (TurnStats.AsSent): memory
//     is only added within the limit, and never cuts what the client sent
//     (checkFits, the one limit check).
//   - A failed turn is not history: Turn.Fail takes the messages the turn
//     appended out again (an "undo" record) and restores the system
//     messages it replaced, unless a later turn appended after them.
//   - Privacy: a session that names no end user recalls only its own
//     memory (unless Recall.TenantUserScope); a request naming another end
//     user than its session's is refused with ErrUserMismatch.
//   - Nothing that leaves the window is deleted: an evicted message becomes a
//     memory unit (tier working, later archive), unless a unit already holds
//     its text (units are deduplicated by role and text and never empty,
//     dedupe.go), and stays in the log (only
//     DeleteMemory, the Extractor's [DELETE:id] on facts and episodes, the
//     reviewer's [DELETE], L4 compression (facts it merged, or pruned
//     without embeddings) and episode expiry delete units; a deleted unit
//     leaves its session's units, index and working memory at once and is
//     never recreated); a
//     history that a full-history client rewrote (edit, branch, regenerate)
//     moves the replaced messages to archive units.
//   - Byte stability: the window is the client's system messages, then at
//     most one stable block (system and core memories by id, then
//     summaries oldest→newest), then history in original order, then at
//     most one recall block (memories ordered by time, never by score),
//     then the current turn. Eviction is sticky and has hysteresis
//     (Window.EvictTo), and the stable block changes only with it (or when
//     what it shows was changed or deleted, or the pool under the
//     request's prefix changed), so between evictions the previous prompt
//     without its recall block is a prefix of the next.
//   - A triple always has a support: deleting a unit (DeleteMemory,
//     [DELETE:id], expiry) removes it from every triple of its session and
//     deletes the triples left with none; replay derives the same from the
//     unit's "del" record. Triples are durable like the facts they rest on
//     (written in the same append) and never cross tenants or users.
//   - Users never cross tenants: a user index lives under its tenant's
//     folder and is keyed by (tenant, user); a session's user is fixed at
//     its creation.
//
// # Client styles
//
// (mode.go: Mode; session.go: matchRequest.) ModeAuto (no X-Session-Mode header) detects the style per request: a
// request whose non-system messages extend the stored history is a full
// history; one without any assistant message that does not extend it is
// new input from a client that sends only its newest message (an append);
// anything else is matched as a full history below.
//
// ModeFull clients send the whole conversation every time. The stored history
// is matched message by message (role, text, name, tool call id and tool
// calls; not raw bytes, since clients re-serialize assistant messages) and
// only the unmatched tail is appended. When the request does not extend the
// stored history:
//
//   - if it is a suffix-aligned continuation (the client trimmed old turns
//     itself), the overlap is recognised and only the new tail appended;
//   - otherwise (edited message, branch, regenerate, a reused session id) the
//     stored history is cut after the longest shared part, the cut messages
//     become archive units (still listed by Memory, still recallable) and
//     the request's messages from there on are appended.
//
// ModeAppend clients (X-Session-Mode: append) send only new messages; the
// sidecar reconstitutes the history. Leading system messages equal to the
// stored ones are ignored, different ones replace them (an append without
// system messages keeps the stored ones).
//
// In every mode the window is built from the stored history, and the stored
// raw bytes of each message are re-emitted unchanged.
package memory
