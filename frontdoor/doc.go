// Package frontdoor owns the first reading of a client's bytes: one strict
// HTTP/1.1 request reader that decides, once for every request on every
// connection, whether the request is accepted, where it ends and which
// header lines it has — before any server acts on it.
//
// Why: the sidecar is the first HTTP parser between clients and the engine,
// and often sits behind another proxy that frames requests its own way.
// Where two parsers of a chain disagree on where a request ends, bytes of
// one request become another (request smuggling); where one merges what
// the other drops (trailers, folded lines), headers a front proxy set or
// stripped come back. fasthttp's reader is lenient where nginx is strict,
// and the sidecar's event loop reads heads its own way: with this package
// in front of both, neither decides anything about framing.
//
// What it owns:
//   - Head.Parse: a request head read as nginx 1.22 reads it, refusing what
//     nginx refuses (a stricter 400 where nginx lets something by that a
//     server behind it could read another way). See Parse for the rules.
//   - Chunked: the decoder of chunked bodies: strict for a request, whose
//     trailers are read, checked and dropped, never merged into the head;
//     lenient (Chunked.Lenient) for an upstream's answer to the event loop.
//   - Conn and Listener: a client connection whose Read returns one
//     canonical request at a time (the head rewritten from what Parse kept,
//     a chunked body decoded with its length), answering refused requests
//     itself. A Read never returns bytes of two requests, so a server that
//     flushes when its read buffer is empty writes each answer before it
//     waits on the next request: no answer waits on a pipelined request that
//     arrives incomplete.
//
// Invariants:
//   - Hop-by-hop fields (Connection and the fields it lists, Keep-Alive,
//     TE, Trailer, Transfer-Encoding, Upgrade, Proxy-*) and Expect never
//     reach the server behind the door: what the sidecar reads (tenant,
//     session, end user) is what it forwards.
//   - A refused request gets an answer naming the rule it broke, never
//     quoting its bytes, then the connection closes (after a lingering
//     read, so the client reads the answer rather than a reset).
//   - Work and memory per request are bounded by Limits: the head by
//     MaxHead and MaxLine, a chunked body by MaxBody, each check made as
//     the bytes arrive.
package frontdoor
