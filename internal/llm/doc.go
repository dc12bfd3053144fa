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
//     background calls never hold a client's connection. Cancellation is
//     the request's context: a cancelled call never closes a connection
//     that is back in the pool (issue 12 row 14).
//   - The model of every call: Options.Model when set, else the session's
//     model (memory's requests carry it), else none (the upstream's
//     default).
//   - Routing through an engine connector (Options.Router): every call is
//     an engine.Request{Tenant, SessionID, Model, Body, Background: true};
//     the body Router.Before returns is sent and Router.After hears the
//     status and body exactly once per Before, so a llama.cpp connector can
//     place the call on a slot without evicting a session.
//   - One retry: a call that failed for a reason that may pass (a transport
//     error, 429, or a 5xx) is sent once more; the calls are idempotent
//     (a completion of a fixed prompt at temperature 0).
//
// # Invariants
//
//   - Replies are bounded (MaxReplyBytes) and every call is bounded by
//     Options.Timeout and the caller's context.
//   - Close drops idle connections; calls in flight end with their
//     contexts.
package llm
