// Package frontdoor owns a client's connection from its first byte: one
// strict HTTP/1.1 request reader that decides, once for every request on
// every connection, whether the request is accepted, where it ends and
// which header lines it has — before any server acts on it — and the
// event loop that serves the pass-through itself, handing every other
// connection over to the server behind (fasthttp's, in package proxy).
//
// Why strict: the sidecar is the first HTTP parser between clients and the
// engine, and often sits behind another proxy that frames requests its own
// way. Where two parsers of a chain disagree on where a request ends,
// bytes of one request become another (request smuggling); where one
// merges what the other drops (trailers, folded lines), headers a front
// proxy set or stripped come back. fasthttp's reader is lenient where
// nginx is strict: with this package in front of it, and the loop reading
// through the same Parse, nothing behind the door decides framing.
//
// Why a loop: on a small machine the proxy's CPU per request is its
// latency, and Go's poller wakes a goroutine per socket event. One thread
// on its own edge-triggered epoll loop (nginx's worker, in Go) serves the
// pass-through at or above nginx's requests/s, where the fasthttp path
// behind the same front door serves about three quarters of them at 1.4
// times the loop's CPU per request and nearly twice its p99 (make
// bench-proxy-wrk and bench-proxy-ceiling; docs/BENCHMARKS.md, "The event
// loop behind the strict front door").
//
// What it owns:
//   - Head.Parse (head.go): a request head read as nginx 1.22 reads it,
//     refusing what nginx refuses (a stricter 400 where nginx lets something
//     by that a server behind it could read another way). See Parse for the
//     rules.
//   - Chunked (chunked.go): the one decoder of chunked bodies: strict for a
//     request, whose trailers are read, checked and dropped, never merged
//     into the head; lenient (Chunked.Lenient) for an upstream's answer to
//     the loop. Beside it PeekChunk and WholeChunks only look: whether a
//     buffer holds a whole, plainly framed chunk or body (the proxy's
//     upstream body asks before a read).
//   - Conn and Listener (conn.go): a client connection whose Read returns one
//     canonical request at a time (the head rewritten from what Parse kept, a
//     chunked body decoded with its length), answering refused requests
//     itself. A Read never returns bytes of two requests, so a server that
//     flushes when its read buffer is empty writes each answer before it
//     waits on the next request: no answer waits on a pipelined request that
//     arrives incomplete. Client sockets are read and written with raw system
//     calls (package internal/rawconn).
//   - Loop (loop_linux.go; StartLoop refuses elsewhere, loop_other.go): the
//     event loop on one listener, with its client connections
//     (client_linux.go) and its own pool of upstream connections
//     (upstream_linux.go), whose answers it reads as the forward path's
//     client reads them (answer.go, RepairFraming). A Loop is the
//     net.Listener of the connections it hands over: each resumes in a Conn
//     with the bytes the loop read.
//
// Which requests the loop serves, and why: those its Backend admits, and only
// those. The loop itself takes an HTTP/1.1 request with at most a
// Content-Length body within LoopOptions.MaxBody and no 100-continue to
// answer; the Backend (the proxy) says, from the head (Eligible) and then the
// whole request (Start; the interface in backend.go), whether its own path
// would send the request on unchanged — for the sidecar, a non-streamed chat
// or completions POST without a session — since only then is serving it
// elsewhere invisible. Anything else, or any doubt (a head Parse refuses, one
// larger than the loop's buffer), hands the connection over before anything
// of that request went upstream. The Backend starts and ends each request it
// admits (the engine's hooks, the metrics) and writes the error body of each
// failure (Backend.Fail); its methods never block, as the loop runs them on
// its one thread.
//
// Invariants:
//   - Hop-by-hop fields (Connection and the fields it lists, Keep-Alive,
//     TE, Trailer, Transfer-Encoding, Upgrade, Proxy-*) and Expect never
//     reach the server behind the door, nor the upstream from the loop:
//     what the sidecar reads (tenant, session, end user) is what it
//     forwards. HopByHop is that rule, and the proxy's header copies use it.
//   - A refused request gets an answer naming the rule it broke (errors.go),
//     never quoting its bytes, then the connection closes (after a lingering
//     read, so the client reads the answer rather than a reset).
//   - Work and memory per request are bounded by Limits: the head by
//     MaxHead and MaxLine, a chunked body by MaxBody, each check made as
//     the bytes arrive; the loop's answers by MaxAnswerHead and
//     LoopOptions.MaxAnswer.
//   - A request the loop serves ends exactly once (Backend.End or Fail),
//     whichever way it ends, the loop's shutdown included; one it hands
//     over never reached the upstream from the loop.
//   - The loop reads the clock once per wake-up of epoll_wait; its
//     deadlines are checked every 100 ms (a timeout fires up to 100 ms
//     late).
package frontdoor
