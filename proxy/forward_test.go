package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory"
)

// endingUpstream answers a chat request by its last user message: "ok"
// (200), "fail" (500), "ctx" (a llama.cpp context error to the first
// request that says so, then 200), "cut" (a stream broken after one
// event), "broken" (a JSON body cut short).
func endingUpstream(t *testing.T) *httptest.Server {
	var refused atomic.Bool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Role, Content string }
		}
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
			http.Error(w, "bad request", 400)
			return
		}
		last := req.Messages[len(req.Messages)-1].Content
		switch last {
		case "fail":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			fmt.Fprint(w, `{"error":{"message":"engine down","type":"server_error","code":500}}`)
			return
		case "ctx":
			if !refused.Swap(true) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(400)
				fmt.Fprint(w, `{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}`)
				return
			}
		case "cut":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half an ans\"}}]}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		case "broken":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "1000")
			fmt.Fprint(w, `{"choices":[{"index":0,"message":`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`, "echo: "+last)
	}))
	t.Cleanup(up.Close)
	return up
}

// However a session's request ends, the forward path gives back what its
// steps took exactly once and in order: the turn recorded (whole or
// partial) or failed, the engine's after-hook once per attempt, Settle and
// the lease's release last, after the turn is in the session.
func TestForwardReleasesWhatItHoldsOnce(t *testing.T) {
	up := endingUpstream(t)
	down := "http://" + refusedAddr(t) // nothing listens there, nor will

	for _, c := range []struct {
		name, last, upstream, header string
		status                       int
		after                        string // the statuses the engine heard, sorted
		events                       string
		partial                      bool
	}{
		{name: "answer", last: "ok", status: 200, after: "200",
			events: "acquire s, after, settle, release s mm"},
		{name: "error answer", last: "fail", status: 500, after: "500",
			events: "acquire s, after, settle, release s "},
		{name: "context retry", last: "ctx", status: 200, after: "200 400",
			events: "acquire s, after, after, settle, release s mm"},
		{name: "stream cut", last: "cut", status: 200, after: "200", partial: true,
			events: "acquire s, after, settle, release s mm"},
		{name: "body cut", last: "broken", status: 502, after: "502",
			events: "acquire s, after, settle, release s "},
		{name: "upstream down", last: "ok", upstream: down, status: 502, after: "502",
			events: "acquire s, after, settle, release s "},
		{name: "memory refuses", last: "ok", header: strings.Repeat("p", 600), status: 400, after: "",
			events: "acquire s, release s "},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev := &events{}
			st := openMemory(t, memory.Options{})
			fc := &orderConnector{ev: ev}
			target := up.URL
			if c.upstream != "" {
				target = c.upstream
			}
			base, srv := startSidecar(t, target, func(o *Options) {
				o.Engine, o.Memory, o.Fleet = fc, st, &fakeFleet{ev: ev, mem: st}
			})
			hdr := map[string]string{"X-Session-ID": "s", "Authorization": "Bearer k"}
			if c.header != "" {
				hdr["X-Pool-Prefix"] = c.header
			}
			body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}]}`, c.last == "cut", c.last)
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := noPoolClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body) // a broken stream ends in an error
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, b)
			}
			want := strings.Count(c.events, ",") + 1
			waitFor(t, srv, func() bool { return len(ev.list()) >= want })
			if got := strings.Join(ev.list(), ", "); got != c.events {
				t.Fatalf("events:\n got %s\nwant %s", got, c.events)
			}
			fc.mu.Lock()
			var heard []string
			for _, r := range fc.after {
				heard = append(heard, fmt.Sprint(r.Status))
			}
			fc.mu.Unlock()
			slices.Sort(heard) // each attempt's after-hook runs on its own goroutine
			if got := strings.Join(heard, " "); got != c.after {
				t.Fatalf("the engine heard %q, want %q", got, c.after)
			}
			var v sessionView
			getJSON(t, base+"/v1/sessions/s", "k", &v)
			if c.partial && (len(v.Messages) != 2 || !v.Messages[1].Partial || v.Messages[1].Content != "half an ans") {
				t.Fatalf("partial reply not recorded: %+v", v.Messages)
			}
		})
	}
}
