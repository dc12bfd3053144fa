// Package memory owns conversation state for the sidecar: per-session durable
// message logs, token counting, the Focus window sent upstream, the memory
// units that hold what left the window, summaries, and the single injected
// memory block.
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
//     Loading fails only on I/O errors (log.go, store.go load).
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
//     worth (tokens.go).
//   - Open files and disk (storage.go, retention.go): log descriptors are
//     bounded (durable.Files, a quarter of RLIMIT_NOFILE by default); a
//     retention goroutine deletes sessions past Storage.SessionTTL and keeps
//     Dir plus the KV archive under Storage.MaxDiskBytes; a recorded reply
//     is capped at Storage.MaxReplyBytes.
//   - The window builder (Store.Prepare): pinned client system messages, the
//     injected memory block, history that fits, and the current turn.
//   - A background worker goroutine that persists memory units, access counts
//     and summaries after the response (Turn.Complete), plus the summarizer
//     goroutines it starts. Close stops and waits for all of them; Shutdown
//     does the same within a deadline.
//   - A RAG index (package index, hybrid BM25 + vectors, index.DefaultRerank)
//     per session over its memory units — evicted turns (each indexed with
//     the message before it), replies, summaries, facts, episodes — kept
//     next to the log as <hash>.idx, saved atomically by the worker and on
//     Close, and rebuilt from the units when missing, corrupt or stale
//     (ragindex.go). Per session because units belong to sessions: isolation
//     needs no filter and Delete removes the file; the pool is what sessions
//     share.
//   - Session working memory (workingmem.go): an active set (ActiveSetSize,
//     ActiveSetDecay) with Hebbian links between memories recalled together.
//     Each turn a light probe (ProbeK hits) is compared with the active set
//     and its neighbours; an overlap ≥ ReuseOverlap reuses the recalled set
//     byte for byte, otherwise a full recall (RecallK) replaces it
//     (Stats.FullRecallRate). In memory only.
//   - Memory categories and decay (categories.go): system and core memories
//     never decay and are always injected; facts and episodes decay per
//     period untouched, episodes expire; BOOST is rate-limited; review
//     flags mark promotion and decay candidates. Decay is computed from
//     each unit's DecayedAt, so a pass that runs late (after a restart,
//     when the last pass is more than DecayEvery old) catches up exactly.
//   - Extraction (extract.go, factops.go): with an Extractor, a bounded queue
//     and goroutines the Store owns turn new messages into fact operations
//     ([ADD], [UPDATE:id], [BOOST:id], [DELETE:id], [SKIP], parsed strictly:
//     a bad line is rejected alone) and every EpisodeEvery messages into an
//     episode. Never on the request path; a full queue drops (counted).
//   - The shared pool (pool.go): per-tenant keyed entries with versions,
//     creator and updater sessions, metadata, conditional writes
//     (ErrConflict), prefix listing, in one framed and checksummed log per
//     tenant, compacted on open.
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
//     passes, never exceeds the model's hard limit counted with the same
//     tokenizer, always starts with the client's leading system (and
//     developer) messages, and always contains the newest user message and
//     everything after it. When that is impossible Prepare fails with
//     ErrContextTooLarge instead of sending a cut prompt.
//   - Nothing that leaves the window is deleted: an evicted message becomes a
//     memory unit (tier working, later archive), unless a unit already holds
//     its text (units are deduplicated by role and text and never empty,
//     dedupe.go), and stays in the log (only
//     DeleteMemory, the Extractor's [DELETE:id] on facts and episodes, and
//     episode expiry delete units; a deleted unit leaves its session's
//     units, index and working memory at once and is never recreated); a
//     history that a full-history client rewrote (edit, branch, regenerate)
//     moves the replaced messages to archive units.
//   - Byte stability: the window is the client's system messages, then at
//     most one injected system block (system and core memories by id, then
//     summaries oldest→newest, then recalled memories ordered by unit id,
//     never by score), then history in original order. Eviction is sticky and has hysteresis (Options.EvictTo), so the
//     history part of consecutive prompts stays identical between evictions.
//
// # Client styles
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
//     stored history is cut at the first difference, the cut messages become
//     archive units (still listed by Memory, still recallable) and the
//     request's messages from there on are appended.
//
// ModeAppend clients (X-Session-Mode: append) send only new messages; the
// sidecar reconstitutes the history. Leading system messages equal to the
// stored ones are ignored, different ones replace them.
//
// In both modes the window is built from the stored history, and the stored
// raw bytes of each message are re-emitted unchanged.
package memory
