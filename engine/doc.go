// Package engine owns the connectors between the proxy and LLM servers for
// KV: making a session's prefix KV present in the engine before a request
// is forwarded, and capturing what the engine computed afterwards.
//
//   - Connector is the interface the proxy calls around each forwarded
//     chat/completions request: Before (may rewrite the JSON body), then
//     After exactly once (what the proxy saw of the response).
//   - LlamaCPP pins sessions to a llama.cpp server's slots (id_slot,
//     cache_prompt), saves a slot's state file when another session needs
//     the slot, keeps it in the kv.Cache's tiers as a blob keyed by a hash
//     of (tenant, session, model), and restores it when the session comes
//     back. parseSlotState validates the state files (layout in DESIGN.md).
//     With Preload, while no client request is in flight it restores the
//     state of the session expected to speak soonest (predict.go: each
//     session's last request plus its usual gap) into an idle slot whose
//     KV is saved, so that session's restore leaves the request path.
//   - Context snapshots (llamacpp_snapshot.go): ExportStates writes a
//     session's saved states (metadata and slot files, each checksummed)
//     as the engine section of a .hctx file; ImportStates takes them into
//     the tiers and the catalog of another connector as that session's,
//     after checking every slot file and that its server runs the same
//     model and KV layout (ErrOtherModel otherwise; nothing imported).
//   - Generic forwards bodies untouched and keeps statistics; engines such
//     as vLLM or SGLang reuse KV through their own prefix caches, which hit
//     because the memory package keeps the prompt prefix byte-stable.
//   - RefKV is a reference KV computer (K = RoPE(X·Wk), V = X·Wv per
//     layer, random weights): a cost and shape generator for benchmarks.
//
// Invariants:
//   - Hooks never fail a request: Before always returns a body to forward
//     (the original one on any error) and After returns nothing. A server
//     without the slot API disables the LlamaCPP connector with a single
//     warning; requests then pass untouched.
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
//     (Request.Cancel, ErrPreempted); Stats.ClientWaits counts the client
//     requests that met background work (the goal is none).
//   - Every call to the server is replayable (net/http resends one that
//     met a kept-alive connection the server closed) and idle connections
//     are dropped after 2 s and on a detected restart.
//   - Files the connector writes into the slot directory are named from
//     hashes ("kvsidecar-<hex>-<slot><op>.slot"), never from client strings, written
//     through a temporary file and a rename, and removed after use.
//   - parseSlotState never panics, allocates in proportion to its input,
//     and accepts a file only if it consumes every byte.
//   - No connector owns a goroutine; Close saves what the slots hold (unless
//     told not to) and must come before the kv.Cache's Close.
package engine
