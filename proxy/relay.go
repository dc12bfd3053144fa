package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
)

// relayAnswer is the upstream step's hand-over of an answer it does not read
// whole: a relay takes the flow (handOff) and the exchange x, and sends
// the answer at once when it came whole in the head's burst (sendWhole),
// else as fasthttp's body stream (size: its length, -1 chunked). The
// client-gone watch goes on while the relay waits on the upstream; the
// relay's Close stops it, gives x back and releases the flow.
func (f *flow) relayAnswer(ctx *fasthttp.RequestCtx, x *exchange, sse bool, size int) outcome {
	rl := &relay{flow: f.handOff(), x: x, body: &x.body, conn: ctx.Conn(),
		sse: sse, validate: sse && (f.route == routeChat || f.route == routeCompletions),
	}
	rl.takeMem()
	if !ctx.IsHead() && rl.sendWhole(&ctx.Response) {
		return relayed
	}
	// Headers go out at once unless the first bytes of the body are
	// already here: then both leave in one write, one wakeup less for the
	// client's time to first event.
	ctx.Response.ImmediateHeaderFlush = x.body.uc.br.Buffered() == 0
	ctx.SetBodyStream(rl, size)
	return relayed
}

// handOff moves what f holds into the copy it returns, for the relay that
// releases it once the stream ends; f keeps nothing to release. The copy
// keeps nothing of the request's body, whose buffers fasthttp reuses once
// the handler returns.
func (f *flow) handOff() flow {
	h := *f
	h.in, h.body, h.info.Messages, h.info.Tools = nil, nil, nil, nil
	f.lease, f.turn, f.ereq, f.eresp = nil, nil, nil, nil
	return h
}

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

var _ io.Reader = (*relay)(nil)

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
		} else if !r.passEvents(r.buf[:n]) {
			return false
		}
	}
	switch {
	case err == nil:
		return r.body.ready(n, len(r.buf))
	case err == io.EOF:
		if r.sse && !r.endEvents() {
			return false
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
	r.x.finish(true)
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
