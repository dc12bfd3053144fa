package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestSSESplitter(t *testing.T) {
	f := func(in string, chunk int, want []string, rest string) {
		t.Helper()
		var s sseSplitter
		var got []string
		for i := 0; i < len(in); i += chunk {
			s.feed([]byte(in[i:min(i+chunk, len(in))]))
			for ev := s.next(); ev != nil; ev = s.next() {
				got = append(got, string(ev))
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || string(s.rest()) != rest {
			t.Errorf("split(%q, chunk %d) = %q rest %q; want %q rest %q", in, chunk, got, s.rest(), want, rest)
		}
	}
	for _, chunk := range []int{1, 2, 3, 5, 1000} {
		f("data: a\n\ndata: b\n\n", chunk, []string{"data: a\n\n", "data: b\n\n"}, "")
		f("data: a\r\n\r\ndata: b\r\n\r\n", chunk, []string{"data: a\r\n\r\n", "data: b\r\n\r\n"}, "")
		f("data: a\r\rdata: b\n\ndata: c", chunk, []string{"data: a\r\r", "data: b\n\n"}, "data: c")
		f("event: x\ndata: 1\ndata: 2\n\n: comment\n\n", chunk, []string{"event: x\ndata: 1\ndata: 2\n\n", ": comment\n\n"}, "")
		f("data: a\n", chunk, nil, "data: a\n")
	}
	// No line-length limit: one 3 MiB event in 7-byte pieces... and in one.
	big := "data: \"" + strings.Repeat("x", 3<<20) + "\"\n\n"
	f(big, 1<<16, []string{big}, "")
}

func FuzzSSESplitter(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: b\r\n\r\n"), uint8(3))
	f.Add([]byte("data: a\r\r\n\n"), uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		n := int(chunk%16) + 1
		var s sseSplitter
		var out []byte
		events := 0
		for i := 0; i < len(in); i += n {
			s.feed(in[i:min(i+n, len(in))])
			for ev := s.next(); ev != nil; ev = s.next() {
				events++
				out = append(out, ev...)
			}
		}
		out = append(out, s.rest()...)
		if !bytes.Equal(out, in) {
			t.Fatalf("events and rest do not rebuild the input:\n in %q\nout %q", in, out)
		}
		// Splitting in one piece finds the same number of complete events
		// unless a chunk boundary fell inside a CR LF pair.
		var one sseSplitter
		one.feed(in)
		m := 0
		for ev := one.next(); ev != nil; ev = one.next() {
			m++
		}
		if !bytes.Contains(in, []byte("\r")) && m != events {
			t.Fatalf("%d events in pieces of %d, %d in one piece, for %q", events, n, m, in)
		}
	})
}

func TestCheckEvent(t *testing.T) {
	ok := []string{"data: {\"a\":1}\n\n", "data: [DONE]\n\n", ": keepalive\n\n", "event: ping\n\n", "data:{\"a\":\ndata: 1}\n\n"}
	for _, ev := range ok {
		if err := checkEvent([]byte(ev)); err != nil {
			t.Errorf("checkEvent(%q) = %v", ev, err)
		}
	}
	bad := []string{"data: {\"a\":\n\n", "data: <html>\n\n", "data: [DONE]\ndata: x\n\n"}
	for _, ev := range bad {
		if err := checkEvent([]byte(ev)); err == nil {
			t.Errorf("checkEvent(%q) accepted garbage", ev)
		}
	}
}

// streamUpstream sends the given events, waiting for a value on step before
// each one after the first, then runs after.
func streamUpstream(t *testing.T, events []string, step <-chan struct{}, after func(w http.ResponseWriter, r *http.Request)) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		for i, ev := range events {
			if i > 0 && step != nil {
				select {
				case <-step:
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprint(w, ev)
			w.(http.Flusher).Flush()
		}
		if after != nil {
			after(w, r)
		}
	}))
}

func openStream(t *testing.T, base string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream answered %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp, bufio.NewReader(resp.Body)
}

func TestStreamEventsArriveBeforeUpstreamFinishes(t *testing.T) {
	big := `data: {"choices":[{"delta":{"content":"` + strings.Repeat("y", 1<<20) + `"}}]}` + "\n\n"
	events := []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
		": keep-alive comment\n\n",
		big,
		"data: [DONE]\n\n",
	}
	step := make(chan struct{})
	up := streamUpstream(t, events, step, nil)
	defer up.Close()
	base, _ := startSidecar(t, up.URL, nil)
	_, br := openStream(t, base)
	for i, want := range events {
		// The upstream holds event i+1 until the client has event i: the
		// relay cannot be buffering the stream.
		got, err := readEvent(br)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if got != want {
			t.Fatalf("event %d = %.80q (len %d), want %.80q (len %d)", i, got, len(got), want, len(want))
		}
		if i < len(events)-1 {
			step <- struct{}{}
		}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after [DONE]: %q, %v", rest, err)
	}
}

// TestStreamMultiLineDataPassesUnchanged: an event whose data spans
// several lines (SSE joins them with newlines) reaches the client byte for
// byte; reading its payload must not write into the event.
func TestStreamMultiLineDataPassesUnchanged(t *testing.T) {
	events := []string{
		"data: {\"choices\":[{\"index\":0,\n" + "data: \"delta\":{\"content\":\"a\"}}]}\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
		"data: [DONE]\n\n",
	}
	up := streamUpstream(t, events, nil, nil)
	defer up.Close()
	base, _ := startSidecar(t, up.URL, nil)
	_, br := openStream(t, base)
	for i, want := range events {
		got, err := readEvent(br)
		if err != nil || got != want {
			t.Fatalf("event %d = %q, %v; want %q", i, got, err, want)
		}
	}
	ev := []byte("data: a\ndata: b\n\n")
	if d := eventData(ev); string(d) != "a\nb" || string(ev) != "data: a\ndata: b\n\n" {
		t.Fatalf("eventData = %q, the event became %q", d, ev)
	}
}

func TestStreamBrokenUpstreamAbortsClient(t *testing.T) {
	first := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
	cases := map[string]struct {
		events []string
		after  func(w http.ResponseWriter, r *http.Request)
		opts   func(*Options)
		code   string
		kind   string
		skip   int // events passed after the first, before the error
	}{
		"reset": {events: []string{first}, after: func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}
		}, code: "upstream_stream_broken", kind: upErrBroken},
		"garbage": {events: []string{first, "data: <html>oops</html>\n\n", "data: [DONE]\n\n"},
			code: "upstream_garbage", kind: upErrGarbage},
		// Issue 12 row 4: chunks, then a clean close without [DONE] or a
		// finish_reason, used to reach the client as a finished answer.
		"no [DONE]": {events: []string{first, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n",
			"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\"}}]}\n\n"},
			code: "upstream_stream_incomplete", kind: upErrIncomplete, skip: 2},
		"one of two choices unfinished": {events: []string{first,
			"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"},{\"index\":1,\"delta\":{\"content\":\"b\"}}]}\n\n"},
			code: "upstream_stream_incomplete", kind: upErrIncomplete, skip: 1},
		"idle timeout": {events: []string{first}, after: func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, // silent until the sidecar gives up
			opts: func(o *Options) { o.StreamIdleTimeout = 200 * time.Millisecond }, code: "upstream_timeout", kind: upErrTimeout},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			up := streamUpstream(t, c.events, nil, c.after)
			defer up.Close()
			base, s := startSidecar(t, up.URL, c.opts)
			_, br := openStream(t, base)
			got, err := readEvent(br)
			if err != nil || got != first {
				t.Fatalf("first event %q, %v", got, err)
			}
			for i := 0; i < c.skip; i++ {
				if got, err = readEvent(br); err != nil || got != c.events[1+i] {
					t.Fatalf("event %d: %q, %v", 1+i, got, err)
				}
			}
			got, err = readEvent(br)
			if err != nil || !strings.HasPrefix(got, "event: error\ndata: {\"error\":") || !strings.Contains(got, c.code) {
				t.Fatalf("want an error event with %s, got %q, %v", c.code, got, err)
			}
			// Then the connection breaks: no clean end of the chunked body.
			rest, err := io.ReadAll(br)
			if err == nil {
				t.Fatalf("stream ended cleanly after an upstream failure; rest %q", rest)
			}
			waitFor(t, s, func() bool {
				v, ok := s.metrics.upErrors.Load(c.kind)
				return ok && v.(interface{ Load() uint64 }).Load() == 1
			})
		})
	}
}

// A stream whose every choice carried a finish_reason is a whole answer
// even when the upstream forgets [DONE]: the client gets a clean end, with
// the terminator added.
func TestStreamFinishedWithoutDoneEndsCleanly(t *testing.T) {
	events := []string{
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
	}
	up := streamUpstream(t, events, nil, nil)
	defer up.Close()
	base, s := startSidecar(t, up.URL, nil)
	_, br := openStream(t, base)
	for i, want := range append(events, "data: [DONE]\n\n") {
		if got, err := readEvent(br); err != nil || got != want {
			t.Fatalf("event %d: %q, %v; want %q", i, got, err, want)
		}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after [DONE]: %q, %v", rest, err)
	}
	if _, ok := s.metrics.upErrors.Load(upErrIncomplete); ok {
		t.Fatal("a finished stream counted as incomplete")
	}
}

func TestStreamEnd(t *testing.T) {
	var e streamEnd
	if e.finished() {
		t.Fatal("no choices is not finished")
	}
	e.add([]byte(`{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}`))
	e.add([]byte(`{"choices":[{"index":1,"delta":{"content":"y"}}]}`))
	if e.finished() {
		t.Fatal("unfinished choices")
	}
	e.add([]byte(`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`))
	if e.finished() {
		t.Fatal("choice 1 is still open")
	}
	e.add([]byte(`{"choices":[{"index":1,"delta":{},"finish_reason":"length"},{"index":-1},{"index":9000}]}`))
	if !e.finished() {
		t.Fatal("both choices ended")
	}
}

// TestStreamArrivedWholeLeavesWhole: an event stream whose every chunk,
// its last one included, came in the burst that carried its head goes to
// the client as one answer with its length, byte for byte what a stream
// would have carried ([DONE] added where only it was missing); one that
// ends in garbage still ends broken, after its error event.
func TestStreamArrivedWholeLeavesWhole(t *testing.T) {
	ev := func(s string) string {
		return "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + s + "\"}}]}\n\n"
	}
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	last := "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
	for _, c := range []struct {
		name   string
		events []string
		want   string // the body; "" for a broken answer
	}{
		{"done", []string{ev("a"), ": comment\n\n", ev("b"), last, "data: [DONE]\n\n"}, ev("a") + ": comment\n\n" + ev("b") + last + "data: [DONE]\n\n"},
		{"finished without done", []string{ev("a"), last}, ev("a") + last + "data: [DONE]\n\n"},
		{"garbage", []string{ev("a"), "data: <html>\n\n", "data: [DONE]\n\n"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c2, err := ln.Accept()
				if err != nil {
					return
				}
				defer c2.Close()
				r, err := http.ReadRequest(bufio.NewReader(c2))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, r.Body)
				var b strings.Builder
				b.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
				for _, e := range c.events {
					b.WriteString(chunk(e))
				}
				b.WriteString("0\r\n\r\n")
				_, _ = io.WriteString(c2, b.String()) // one write: it arrives whole
				_, _ = io.Copy(io.Discard, c2)
			}()
			base, s := startSidecar(t, "http://"+ln.Addr().String(), nil)
			resp, err := http.Post(base+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if c.want == "" {
				if err == nil {
					t.Fatalf("a stream ending in garbage ended cleanly: %q", body)
				}
				if want := ev("a") + "event: error\n"; !strings.HasPrefix(string(body), want) || !strings.Contains(string(body), "upstream_garbage") {
					t.Fatalf("garbage: the client read %q", body)
				}
				return
			}
			if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%d %q: %v", resp.StatusCode, resp.Header.Get("Content-Type"), err)
			}
			if resp.ContentLength != int64(len(c.want)) || len(resp.TransferEncoding) != 0 {
				t.Errorf("framed by length %d, transfer encoding %v; want length %d", resp.ContentLength, resp.TransferEncoding, len(c.want))
			}
			if string(body) != c.want {
				t.Fatalf("body %q, want %q", body, c.want)
			}
			waitFor(t, s, func() bool { return s.metrics.inFlight.Load() == 0 })
			if _, ok := s.metrics.upErrors.Load(upErrIncomplete); ok {
				t.Fatal("a finished stream counted as incomplete")
			}
		})
	}
}

// TestStreamBurstLeavesTogether: chunks that reach the sidecar in one
// burst leave in one piece, and a chunk only partly there never holds back
// the whole events before it.
func TestStreamBurstLeavesTogether(t *testing.T) {
	ev := func(s string) string {
		return "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + s + "\"}}]}\n\n"
	}
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	last := "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
	// The second write holds two whole chunks and the start of a third:
	// its size line, its size line and half its data, its data without
	// the CRLF after it.
	third := chunk(ev("c"))
	for _, cut := range []int{2, len(third) / 2, len(third) - 2} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			step := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				br := bufio.NewReader(c)
				r, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, r.Body)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
				_, _ = io.WriteString(c, chunk(ev("a"))+chunk(ev("b"))+third[:cut])
				<-step
				_, _ = io.WriteString(c, third[cut:]+chunk(last)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
			}()
			base, _ := startSidecar(t, "http://"+ln.Addr().String(), nil)
			// A raw client, to see the chunks the sidecar writes.
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 || resp.TransferEncoding == nil {
				t.Fatalf("%v %v", resp, err)
			}
			readChunk := func() string {
				t.Helper()
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				var n int
				if _, err := fmt.Sscanf(line, "%x", &n); err != nil {
					t.Fatalf("chunk size line %q: %v", line, err)
				}
				b := make([]byte, n+2)
				if _, err := io.ReadFull(br, b); err != nil {
					t.Fatal(err)
				}
				return string(b[:n])
			}
			// Both whole events, in one chunk, before the upstream sends more.
			if got, want := readChunk(), ev("a")+ev("b"); got != want {
				t.Fatalf("first chunk %q, want %q", got, want)
			}
			close(step)
			var rest strings.Builder
			for {
				ch := readChunk()
				if ch == "" {
					break
				}
				rest.WriteString(ch)
			}
			if want := ev("c") + last + "data: [DONE]\n\n"; rest.String() != want {
				t.Fatalf("the rest %q, want %q", rest.String(), want)
			}
			<-done
		})
	}
}

// TestPipelinedStreamsStayWhole: a client that pipelines two streamed
// requests on one connection gets both answers whole and in order; the
// first stream's held last bytes go out with the second answer's first
// write, never lost or reordered.
func TestPipelinedStreamsStayWhole(t *testing.T) {
	events := []string{
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
		"data: [DONE]\n\n",
	}
	step := make(chan struct{}, 8)
	up := streamUpstream(t, events, step, nil) // each event its own burst: relayed, not drained
	defer up.Close()
	go func() {
		for range 4 {
			time.Sleep(20 * time.Millisecond)
			step <- struct{}{}
		}
	}()
	base, _ := startSidecar(t, up.URL, nil)
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if _, err := io.WriteString(c, req+req); err != nil { // one write: the second request waits in the sidecar's buffer
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i := range 2 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != strings.Join(events, "") {
			t.Fatalf("answer %d: %q, %v", i, b, err)
		}
	}
}

// TestEventOfDeepNestingIsGarbage: an event whose payload nests millions
// deep is garbage to the relay, found without running out of stack.
func TestEventOfDeepNestingIsGarbage(t *testing.T) {
	if validData([]byte(strings.Repeat("[", 4<<20)), false) {
		t.Fatal("a payload of four million '[' is valid")
	}
	if !validData([]byte(`{"choices":[{"index":0,"delta":{"content":"a"}}]}`), false) {
		t.Fatal("a chunk is garbage")
	}
}
