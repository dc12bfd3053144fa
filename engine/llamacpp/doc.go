// Package llamacpp is the engine connector for a llama.cpp server started
// with --slot-save-path and -np: it pins sessions to the server's slots
// (id_slot, cache_prompt), saves a slot's state file when another session
// needs the slot, keeps it in the kv.Cache's tiers as a blob keyed by a
// hash of (tenant, session, model), and restores it when the session comes
// back. parseSlotState validates the state files (layout in DESIGN.md).
// With Preload, while no client request is in flight it restores the state
// of the session expected to speak soonest (predict.go: each session's last
// request plus its usual gap) into an idle slot whose KV is saved, so that
// session's restore leaves the request path.
//
// The rooms: the slot scheduler (slots.go, no I/O), the sessions' arrival
// predictor (predict.go, no I/O), prompt-prefix hashes (chain.go), the
// catalog of saved states (states.go), the server's HTTP API (api.go), the
// state file parser (slotstate.go), what the server's answers say of KV
// shifting (shift.go: n_cache_reuse is asked on every placed request, and
// ShiftsKV tells memory how to evict), the connector's Options with their
// defaults and checks (options.go), its hooks (connector.go: Before, After;
// background.go: where a background call waits and runs, and a client
// request taking its slot back; save.go: Settle, Flush; restore.go;
// admin.go: probes, Forget, Stats, Close) over two types it owns, the saver
// (save.go) and the preloader (preload.go), its /metrics families
// (metrics.go) and console facts (console.go), and context snapshots
// (snapshot.go): ExportStates writes a session's saved states (metadata and
// slot files, each checksummed) as the engine section of a .hctx file;
// ImportStates takes them into the tiers and the catalog of another
// connector as that session's, after checking every slot file and that its
// server runs the same model and KV layout (engine.ErrOtherModel
// otherwise; nothing imported).
//
// Invariants:
//   - Hooks never fail a request: Before always returns a body to forward
//     (the original one on any error) and After returns nothing. A server
//     without the slot API disables the connector with a single warning;
//     requests then pass untouched.
//   - What Before decides for a request (its slot, what it restored) lives
//     in the request's engine.Request.State, read by After and Settle.
//   - A saved state is replaced in the cache only by a newer state that
//     parsed; a failed save or restore loses nothing already kept, and
//     llama.cpp reuses restored KV only for the tokens it matches, so a
//     stale or foreign state costs a prefill, never a wrong answer.
//   - Operations on one slot (save, restore, preload) run one at a time in
//     the order sessions were assigned to it.
//   - A preload never delays a client: it starts only while no client
//     request is in flight or arriving, takes a slot only from an occupant
//     whose KV is saved, quiet for BackgroundQuiet and expected later than
//     the session it preloads, and is abandoned if a client arrives before
//     the engine is asked; a restore already under way is waited for only
//     by the session it restores.
//   - Background work never delays a client: a Background request starts
//     only on a slot with nothing in flight, quiet for BackgroundQuiet,
//     while no client request is on its way to a slot, and a client
//     request placed on a slot running background calls cancels them
//     (engine.Request.Cancel, engine.ErrPreempted); Stats.ClientWaits
//     counts the client requests that met background work (the goal is
//     none).
//   - Every call to the server is replayable (net/http resends one that
//     met a kept-alive connection the server closed) and idle connections
//     are dropped after 2 s and on a detected restart.
//   - Files the connector writes into the slot directory are named from
//     hashes ("kvsidecar-<hex>-<slot><op>.slot"), never from client strings, written
//     through a temporary file and a rename, and removed after use.
//   - parseSlotState never panics, allocates in proportion to its input,
//     and accepts a file only if it consumes every byte.
//   - The connector owns one goroutine, the saver's (saves, then
//     preloads); Close stops it and waits, then saves what the slots hold
//     (unless told not to), and must come before the kv.Cache's Close.
//   - The saver (save.go) owns that goroutine, its wake-up channel and its
//     counters; it saves a slot only when the slot is idle and still holds
//     the content version it looked at, under the slot's op lock, and keeps
//     what it saved (keep: the catalog's per-owner bound, then MaxStates,
//     least recently used first; the same for imported states).
//   - The preloader (preload.go) owns its counters and what each slot's
//     preload restored; it runs only in the saver's goroutine (and tests),
//     after the saves, so it never takes a slot whose KV is unsaved.
//   - Both read and change the slots, sessions and fingerprint through a
//     pointer back to the connector, under the connector's mu (preloaded
//     included): there is one lock over the slots, never a second.
package llamacpp
