package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
)

// relayMem is what a relay reuses from one stream to the next: its read
// buffer and the slices that grow as events pass. Pooled, a stream costs
// no allocation for them (BenchmarkRelayPass; they were most of a
// streamed request's bytes allocated under make bench-proxy's load).
type relayMem struct {
	buf      [32 << 10]byte
	out      []byte
	split    []byte
	lastData [2][]byte
	answer   []byte
}

var relayMems = sync.Pool{New: func() any { return new(relayMem) }}

// relayKeep bounds what a pooled relayMem keeps of a slice that grew: one
// stream with a huge event does not pin that much memory for good.
const relayKeep = 64 << 10

// takeMem gives r pooled buffers; giveMem, once r is done with them,
// returns them.
func (r *relay) takeMem() {
	m := relayMems.Get().(*relayMem)
	r.mem, r.buf = m, m.buf[:]
	r.out, r.split.buf = m.out[:0], m.split[:0]
	r.lastData = [2][]byte{m.lastData[0][:0], m.lastData[1][:0]}
}

func (r *relay) giveMem() {
	m := r.mem
	keep := func(b []byte) []byte {
		if cap(b) > relayKeep {
			return nil
		}
		return b[:0]
	}
	m.out, m.split, m.answer = keep(r.out), keep(r.split.buf), keep(m.answer)
	m.lastData = [2][]byte{keep(r.lastData[0]), keep(r.lastData[1])}
	r.mem, r.buf, r.out, r.split, r.lastData = nil, nil, nil, sseSplitter{}, [2][]byte{}
	relayMems.Put(m)
}

// errAbortStream ends a relayed response without its terminating chunk, so
// the client sees a broken stream rather than a finished one.
var errAbortStream = errors.New("proxy: stream aborted")

// relay streams an upstream response body to the client as fasthttp's body
// stream. For event streams it passes complete events only, each flushed as
// it arrives, and checks OpenAI event payloads; any other body is passed in
// the pieces it arrives in. Read and Close are called by fasthttp's response
// writer, after the handler returned, from a single goroutine.
type relay struct {
	// flow is the request, handed over by its upstream step: Close
	// releases what it holds, and record takes its turn when the answer
	// ends whole.
	flow
	body *upBody
	// conn is the client connection, used only to move its write deadline
	// forward for each chunk (fasthttp's deadline covers the whole response).
	conn     net.Conn
	sse      bool
	validate bool
	// x holds body and the client-gone watch; Close stops the watch and
	// gives x back.
	x *exchange
	// reply accumulates the streamed reply while the flow holds a turn.
	reply streamReply
	// lastData are the last two data events, kept while the flow holds an
	// engine request: its after-hook reads them (llama.cpp puts timings in
	// the final chunk).
	lastData [2][]byte
	// end tracks whether a validated stream finished: its [DONE], or a
	// finish_reason for every choice it started.
	end streamEnd

	split  sseSplitter
	mem    *relayMem // buf, out, split and lastData come from it
	buf    []byte
	out    []byte
	outOff int
	final  error // returned once out is drained
	sent   int64
	wdl    time.Time // the client connection's write deadline, as last moved
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
	r.count(n)
	if wt := r.s.opts.WriteTimeout; r.conn != nil && wt > 0 {
		// Moved on when an eighth of it is spent, as upConn.arm.
		if want := time.Now().Add(wt); !keepDeadline(r.wdl, want, wt) {
			r.wdl = want
			_ = r.conn.SetWriteDeadline(want)
		}
	}
	return n, nil
}

// count notes n bytes handed to the client: the first ones are the time
// to first byte.
func (r *relay) count(n int) {
	if r.sent == 0 {
		r.s.metrics.ttfb[r.route].observe(time.Since(r.start))
	}
	r.sent += int64(n)
}

// sendWhole answers with the whole answer at once, framed by its length,
// when it came in the head's burst and ended cleanly (drainBuffered): head
// and body then leave in one write, where a chunked stream costs three
// (the body, then fasthttp's last chunk and its final CRLF, each flushed),
// and each wakes the client. The relay is closed then; else it is left to
// stream, as fasthttp's body stream.
func (r *relay) sendWhole(resp *fasthttp.Response) bool {
	if !r.drainBuffered() {
		return false
	}
	resp.SetBody(r.out)
	r.count(len(r.out))
	_ = r.Close()
	return true
}

// drainBuffered reads the whole answer when the upstream's body already
// lies complete in the connection's buffer (upBody.whole), so no read
// waits, and reports whether it ended cleanly: out then holds everything
// the client is to see, the turn recorded as at a stream's [DONE]. An
// answer that ended otherwise (garbage, cut short) leaves out and final
// for Read, as a stream; one not wholly here is not touched.
func (r *relay) drainBuffered() bool {
	if !r.body.whole() {
		return false
	}
	for r.final == nil {
		r.fill()
	}
	return r.final == io.EOF
}

// fill reads from the upstream, waiting at most once, and moves what can
// be sent to out, or sets final. After a read it goes on reading while the
// upstream's next bytes are already in the connection's buffer
// (upBody.ready), so what the upstream sent in one burst leaves in one
// write to the client, not one per upstream chunk.
func (r *relay) fill() {
	for r.fillOnce() {
	}
}

// fillOnce is one read of fill; it reports whether another read would
// return at once.
func (r *relay) fillOnce() bool {
	n, err := r.body.Read(r.buf)
	if n > 0 {
		if !r.sse {
			r.out = append(r.out, r.buf[:n]...)
		} else {
			r.split.feed(r.buf[:n])
			for ev := r.split.next(); ev != nil; ev = r.split.next() {
				if !r.pass(ev) {
					return false
				}
			}
		}
	}
	switch {
	case err == nil:
		return r.body.ready(n, len(r.buf))
	case err == io.EOF:
		if rest := r.split.rest(); len(rest) > 0 && r.sse {
			// An unterminated last event: pass it as it came.
			if !r.pass(rest) {
				return false
			}
		}
		if r.validate && !r.end.done {
			if !r.end.finished() {
				// The upstream stopped before its answer ended: an error,
				// not a short answer (issue 12 row 4).
				r.s.metrics.countUpstreamError(upErrIncomplete)
				r.s.log.Warn("upstream stream ended without [DONE]", append(r.log, "route", r.route.String(), "events", r.events)...)
				r.out = append(r.out, sseErrorEvent("upstream_stream_incomplete", "upstream stream ended before the answer was complete (no [DONE], no finish_reason)")...)
				r.final = errAbortStream
				return false
			}
			// Every choice carried its finish_reason: the answer is whole
			// and only the terminator is missing. Record, then add it, so
			// every stream a client sees ends alike.
			r.commitTurn()
			r.out = append(r.out, "data: [DONE]\n\n"...)
		}
		r.final = io.EOF
		r.holdTail()
	case errors.Is(err, errCancelled):
		// The client went away; nobody reads an error event.
		r.final = errAbortStream
	default:
		_, code, kind := classifyBodyError(err, r.body.timedO)
		r.s.metrics.countUpstreamError(kind)
		r.s.log.Warn("upstream stream broken", append(r.log, "route", r.route.String(), "kind", kind, "err", err)...)
		if r.sse {
			r.out = append(r.out, sseErrorEvent(code, "upstream stream broken: "+kind)...)
		}
		r.final = errAbortStream
	}
	return false
}

// tailHolder is a client connection that can hold writes back
// (rawconn.Conn): the stream's last bytes, fasthttp's terminating chunk and
// its final CRLF, three writes each flushed, then leave in one.
type tailHolder interface {
	HoldWrites()
	ReleaseHeld()
}

// asTailHolder finds the tailHolder under c, the front door's connection.
func asTailHolder(c net.Conn) (tailHolder, bool) {
	if u, ok := c.(interface{ Unwrap() net.Conn }); ok {
		c = u.Unwrap()
	}
	h, ok := c.(tailHolder)
	return h, ok
}

// holdTail holds the client connection's writes from the stream's last
// bytes on; Close releases them to the next write, fasthttp's flush of
// the final CRLF.
func (r *relay) holdTail() {
	if h, ok := asTailHolder(r.conn); ok {
		h.HoldWrites()
	}
}

// commitTurn is the record step for a stream: the reply, complete, enters
// the session durably before the client sees the end of the stream: an
// answer whose [DONE] reached the client survives kill -9 (issue 12 row
// 15). It costs one log append (an fsync with the default policy) per
// turn. The last data event carries the engine's usage or timings (kept
// when an engine connector reads them); a reply over what memory keeps is
// recorded cut, as partial.
func (r *relay) commitTurn() {
	if r.recording() {
		r.record(r.lastData[1], r.reply.message(), r.reply.cut)
	}
}

// pass queues one complete event, or the error event that replaces garbage.
func (r *relay) pass(ev []byte) bool {
	inspect := r.validate || r.turn != nil || r.ereq != nil
	var (
		data  []byte
		multi bool
	)
	if inspect {
		data, multi = eventDataLines(ev)
	}
	if r.validate && !validData(data, multi) {
		r.s.metrics.countUpstreamError(upErrGarbage)
		r.s.log.Warn("upstream stream garbage", append(r.log, "route", r.route.String(), "event_bytes", len(ev))...)
		r.out = append(r.out, sseErrorEvent("upstream_garbage", "upstream sent an invalid event; stream aborted")...)
		r.final = errAbortStream
		return false
	}
	r.events++
	if inspect {
		switch {
		case string(data) == "[DONE]":
			if r.validate {
				r.end.done = true
				r.commitTurn() // before the client sees [DONE]
			}
		case len(data) > 0:
			if r.validate {
				r.end.add(data)
			}
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

// streamEnd follows the choices of an OpenAI event stream to tell a whole
// answer from one cut short. The zero value is ready.
type streamEnd struct {
	done bool // [DONE] arrived
	// started and ended are bit sets of choice indices (0..127; larger
	// indices are not tracked) seen at all and seen with a finish_reason.
	started, ended [2]uint64
}

// add folds one data payload in. It reads data in place (gjson on a string
// view of it; no result outlives the call) in one pass over its choices, so
// a chunk costs no allocation (BenchmarkRelayPass). A choice's first
// "index" and "finish_reason" count, as gjson.Get reads them.
func (e *streamEnd) add(data []byte) {
	js := unsafe.String(unsafe.SliceData(data), len(data))
	choices := gjson.Get(js, "choices")
	if !choices.IsArray() {
		return
	}
	k := int64(0)
	choices.ForEach(func(_, c gjson.Result) bool {
		if k >= 128 {
			return false
		}
		i := k
		k++
		var idx, fr gjson.Result
		if c.IsObject() {
			c.ForEach(func(key, v gjson.Result) bool {
				switch {
				case key.Str == "index" && !idx.Exists():
					idx = v
				case key.Str == "finish_reason" && !fr.Exists():
					fr = v
				}
				return true
			})
		}
		if idx.Exists() {
			i = idx.Int()
		}
		if i < 0 || i >= 128 {
			return true
		}
		e.started[i/64] |= 1 << (i % 64)
		if fr.Type == gjson.String && fr.Str != "" {
			e.ended[i/64] |= 1 << (i % 64)
		}
		return true
	})
}

// finished reports whether at least one choice started and every started
// choice ended with a finish_reason.
func (e *streamEnd) finished() bool {
	return e.started != [2]uint64{} && e.started == e.ended
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
	if h, ok := asTailHolder(r.conn); ok {
		h.ReleaseHeld()
	}
	r.x.stopWatch()
	if !r.body.eof {
		r.body.slot.cancel()
	}
	_ = r.body.Close()
	r.x.release()
	r.x, r.body = nil, nil
	if err != nil && !errors.Is(err, errAbortStream) {
		r.s.metrics.disconnects.Add(1)
		r.s.log.Info("client went away mid-response", append(r.log, "route", r.route.String(), "sent_bytes", r.sent)...)
	}
	// Not committed at the stream's end: a success answer cut short by
	// either side records what it produced as a partial reply.
	partial := r.recording()
	var reply []byte
	if partial {
		reply = r.reply.message()
	}
	var answer engine.Response
	if r.ereq != nil {
		// In pooled memory: release copies what outlives it.
		body := r.mem.answer[:0]
		for _, d := range r.lastData {
			if len(d) > 0 {
				body = append(append(append(body, "data: "...), d...), "\n\n"...)
			}
		}
		r.mem.answer = body
		answer = engine.Response{Status: r.status, Stream: true, Body: body}
	}
	r.release(answer, partial, reply)
	r.giveMem()
	r.s.metrics.bytesOut.Add(uint64(r.sent))
	r.s.finish(r.route, r.status, r.start)
	return nil
}
