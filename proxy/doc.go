// Package proxy owns the sidecar's main listener: a fasthttp server in front
// of one OpenAI-compatible upstream, the OpenAI wire types it needs to read,
// the pooled upstream client, SSE relaying, OpenAI-shaped errors, /healthz
// and /readyz, and the sidecar's metrics. The admin listener (its /metrics,
// the console, pprof) is package admin's, which reaches the proxy through
// interfaces it defines: *Server implements them (FrontListener,
// HandleParseError, CountRequest, HandleHealth, HandleReady, DeleteSession,
// WindowCounters), and cmd/sidecar wires the two; this package does not
// import admin.
//
// It depends on session memory and the KV cache only through interfaces it
// owns, each as small as its callers (options.go): Memory for the chat path,
// the sessions API and the pool; SessionLister, a Memory that can also list,
// for GET /v1/sessions; KV for /v1/kv and the KV metrics; Windows, told of
// each window built and each session deleted (the console's, admin.Windows).
// Every connection is read through package frontdoor: one strict reader
// decides each request's framing and header lines before any handler acts,
// and hands fasthttp one canonical request per Read. With
// Options.EventLoop the front door's event loop serves the pass-through
// itself and hands every other connection to fasthttp; the proxy is its
// Backend (loop.go): it alone decides which requests the loop serves, and
// starts and ends each as the forward path does (engine hooks, metrics,
// OpenAI-shaped errors).
//
// Files, in the order a chat request meets them: server.go (lifecycle,
// the front door's options and its refusals' answer, health), route.go
// (the route step: the handler, the raw path read once, which route,
// whether it may be forwarded), forward.go (the forward path: a /v1
// request as a pipeline of steps, route, session, memory, engine,
// upstream, relay and record, each in the file of its work; the engine
// step, and the one release of what they hold), wire.go (the parse step:
// the request fields the steps read, model, messages, stream; 400s),
// session.go (the session step: the session id and the tenant, a hash of
// the bearer), memory.go (the memory and record steps: the window in place
// of the messages, the reply into the session), ctxlimit.go (the engine's
// context per model), upstream.go (the upstream step: the upstream
// request, its answer's head, read whole or handed to a relay; failures as
// statuses, bounded body reads), upclient.go (the pooled upstream client:
// checkout, dial, one resend on a reused connection, the answer's head and
// body, and the exchange one round trip holds until its answer is read),
// upalive_linux.go (a pooled connection's check on checkout),
// gone_linux.go (the watch that cancels the upstream request when the
// client goes), relay.go (an answer not read whole: the flow handed over,
// the upstream's bytes read and written to the client, the close that
// releases everything), stream.go (the event stream the relay reads:
// events passed one by one and checked, the answer's end, the reply kept
// for memory and recorded before [DONE]), background.go (the work left
// after responses), errors.go (the error types and codes a client may
// see). Beside the chat path: loop.go (the event loop's Backend:
// eligibility, hooks, metrics and error bodies; --event-loop), pool.go and
// poolevents.go (the shared pool's API and its event stream), sessions.go
// (GET /v1/sessions and the /v1/sessions/{id} routes), memmetrics.go (what
// memory did, for the metrics and the console), snapshot.go (context
// snapshots), mcp.go (/mcp), kvapi.go and kvmetrics.go (/v1/kv and the KV
// metrics), metrics.go, options.go (Options: EnsureDefaults, Validate, and
// the interfaces); *_other.go, the same without Linux's system calls. The
// upstream's TCP connections are read and written with raw system calls
// through their poller (package internal/rawconn), as the front door's
// client connections are: a stream's last writes held into one, an upstream
// request sent in the read that waits for its answer.
//
// Invariants:
//   - Every error a client sees is OpenAI-shaped JSON
//     ({"error":{"message","type","code"}}) with the right status; never a stack
//     trace and never a hang. Before response headers are written an upstream
//     failure is a 502 (or 504 on timeout); after them the connection is aborted
//     (no terminating chunk), after an SSE error event, so no client mistakes a
//     broken stream for a finished one. A chat or completions stream that ends
//     without [DONE] is broken too, unless every choice it started carried a
//     finish_reason (then the relay adds [DONE]).
//   - The raw path is read once (route.go) and routes and handles alike:
//     /v1/sessions, /v1/pool and /v1/kv are never forwarded, and no path is
//     forwarded that another server could read as one of them.
//   - Request bodies are bounded (Options.MaxBodyBytes, 413 beyond), buffered
//     upstream responses too (Options.MaxResponseBytes); streamed responses are
//     relayed event by event with no line-length limit; an event stream
//     that arrived whole with its head is checked the same way and leaves
//     as one answer with its length.
//   - Hop-by-hop headers are stripped in both directions; Authorization and
//     every end-to-end header pass through unchanged, and so does the body.
//   - A client that disconnects cancels its upstream request.
//   - A request never fails on an upstream connection the upstream already
//     closed (upclient.go): pooled connections idle for
//     Options.UpstreamIdleTimeout are closed, each is checked on checkout,
//     and a request that fails on a reused connection before any response
//     byte is sent again, once, on a freshly dialed one. A fresh
//     connection's failure is one 502.
//   - No error message a client reads quotes the upstream's bytes. A
//     response head that even a lenient reading refuses (upclient.go,
//     frontdoor.RepairFraming) is a 502 upstream_bad_response.
//   - No *fasthttp.RequestCtx is kept after its handler returns.
//   - No error body quotes the request: its path, headers, ids or keys.
//
// The shared pool's events (poolevents.go): GET /v1/pool/events is a
// server-sent event stream of the tenant's pool writes and deletes under a
// prefix (memory.PoolSubscribe), bounded in number (429), with a heartbeat,
// ended by Shutdown. A chat request's X-Pool-Prefix header is the only way
// the pool reaches a prompt (memory.TurnRequest.PoolPrefix).
//
// The MCP endpoint (mcp.go): with Options.MCP, /mcp (exact path) is the
// Model Context Protocol server of package mcpserver. The proxy bounds the
// body and authenticates the caller as on every state route (the bearer's
// tenant, 401 without one; the X-User-ID end user) and hands both over;
// the tool never takes the caller from its arguments. Without it /mcp is
// 404.
//
// Context snapshots (snapshot.go): GET /v1/sessions/{id}/snapshot answers
// the caller's session (API key and exactly its X-User-ID end user) as one
// .hctx file (package hctx: a manifest, memory's section, and the engine's
// KV states when the connector keeps them, SnapshotEngine, within
// Options.MaxSnapshotBytes); PUT with such a file creates the session for
// the caller, replacing the caller's own session of that id. An import is
// checked whole before anything is written (damaged: 400, another end
// user: 403, states of another model: 409) and undone if its engine half
// fails.
//
// Session plumbing: a request's session id comes from the X-Session-ID header,
// else the body's prompt_cache_key; its tenant is a hash of the Authorization
// bearer, so one key never sees another key's sessions. Without a session id,
// or without a bearer token (unless Options.AllowAnonymous), the request is a
// plain stateless passthrough, and the state APIs answer 401 to the latter.
// A complete reply is recorded before the client sees the end of the answer
// (the response is written, or [DONE] passed, after the session log append);
// partial ones after the response.
package proxy
