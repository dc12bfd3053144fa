// Package mcpserver is the sidecar's Model Context Protocol server: one
// tool, session_recall(query, session_id), that runs the session working
// memory's gated recall (memory.Store.Recall) over the caller's own memory
// and answers the memories it recalled and whether that took a full
// retrieval or reused the active topic's set.
//
// # What it owns
//
//   - A Server (New), built on the official Go SDK
//     (github.com/modelcontextprotocol/go-sdk): one mcp.Server with the tool,
//     served over Streamable HTTP in stateless mode with JSON responses.
//     Stateless, so the sidecar keeps no MCP session per client (nothing to
//     expire, nothing that grows with clients): each POST is a whole
//     exchange; GET and DELETE answer 405, which clients read as "no
//     server-initiated stream", and a subscriptions/listen request (a
//     stream of the 2026-07-28 protocol) gets a JSON-RPC "method not found"
//     at once: the server sends no notifications.
//   - The bridge from the sidecar's fasthttp front (Server.Serve): the
//     request is converted to a net/http request whose context is bounded by
//     Options.Timeout and carries the caller, the SDK's handler runs
//     synchronously in the caller's goroutine, and its response, buffered up
//     to Options.MaxResponseBytes, is copied back. Nothing keeps the
//     *fasthttp.RequestCtx after Serve returns and no goroutine outlives a
//     request.
//   - Counters (Stats): tool calls by outcome (full, reuse, none, not
//     found, invalid, error).
//
// # Invariants
//
//   - Who calls is decided by the HTTP front, never by the tool's
//     arguments: Serve takes the Caller (the tenant of the API key and the
//     end user the request names, as every other route of the sidecar reads
//     them), and the tool reads it from the request's token info. A
//     session of another tenant or another end user is "not found", exactly
//     like a missing one; a session without an end user answers only callers
//     that name none.
//   - Bounded: request bodies (Options.MaxBodyBytes), the query
//     (memory.MaxRecallQueryBytes), each memory's text (Options.MaxTextBytes),
//     the memories per call (Options.MaxMemories), the response and the time
//     of one request.
//   - Recall writes nothing (see memory.Store.Recall): it moves only the
//     session's in-memory working memory, as a turn's recall does.
package mcpserver
