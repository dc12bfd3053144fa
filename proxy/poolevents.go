package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/memory"
)

// GET /v1/pool/events?prefix=P follows the tenant's shared pool: every
// write and delete of a key under P ("" or "*": every key) as a
// server-sent event, as soon as its record is written (memory.PoolSubscribe).
//
//	retry: 3000
//	event: ready                   data: {"rev": N, "prefix": P}        (first, always)
//	event: reset                   data: {"reason": "gap"|"lagged"|…}   (list the pool again)
//	id: V  event: put              data: {"type","key","version","entry","at"}
//	id: V  event: delete           data: {"type","key","version","at"}
//	: keep-alive                                                          (every PoolEventsHeartbeat)
//
// The API key names the tenant, as on every pool route; nothing of another
// tenant's pool is ever sent. An EventSource that reconnects sends
// Last-Event-ID (or ?last_event_id=): the events after it that the pool
// still remembers are replayed, else a reset (gap) tells it to list again.
// A subscriber that falls behind is sent reset (lagged) and the stream
// ends; so does every stream when the server shuts down (reset, shutdown)
// or the memory store closes. Streams are bounded by memory's
// Pool.MaxSubscribers and MaxTenantSubscribers (429 beyond). The stream is
// fasthttp's body reader: it blocks in Read until an event, a heartbeat or
// the end, and moves the connection's write deadline forward for each
// chunk; a client that left is noticed at the next write (a heartbeat at
// the latest) and its subscription closed.

func (s *Server) handlePoolEvents(ctx *fasthttp.RequestCtx, tenant string) {
	prefix := string(ctx.QueryArgs().Peek("prefix"))
	last := ctx.Request.Header.Peek("Last-Event-ID")
	if len(last) == 0 {
		last = ctx.QueryArgs().Peek("last_event_id")
	}
	var after uint64
	if len(last) > 0 {
		var err error
		if after, err = strconv.ParseUint(strings.TrimSpace(string(last)), 10, 64); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_last_event_id", "Last-Event-ID must be an event id of this stream (a pool version)")
			return
		}
	}
	sub, err := s.opts.Memory.PoolSubscribe(tenant, prefix, after)
	switch {
	case err == nil:
	case errors.Is(err, memory.ErrInvalid):
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_pool_prefix", strings.TrimPrefix(err.Error(), "memory: "))
		return
	case errors.Is(err, memory.ErrTooManySubscribers):
		ctx.Response.Header.Set("Retry-After", "5")
		writeError(ctx, fasthttp.StatusTooManyRequests, typeInvalidRequest, "too_many_event_streams", strings.TrimPrefix(err.Error(), "memory: "))
		return
	case errors.Is(err, memory.ErrClosed):
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "shutting_down", "the sidecar is shutting down; retry")
		return
	default:
		s.log.Error("pool events failed", "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "the memory pool failed; see the sidecar's log")
		return
	}
	es := &poolEventStream{s: s, sub: sub, conn: ctx.Conn(), heartbeat: s.opts.PoolEventsHeartbeat}
	es.out = append(es.out, "retry: 3000\n"...)
	ready, _ := json.Marshal(map[string]any{"rev": sub.Rev, "prefix": prefix})
	es.out = appendEvent(es.out, 0, "ready", ready)
	if sub.Gap {
		es.reset("gap")
	}
	for i := range sub.Replay {
		es.event(&sub.Replay[i])
	}
	es.timer = time.NewTimer(es.heartbeat)
	s.poolStreams.Add(1)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no") // nginx: do not buffer
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStream(es, -1)
}

// poolEventStream is one client's event stream: fasthttp's response body,
// read (and closed) from the connection's goroutine after the handler
// returned.
type poolEventStream struct {
	s         *Server
	sub       *memory.PoolSubscription
	conn      net.Conn
	heartbeat time.Duration
	timer     *time.Timer
	out       []byte
	off       int
	done      bool
	closed    atomic.Bool
}

// appendEvent frames one event: data is one line of JSON.
func appendEvent(dst []byte, id uint64, name string, data []byte) []byte {
	if id > 0 {
		dst = append(dst, "id: "...)
		dst = strconv.AppendUint(dst, id, 10)
		dst = append(dst, '\n')
	}
	dst = append(dst, "event: "...)
	dst = append(dst, name...)
	dst = append(dst, "\ndata: "...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}

func (e *poolEventStream) event(ev *memory.PoolEvent) {
	b, err := json.Marshal(ev)
	if err != nil { // unreachable: entries are JSON already
		return
	}
	e.out = appendEvent(e.out, ev.Version, ev.Type, b)
}

func (e *poolEventStream) reset(reason string) {
	e.out = appendEvent(e.out, 0, "reset", fmt.Appendf(nil, `{"reason":%q}`, reason))
}

// maxEventBatch bounds the bytes of events one Read gathers before it
// returns (more wait for the next Read).
const maxEventBatch = 64 << 10

func (e *poolEventStream) Read(p []byte) (int, error) {
	for e.off >= len(e.out) {
		if e.done {
			return 0, io.EOF
		}
		e.out, e.off = e.out[:0], 0
		e.fill()
	}
	n := copy(p, e.out[e.off:])
	e.off += n
	if e.conn != nil && e.s.opts.WriteTimeout > 0 {
		_ = e.conn.SetWriteDeadline(time.Now().Add(e.s.opts.WriteTimeout))
	}
	return n, nil
}

// fill waits for the next events, a heartbeat or the end.
func (e *poolEventStream) fill() {
	select {
	case ev, ok := <-e.sub.C:
		if !ok {
			e.end()
			return
		}
		e.event(&ev)
		for len(e.out) < maxEventBatch { // what else is ready, in one chunk
			select {
			case ev, ok := <-e.sub.C:
				if !ok {
					e.end()
					return
				}
				e.event(&ev)
				continue
			default:
			}
			break
		}
	case <-e.timer.C:
		e.out = append(e.out, ": keep-alive\n\n"...)
	case <-e.s.stopping.Done():
		e.reset("shutdown")
		e.done = true
	}
	if !e.done {
		e.timer.Reset(e.heartbeat)
	}
}

// end finishes a stream whose subscription ended.
func (e *poolEventStream) end() {
	reason := "closed"
	if e.sub.Lagged() {
		reason = "lagged"
	}
	e.reset(reason)
	e.done = true
}

// Close ends the subscription; fasthttp calls it once the response is
// written or the connection failed.
func (e *poolEventStream) Close() error {
	if e.closed.CompareAndSwap(false, true) {
		e.timer.Stop()
		e.sub.Close()
		e.s.poolStreams.Add(-1)
	}
	return nil
}
