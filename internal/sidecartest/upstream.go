package sidecartest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// RecordingUpstream is a chat upstream for tests: it answers every
// request with "echo: " and the content of the last message, streamed
// (two deltas, then [DONE]) when the request asks for a stream, and keeps
// each request body. A session request (one with X-Session-Id) that asks
// for compression is answered 400: the sidecar must be able to read
// session answers. It is closed when the test ends.
type RecordingUpstream struct {
	*httptest.Server
	// mu protects the fields below.
	mu     sync.Mutex
	seen   []json.RawMessage // each request's "messages"
	bodies []string          // each request's body
}

// NewRecordingUpstream starts a RecordingUpstream on a loopback port.
func NewRecordingUpstream(t testing.TB) *RecordingUpstream {
	u := &RecordingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream   bool            `json:"stream"`
			Messages json.RawMessage `json:"messages"`
		}
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("X-Session-Id") != "" && r.Header.Get("Accept-Encoding") != "" {
			// The sidecar must read session answers: no compression.
			http.Error(w, "session request asked for compression", 400)
			return
		}
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		u.mu.Lock()
		u.seen = append(u.seen, req.Messages)
		u.bodies = append(u.bodies, string(body))
		u.mu.Unlock()
		var msgs []struct{ Role, Content string }
		_ = json.Unmarshal(req.Messages, &msgs)
		last := msgs[len(msgs)-1].Content
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, part := range []string{"echo: ", last} {
				fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", part)
				w.(http.Flusher).Flush()
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`, "echo: "+last)
	}))
	t.Cleanup(u.Close)
	return u
}

// Last is the "messages" array of the last request answered; it panics
// when none was.
func (u *RecordingUpstream) Last() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return string(u.seen[len(u.seen)-1])
}

// Bodies is a copy of every request body answered, in arrival order.
func (u *RecordingUpstream) Bodies() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.bodies...)
}
