package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

// relayBufs recycles the relays' read buffers.
var relayBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// errAbortStream ends a relayed response without its terminating chunk, so
// the client sees a broken stream rather than a finished one.
var errAbortStream = errors.New("proxy: stream aborted")

// relay streams an upstream response body to the client as fasthttp's body
// stream. For event streams it passes complete events only, each flushed as
// it arrives, and checks OpenAI event payloads; any other body is passed in
// the pieces it arrives in. Read and Close are called by fasthttp's response
// writer, after the handler returned, from a single goroutine.
type relay struct {
	s    *Server
	body *upBody
	// conn is the client connection, used only to move its write deadline
	// forward for each chunk (fasthttp's deadline covers the whole response).
	conn     net.Conn
	sse      bool
	validate bool
	route    route
	status   int
	start    time.Time
	sessLog  []any
	// stopWatch ends the client-gone watch; called once, from Close.
	stopWatch func()
	// turn, when not nil, records the streamed reply once the stream ends.
	turn  *memory.Turn
	reply streamReply
	// ereq, when not nil, is handed to the engine's after-hook with the
	// last data events (llama.cpp puts timings in the final chunk).
	ereq     *engine.Request
	lastData [2][]byte

	split  sseSplitter
	buf    []byte
	out    []byte
	outOff int
	final  error // returned once out is drained
	sent   int64
	events int
	closed atomic.Bool
}

func (r *relay) Read(p []byte) (int, error) {
	for r.outOff >= len(r.out) {
		if r.final != nil {
			return 0, r.final
		}
		r.out, r.outOff = r.out[:0], 0
		r.fill()
	}
	n := copy(p, r.out[r.outOff:])
	r.outOff += n
	if r.sent == 0 {
		r.s.metrics.ttfb[r.route].observe(time.Since(r.start))
	}
	r.sent += int64(n)
	if r.conn != nil && r.s.opts.WriteTimeout > 0 {
		_ = r.conn.SetWriteDeadline(time.Now().Add(r.s.opts.WriteTimeout))
	}
	return n, nil
}

// fill reads once from the upstream and moves what can be sent to out, or
// sets final.
func (r *relay) fill() {
	n, err := r.body.Read(r.buf)
	if n > 0 {
		if !r.sse {
			r.out = append(r.out, r.buf[:n]...)
		} else {
			r.split.feed(r.buf[:n])
			for ev := r.split.next(); ev != nil; ev = r.split.next() {
				if !r.pass(ev) {
					return
				}
			}
		}
	}
	switch {
	case err == nil:
	case err == io.EOF:
		if rest := r.split.rest(); len(rest) > 0 && r.sse {
			// An unterminated last event: pass it as it came.
			if !r.pass(rest) {
				return
			}
		}
		r.final = io.EOF
	case errors.Is(err, errCancelled):
		// The client went away; nobody reads an error event.
		r.final = errAbortStream
	default:
		_, code, kind := classifyBodyError(err, r.body.timedO)
		r.s.metrics.countUpstreamError(kind)
		r.s.log.Warn("upstream stream broken", append(r.sessLog, "route", r.route.String(), "kind", kind, "err", err)...)
		if r.sse {
			r.out = append(r.out, sseErrorEvent(code, "upstream stream broken: "+kind)...)
		}
		r.final = errAbortStream
	}
}

// pass queues one complete event, or the error event that replaces garbage.
func (r *relay) pass(ev []byte) bool {
	if r.validate {
		if err := checkEvent(ev); err != nil {
			r.s.metrics.countUpstreamError(upErrGarbage)
			r.s.log.Warn("upstream stream garbage", append(r.sessLog, "route", r.route.String(), "event_bytes", len(ev))...)
			r.out = append(r.out, sseErrorEvent("upstream_garbage", "upstream sent an invalid event; stream aborted")...)
			r.final = errAbortStream
			return false
		}
	}
	r.events++
	if r.turn != nil || r.ereq != nil {
		if data := eventData(ev); len(data) > 0 && string(data) != "[DONE]" {
			if r.turn != nil {
				r.reply.add(data, r.s.opts.Memory.MaxReplyBytes())
			}
			if r.ereq != nil {
				r.lastData[0] = append(r.lastData[0][:0], r.lastData[1]...)
				r.lastData[1] = append(r.lastData[1][:0], data...)
			}
		}
	}
	r.out = append(r.out, ev...)
	return true
}

// Close implements io.Closer for response writers that call it without an
// error.
func (r *relay) Close() error { return r.CloseWithError(nil) }

// CloseWithError is called by fasthttp once the response is written or
// writing failed (err: the client went away, or the relay aborted).
func (r *relay) CloseWithError(err error) error {
	if r.closed.Swap(true) {
		return nil
	}
	r.stopWatch()
	relayBufs.Put((*[32 << 10]byte)(r.buf))
	r.buf = nil
	if !r.body.eof {
		r.body.slot.cancel()
	}
	_ = r.body.Close()
	if err != nil && !errors.Is(err, errAbortStream) {
		r.s.metrics.disconnects.Add(1)
		r.s.log.Info("client went away mid-response", append(r.sessLog, "route", r.route.String(), "sent_bytes", r.sent)...)
	}
	if r.turn != nil {
		// Record what was produced; a stream cut short by either side is a
		// partial reply.
		clean := err == nil && errors.Is(r.final, io.EOF) && r.status < 300 && !r.reply.cut
		r.s.record(r.turn, r.reply.message(), !clean)
		r.turn = nil
	}
	if r.ereq != nil {
		var body []byte
		for _, d := range r.lastData {
			if len(d) > 0 {
				body = append(append(append(body, "data: "...), d...), "\n\n"...)
			}
		}
		r.s.engineAfter(r.ereq, &engine.Response{Status: r.status, Stream: true, Body: body})
		r.ereq = nil
	}
	r.s.metrics.bytesOut.Add(uint64(r.sent))
	r.s.finish(r.route, r.status, r.start)
	return nil
}
