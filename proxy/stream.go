package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/internal/jsonscan"
	"github.com/kvsidecar/kvsidecar/memory"
)

// The event stream as the relay reads it (relay.go reads and writes the
// bytes): each read's bytes cut into complete events (sseSplitter), each
// event's data checked and passed on (pass), the answer's end followed
// (streamEnd), the reply kept for memory (streamReply) and recorded at
// [DONE] (commitTurn), before the client sees it; at the upstream's end,
// endEvents.

// passEvents passes on the complete events p completes, in order. It
// reports false once one ended the stream (pass).
func (r *relay) passEvents(p []byte) bool {
	r.split.feed(p)
	for ev := r.split.next(); ev != nil; ev = r.split.next() {
		if !r.pass(ev) {
			return false
		}
	}
	return true
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

// endEvents ends the event stream at the upstream's end: an unterminated
// last event passes as it came; a validated stream that ended without
// [DONE] gets its [DONE] when every choice it started finished (the turn
// recorded first), and is aborted with an error event otherwise. It
// reports false when the stream was aborted (final set).
func (r *relay) endEvents() bool {
	if rest := r.split.rest(); len(rest) > 0 {
		// An unterminated last event: pass it as it came.
		if !r.pass(rest) {
			return false
		}
	}
	if !r.validate || r.end.done {
		return true
	}
	if !r.end.finished() {
		// The upstream stopped before its answer ended: an error, not a
		// short answer (issue 12 row 4).
		r.s.metrics.countUpstreamError(upErrIncomplete)
		r.s.log.Warn("upstream stream ended without [DONE]", append(r.log, "route", r.route.String(), "events", r.events)...)
		r.out = append(r.out, sseErrorEvent("upstream_stream_incomplete", "upstream stream ended before the answer was complete (no [DONE], no finish_reason)")...)
		r.final = errAbortStream
		return false
	}
	// Every choice carried its finish_reason: the answer is whole and only
	// the terminator is missing. Record, then add it, so every stream a
	// client sees ends alike.
	r.commitTurn()
	r.out = append(r.out, "data: [DONE]\n\n"...)
	return true
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

// streamReply accumulates a streamed chat answer (choice 0): its text and
// its tool calls, whose ids, names and argument pieces arrive in deltas.
// The zero value is ready.
type streamReply struct {
	text  strings.Builder
	calls []streamCall
	size  int  // bytes of text and tool-call arguments kept
	cut   bool // more arrived than the cap: the reply is recorded partial
}

type streamCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// add folds one chunk's data payload in, keeping at most maxBytes of text
// and arguments (memory.Store.MaxReplyBytes), so a huge stream costs
// bounded memory.
func (sr *streamReply) add(data []byte, maxBytes int) {
	if sr.cut {
		return
	}
	d := gjson.GetBytes(data, "choices.0.delta")
	if !d.Exists() {
		return
	}
	text := d.Get("content").String()
	if sr.size+len(text) > maxBytes {
		text, sr.cut = memory.CutText(text, maxBytes-sr.size), true
	}
	sr.size += len(text)
	sr.text.WriteString(text)
	d.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		i := int(tc.Get("index").Int())
		if i < 0 || i > 128 {
			return true // not a real index; ignore rather than grow
		}
		for len(sr.calls) <= i {
			sr.calls = append(sr.calls, streamCall{Type: "function"})
		}
		c := &sr.calls[i]
		if v := tc.Get("id").String(); v != "" {
			c.ID = v
		}
		if v := tc.Get("type").String(); v != "" {
			c.Type = v
		}
		if v := tc.Get("function.name").String(); v != "" {
			c.Function.Name = v
		}
		args := tc.Get("function.arguments").String()
		if sr.size+len(args) > maxBytes {
			args, sr.cut = memory.CutText(args, maxBytes-sr.size), true
		}
		sr.size += len(args)
		c.Function.Arguments += args
		return !sr.cut
	})
}

// message returns the reply as an assistant message object, nil when the
// stream carried neither text nor tool calls.
func (sr *streamReply) message() []byte {
	if sr.text.Len() == 0 && len(sr.calls) == 0 {
		return nil
	}
	m := struct {
		Role      string       `json:"role"`
		Content   *string      `json:"content"`
		ToolCalls []streamCall `json:"tool_calls,omitempty"`
	}{Role: "assistant", ToolCalls: sr.calls}
	if sr.text.Len() > 0 || len(sr.calls) == 0 {
		t := sr.text.String()
		m.Content = &t
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil
	}
	return b
}

// sseSplitter cuts a byte stream into Server-Sent Events. An event ends at a
// blank line; lines end in LF, CRLF or CR. Events of any length are kept
// whole: there is no line-length limit, only the memory the event takes.
//
// The zero value is ready to use.
type sseSplitter struct {
	buf     []byte // buf[off:] is not yet returned as an event
	off     int
	scanned int // buf[off:scanned] holds no event boundary start
}

// feed appends p to the pending bytes. Events returned by next before this
// call are invalid after it.
func (s *sseSplitter) feed(p []byte) {
	if s.off > 0 {
		n := copy(s.buf, s.buf[s.off:])
		s.buf = s.buf[:n]
		s.scanned = max(0, s.scanned-s.off)
		s.off = 0
	}
	s.buf = append(s.buf, p...)
}

// next returns the next complete event with its terminating blank line, or
// nil when the pending bytes hold none.
func (s *sseSplitter) next() []byte {
	end := eventEnd(s.buf, max(s.scanned, s.off))
	if end <= 0 {
		// Rescan a little before the end next time: a boundary may be split
		// across two reads.
		s.scanned = max(s.off, len(s.buf)-3)
		return nil
	}
	ev := s.buf[s.off:end]
	s.off, s.scanned = end, end
	return ev
}

// rest returns the bytes of an unterminated final event, if any.
func (s *sseSplitter) rest() []byte { return s.buf[s.off:] }

// eventEnd looks for the first event boundary at or after i and returns the
// index just past it, -1 when buf[i:] holds none, or 0 when the answer depends
// on bytes not yet read.
func eventEnd(buf []byte, i int) int {
	for j := i; j < len(buf); j++ {
		c := buf[j]
		if c != '\n' && c != '\r' {
			continue
		}
		// buf[j] ends a line; is the next line empty?
		k := j + 1
		if c == '\r' {
			if k == len(buf) {
				return 0
			}
			if buf[k] == '\n' {
				k++
			}
		}
		if k == len(buf) {
			return -1
		}
		switch buf[k] {
		case '\n':
			return k + 1
		case '\r':
			if k+1 == len(buf) {
				return 0
			}
			if buf[k+1] == '\n' {
				return k + 2
			}
			return k + 1
		}
		j = k - 1
	}
	return -1
}

// errGarbage marks an upstream stream that is not a valid OpenAI event stream.
var errGarbage = errors.New("upstream sent an event that is not JSON")

// checkEvent validates one complete event of an OpenAI-style stream: every
// data payload is JSON or the [DONE] marker. Comments and other fields pass.
func checkEvent(ev []byte) error {
	if !validData(eventDataLines(ev)) {
		return errGarbage
	}
	return nil
}

// validData is checkEvent on an event's data payload (eventDataLines).
// gjson's validator agrees with encoding/json.Valid (fuzzed side by side)
// at a fraction of its cost (BenchmarkRelayPass).
func validData(data []byte, multi bool) bool {
	switch {
	case data == nil:
		return true
	case !multi && string(data) == "[DONE]":
		return true
	}
	return jsonscan.Valid(data)
}

// eventData returns the data payload of one event (its data lines joined
// by newlines, in a copy), nil when it has none. ev is not modified.
func eventData(ev []byte) []byte {
	d, _ := eventDataLines(ev)
	return d
}

func eventDataLines(ev []byte) (data []byte, multi bool) {
	for len(ev) > 0 {
		var line []byte
		if i := lineEnd(ev); i >= 0 {
			line = ev[:i]
			if ev[i] == '\r' && i+1 < len(ev) && ev[i+1] == '\n' {
				i++
			}
			ev = ev[i+1:]
		} else {
			line, ev = ev, nil
		}
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		v := line[len("data:"):]
		if len(v) > 0 && v[0] == ' ' {
			v = v[1:]
		}
		if data != nil {
			if !multi {
				// data is a slice of ev: join the lines in a copy, never
				// over the event's own bytes (which go to the client).
				data = data[:len(data):len(data)]
			}
			multi = true
			data = append(append(data, '\n'), v...)
		} else {
			data = v
		}
	}
	return data, multi
}

// lineEnd returns the index of the first CR or LF in b, -1 when none.
func lineEnd(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	head := b
	if i >= 0 {
		head = b[:i]
	}
	if j := bytes.IndexByte(head, '\r'); j >= 0 {
		return j
	}
	return i
}

// sseErrorEvent renders an OpenAI-shaped error as one SSE event, the way a
// client's stream reader surfaces it.
func sseErrorEvent(code, msg string) []byte {
	var b []byte
	b = append(b, "event: error\ndata: "...)
	b = append(b, errorJSON(typeUpstream, code, msg)...)
	b = append(b, "\n\n"...)
	return b
}
