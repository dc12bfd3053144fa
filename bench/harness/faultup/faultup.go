// Package faultup is a fault-injecting OpenAI-compatible upstream for the
// sidecar's hostile tests: each request names the fault it wants in the
// X-Fault header (the sidecar forwards it like any end-to-end header) and
// the upstream misbehaves accordingly — streams that stop without [DONE],
// resets before and after headers, garbage, stalls, oversized bodies,
// error statuses. Without X-Fault it answers like a well-behaved server, so
// the sidecar's own background calls and health probes work.
//
// It serves /v1/chat/completions, /v1/completions, /v1/embeddings and
// /v1/models; anything else is a 404 in the OpenAI error shape. It counts
// what it did by fault, for reports.
package faultup

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Fault names one misbehaviour. Each has an outcome a correct sidecar
// produces for its client (see Expect).
type Fault string

// The faults. "Stream" faults apply to streamed requests; for a request
// that did not ask to stream they apply to the JSON body instead.
const (
	OK            Fault = "ok"             // a well-formed answer, [DONE] included
	Slow          Fault = "slow"           // a well-formed stream with gaps under the idle timeout
	FinishNoDone  Fault = "finish-no-done" // every choice has its finish_reason, then EOF without [DONE]
	HugeEvent     Fault = "huge-event"     // one 2 MiB content chunk (of words) inside a well-formed stream
	StopMidStream Fault = "stop"           // three chunks, then a clean close without [DONE] (short body when not streamed)
	EmptyStream   Fault = "empty"          // 200 text/event-stream with no events at all
	ResetEarly    Fault = "reset-early"    // the connection is reset before any response byte
	ResetMid      Fault = "reset"          // three chunks (or half a body), then a TCP reset
	Garbage       Fault = "garbage"        // a data event that is not JSON (an HTML page when not streamed)
	Stall         Fault = "stall"          // one chunk, then silence past the sidecar's idle timeout
	Hang          Fault = "hang"           // no response headers past the sidecar's upstream timeout
	Huge          Fault = "huge"           // a JSON body larger than Options.HugeBytes
	Status500     Fault = "500"            // an OpenAI-shaped 500 from the upstream itself
	Status429     Fault = "429"            // an OpenAI-shaped 429
	// LongWord answers with one word of Options.LongWordBytes letters (no
	// space), streamed in 4 KiB chunks or whole: the pathological input
	// of token counters (issue 12 row 3). Not in All.
	LongWord Fault = "long-word"
	// Drip is a stream that never ends: a chunk every SlowGap until the
	// client goes away or the Server closes. It is not in All: it is for
	// shutdown tests.
	Drip Fault = "drip"
)

// All lists every fault that ends on its own, in a stable order.
var All = []Fault{OK, Slow, FinishNoDone, HugeEvent, StopMidStream, EmptyStream, ResetEarly, ResetMid, Garbage, Stall, Hang, Huge, Status500, Status429}

// Outcome is what a client of a correct sidecar sees for a fault.
type Outcome int

const (
	// Clean: 200 and a whole answer (streams end with data: [DONE]).
	Clean Outcome = iota
	// Broken: streams get an SSE error event and the connection breaks;
	// non-streamed requests get a 502 or 504 with an upstream_* code.
	Broken
	// Passed: the upstream's own status and body reach the client as
	// they are (an error status, or a 200 body that is not an answer).
	Passed
)

// Expect returns the outcome of fault for a streamed or plain request.
func Expect(f Fault, stream bool) Outcome {
	switch f {
	case OK, Slow, FinishNoDone, HugeEvent, LongWord:
		return Clean
	case Status500, Status429:
		return Passed
	case Huge:
		if stream {
			return Clean // streams are not bounded as a whole
		}
	case EmptyStream, Garbage:
		if !stream {
			// A plain body passes as it came: garbage in a 200 is the
			// upstream's answer, not something the sidecar checks.
			return Passed
		}
	}
	return Broken
}

// Options shape a Server. Zero values are the documented defaults.
type Options struct {
	// StallFor is how long Stall and Hang keep silent. Default 30 s; set it
	// past the sidecar's --stream-idle-timeout and --upstream-timeout.
	StallFor time.Duration
	// HugeBytes is the size of a Huge body. Default 9 MiB; set it past the
	// sidecar's --max-response-bytes.
	HugeBytes int
	// SlowGap is the pause between Slow chunks. Default 50 ms.
	SlowGap time.Duration
	// LongWordBytes is the length of the LongWord reply. Default 100 KiB.
	LongWordBytes int
}

// Server is the fault-injecting upstream. Make one with New, serve with
// Serve, stop with Close (which also ends stalled responses).
type Server struct {
	opts Options
	srv  *http.Server
	quit chan struct{}
	once sync.Once

	// mu protects counts and opts.LongWordBytes.
	mu     sync.Mutex
	counts map[Fault]int
}

// New returns a Server; nothing listens yet.
func New(o Options) *Server {
	if o.StallFor == 0 {
		o.StallFor = 30 * time.Second
	}
	if o.HugeBytes == 0 {
		o.HugeBytes = 9 << 20
	}
	if o.SlowGap == 0 {
		o.SlowGap = 50 * time.Millisecond
	}
	if o.LongWordBytes == 0 {
		o.LongWordBytes = 100 << 10
	}
	s := &Server{opts: o, quit: make(chan struct{}), counts: map[Fault]int{}}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.handle), ReadHeaderTimeout: 10 * time.Second}
	return s
}

// Serve answers on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	err := s.srv.Serve(ln)
	if err == http.ErrServerClosed {
		return nil
	}
	return err
}

// Close ends stalls and closes every connection.
func (s *Server) Close() error {
	s.once.Do(func() { close(s.quit) })
	return s.srv.Close()
}

// SetLongWordBytes changes the length of LongWord replies from now on.
func (s *Server) SetLongWordBytes(n int) {
	s.mu.Lock()
	s.opts.LongWordBytes = n
	s.mu.Unlock()
}

func (s *Server) longWordBytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.LongWordBytes
}

// Counts returns how many requests got each fault, OK included.
func (s *Server) Counts() map[Fault]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[Fault]int, len(s.counts))
	for k, v := range s.counts {
		m[k] = v
	}
	return m
}

// String lists the counts as "fault=n" in the order of All.
func (s *Server) String() string {
	c := s.Counts()
	var parts []string
	for _, f := range append(All[:len(All):len(All)], LongWord, Drip) {
		if c[f] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", f, c[f]))
		}
	}
	return strings.Join(parts, " ")
}

func (s *Server) count(f Fault) {
	s.mu.Lock()
	s.counts[f]++
	s.mu.Unlock()
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	switch r.URL.Path {
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fault","object":"model","created":1,"owned_by":"faultup"}]}`)
		return
	case "/v1/embeddings":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","model":"fault","data":[{"object":"embedding","index":0,"embedding":[0.5,-0.25,1,0.125]}],"usage":{"prompt_tokens":1,"total_tokens":1}}`)
		return
	case "/v1/chat/completions", "/v1/completions":
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"message":"no such route on the fault upstream","type":"not_found_error","code":"not_found"}}`)
		return
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	f := Fault(r.Header.Get("X-Fault"))
	if f == "" {
		f = OK
	}
	s.count(f)
	chat := r.URL.Path == "/v1/chat/completions"
	if req.Stream {
		s.stream(w, f, chat)
	} else {
		s.plain(w, f, chat)
	}
}

func chunk(chat bool, text string) string {
	if chat {
		return fmt.Sprintf("data: {\"id\":\"f\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fault\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", text)
	}
	return fmt.Sprintf("data: {\"id\":\"f\",\"object\":\"text_completion\",\"created\":1,\"model\":\"fault\",\"choices\":[{\"index\":0,\"text\":%q,\"finish_reason\":null}]}\n\n", text)
}

func finish(chat bool) string {
	if chat {
		return "data: {\"id\":\"f\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fault\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
	}
	return "data: {\"id\":\"f\",\"object\":\"text_completion\",\"created\":1,\"model\":\"fault\",\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\n"
}

// reset closes the connection with a TCP RST.
func reset(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func (s *Server) stall(d time.Duration) {
	select {
	case <-time.After(d):
	case <-s.quit:
	}
}

func (s *Server) stream(w http.ResponseWriter, f Fault, chat bool) {
	switch f {
	case ResetEarly:
		reset(w)
		return
	case Hang:
		s.stall(s.opts.StallFor)
		return
	case Status500, Status429:
		s.plain(w, f, chat)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl := w.(http.Flusher)
	send := func(ev string) {
		_, _ = io.WriteString(w, ev)
		fl.Flush()
	}
	words := []string{"the ", "quick ", "brown ", "fox"}
	switch f {
	case EmptyStream:
		fl.Flush()
		return
	case StopMidStream:
		for _, t := range words[:3] {
			send(chunk(chat, t))
		}
		return
	case ResetMid:
		for _, t := range words[:3] {
			send(chunk(chat, t))
		}
		reset(w)
		return
	case Garbage:
		send(chunk(chat, words[0]))
		send("data: <html><body>502 Bad Gateway</body></html>\n\n")
		send("data: [DONE]\n\n")
		return
	case Stall:
		send(chunk(chat, words[0]))
		s.stall(s.opts.StallFor)
		return
	case LongWord:
		word := strings.Repeat("a", s.longWordBytes())
		for i := 0; i < len(word); i += 4 << 10 {
			send(chunk(chat, word[i:min(i+4<<10, len(word))]))
		}
		send(finish(chat))
		send("data: [DONE]\n\n")
		return
	case Drip:
		for {
			if _, err := io.WriteString(w, chunk(chat, "drip ")); err != nil {
				return
			}
			fl.Flush()
			select {
			case <-time.After(s.opts.SlowGap):
			case <-s.quit:
				return
			}
		}
	}
	for i, t := range words {
		if f == Slow && i > 0 {
			time.Sleep(s.opts.SlowGap)
		}
		if f == HugeEvent && i == 1 {
			// Words, not one 2 MiB word: a pathological token is a
			// different test (issue 12 rows 1 and 3).
			t = strings.Repeat("lorem ipsum ", (2<<20)/12)
		}
		send(chunk(chat, t))
	}
	send(finish(chat))
	if f != FinishNoDone {
		send("data: [DONE]\n\n")
	}
}

func (s *Server) plain(w http.ResponseWriter, f Fault, chat bool) {
	answer := `{"id":"f","object":"chat.completion","created":1,"model":"fault","choices":[{"index":0,"message":{"role":"assistant","content":"the quick brown fox"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`
	if !chat {
		answer = `{"id":"f","object":"text_completion","created":1,"model":"fault","choices":[{"index":0,"text":"the quick brown fox","finish_reason":"stop"}]}`
	}
	switch f {
	case ResetEarly:
		reset(w)
		return
	case Hang:
		s.stall(s.opts.StallFor)
		return
	case Status500:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Faultup", "500")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"message":"the model crashed (injected)","type":"server_error","code":"faultup_500"}}`)
		return
	case Status429:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"slow down (injected)","type":"rate_limit_error","code":"faultup_429"}}`)
		return
	case Garbage:
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, "<html><body>not JSON</body></html>")
		return
	case EmptyStream:
		w.Header().Set("Content-Type", "application/json")
		return
	case Huge, LongWord:
		w.Header().Set("Content-Type", "application/json")
		n := s.opts.HugeBytes
		if f == LongWord {
			n = s.longWordBytes()
		}
		pad := strings.Repeat("x", n)
		fmt.Fprintf(w, `{"id":"f","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}]}`, pad)
		return
	case StopMidStream, ResetMid, Stall:
		// Announce the whole body, send half of it, then close, reset or
		// fall silent.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(answer)))
		_, _ = io.WriteString(w, answer[:len(answer)/2])
		w.(http.Flusher).Flush()
		switch f {
		case ResetMid:
			reset(w)
		case Stall:
			s.stall(s.opts.StallFor)
		case StopMidStream:
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, answer)
}
