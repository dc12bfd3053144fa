// Package llm is the sidecar's own client of the upstream model: the calls
// it makes on a session's behalf after the response (window summaries, fact
// and episode extraction, the memory reviewer's rounds, tool-context
// condensing: every memory.ExtractRequest kind is one user message), never
// on a client's request path. Client
// implements memory.Summarizer and memory.Extractor, so package memory
// needs nothing from the proxy.
//
// # What it owns
//
//   - One plain net/http client with its own small connection pool, so
//     background calls never hold a client's connection. Idle connections
//     close after 2 s (llama-server and uvicorn close theirs after 5 s), a
//     call is marked replayable (a temperature-0 completion), so net/http
//     resends one that met a connection the upstream had closed, and a
//     transport error drops the idle connections (the upstream may have
//     restarted). Cancellation is the request's context: a cancelled call
//     never closes a connection that is back in the pool (issue 12 row 14).
//   - The model of every call: Options.Model when set, else the session's
//     model (memory's requests carry it), else none (the upstream's
//     default).
//   - The bound of every reply: max_tokens sized to what the kind of call
//     expects back (FactsMaxTokens, EpisodeMaxTokens, SummaryMaxTokens,
//     ReviewMaxTokens, ToolContextMaxTokens; DefaultMaxTokens otherwise),
//     so no call holds an engine slot until the context fills; a reply the
//     engine cut there keeps its whole lines, fails or stays as it is
//     (Cut), by kind. Every attempt is bounded by Options.Timeout (60 s).
//   - Routing through an engine connector (Options.Router): every call is
//     an engine.Request{Tenant, SessionID, Model, Body, Background: true,
//     Cancel}; the body Router.Before returns is sent (nothing is sent
//     when it answers engine.ErrBusy: no slot before the deadline) and
//     Router.After hears the status and body exactly once per Before, so
//     a llama.cpp connector can place the call on a slot without evicting
//     a session, and take the slot back for a client by cancelling the
//     call (Cancel with engine.ErrPreempted). With Options.Stream the calls
//     are streamed, so the engine stops at its next token.
//   - Retries: a call taken back for a client is sent again after a
//     backoff (500 ms, doubling), at most Options.Preemptions (2) times,
//     then dropped and counted (Stats.Dropped; memory retries the work
//     after a later turn); a call that failed for a reason that may pass
//     (a transport error, 429, or a 5xx) is sent once more.
//
// # Invariants
//
//   - Replies are bounded (max_tokens, MaxReplyBytes) and every attempt
//     by Options.Timeout and the caller's context.
//   - Close drops idle connections; calls in flight end with their
//     contexts.
package llm
