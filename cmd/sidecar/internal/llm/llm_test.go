package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

// upstream records what it is asked and answers with reply(n, body), n
// counting requests from 1.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
	auth   []string
	n      atomic.Int64
}

func newUpstream(t *testing.T, reply func(n int64, w http.ResponseWriter, body []byte)) *upstream {
	return newUpstreamConns(t, nil, reply)
}

// newUpstreamConns is newUpstream with a connection-state hook.
func newUpstreamConns(t *testing.T, connState func(net.Conn, http.ConnState), reply func(n int64, w http.ResponseWriter, body []byte)) *upstream {
	u := &upstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, string(b))
		u.auth = append(u.auth, r.Header.Get("Authorization"))
		u.mu.Unlock()
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		reply(u.n.Add(1), w, b)
	}))
	u.Config.ConnState = connState
	u.Start()
	t.Cleanup(u.Close)
	return u
}

func answer(w http.ResponseWriter, content string) {
	w.Header().Set("Content-Type", "application/json")
	c, _ := json.Marshal(content)
	fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":%s}}]}`, c)
}

func newClient(t *testing.T, o Options) *Client {
	t.Helper()
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func modelOf(t *testing.T, body string) string {
	t.Helper()
	var req struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatalf("request %q: %v", body, err)
	}
	return req.Model
}

// TestCallsCarryTheSessionModel: summaries and extraction name the
// session's model unless Options.Model overrides it; the key is sent; the
// reply is parsed.
func TestCallsCarryTheSessionModel(t *testing.T) {
	up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ []byte) {
		answer(w, "They planned a trip.\nFACT: the user likes volcanoes\n")
	})
	c := newClient(t, Options{BaseURL: up.URL + "/v1", APIKey: "bg-key"})
	sum, err := c.Summarize(context.Background(), memory.SummaryRequest{Tenant: "t", SessionID: "s", Model: "llama-3-8b",
		Previous: "Earlier.", Messages: []memory.Message{memory.NewMessage("user", "let's see Etna")}})
	if err != nil || sum.Text != "They planned a trip." || len(sum.Facts) != 1 || sum.Facts[0] != "the user likes volcanoes" {
		t.Fatalf("summary %+v, %v", sum, err)
	}
	out, err := c.Extract(context.Background(), memory.ExtractRequest{Tenant: "t", SessionID: "s", Model: "qwen-7b", Kind: "facts", Prompt: "extract please"})
	if err != nil || !strings.Contains(out, "FACT:") {
		t.Fatalf("extract %q, %v", out, err)
	}
	over := newClient(t, Options{BaseURL: up.URL, Model: "small"})
	if _, err := over.Extract(context.Background(), memory.ExtractRequest{Model: "qwen-7b", Prompt: "x"}); err != nil {
		t.Fatal(err)
	}
	none := newClient(t, Options{BaseURL: up.URL})
	if _, err := none.Extract(context.Background(), memory.ExtractRequest{Prompt: "x"}); err != nil {
		t.Fatal(err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.bodies) != 4 {
		t.Fatalf("%d calls", len(up.bodies))
	}
	for i, want := range []string{"llama-3-8b", "qwen-7b", "small", ""} {
		if got := modelOf(t, up.bodies[i]); got != want {
			t.Errorf("call %d model %q, want %q", i, got, want)
		}
	}
	if up.auth[0] != "Bearer bg-key" || up.auth[2] != "" || !strings.Contains(up.bodies[0], "let's see Etna") ||
		!strings.Contains(up.bodies[1], `"content":"extract please"`) {
		t.Fatalf("upstream saw %q %q", up.auth, up.bodies)
	}
}

// router records the engine hooks.
type router struct {
	mu      sync.Mutex
	before  []engine.Request
	after   []int // statuses
	rewrite func([]byte) []byte
}

func (r *router) Before(_ context.Context, req *engine.Request) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.before = append(r.before, *req)
	if r.rewrite != nil {
		return r.rewrite(req.Body), nil
	}
	return req.Body, nil
}

func (r *router) After(_ context.Context, _ *engine.Request, resp *engine.Response) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.after = append(r.after, resp.Status)
}

// TestRouterSeesEveryCallOnce: with a Router, every attempt is an
// engine.Request marked Background for the session, the body Before returns
// is what is sent, and After hears each attempt's status exactly once.
func TestRouterSeesEveryCallOnce(t *testing.T) {
	up := newUpstream(t, func(n int64, w http.ResponseWriter, body []byte) {
		if !strings.Contains(string(body), `"id_slot":3`) {
			http.Error(w, "not routed", 400)
			return
		}
		if n == 1 {
			http.Error(w, `{"error":{"message":"busy"}}`, 503)
			return
		}
		answer(w, "[SKIP]")
	})
	rt := &router{rewrite: func(b []byte) []byte {
		return []byte(strings.Replace(string(b), "{", `{"id_slot":3,`, 1))
	}}
	c := newClient(t, Options{BaseURL: up.URL, Router: rt, Logger: nil})
	out, err := c.Extract(context.Background(), memory.ExtractRequest{Tenant: "ten", SessionID: "sess", Model: "m", Kind: "facts", Prompt: "p"})
	if err != nil || out != "[SKIP]" {
		t.Fatalf("extract %q, %v", out, err)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.before) != 2 || len(rt.after) != 2 || rt.after[0] != 503 || rt.after[1] != 200 {
		t.Fatalf("before %d, after %v", len(rt.before), rt.after)
	}
	for _, r := range rt.before {
		if !r.Background || r.Tenant != "ten" || r.SessionID != "sess" || r.Model != "m" || len(r.Body) == 0 {
			t.Fatalf("engine request %+v", r)
		}
	}
	if st := c.Stats(); st.Calls != 1 || st.Retries != 1 || st.Failures != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRetryOnceOnlyWhenItMayHelp: a 5xx or a dropped connection is retried
// once; a 4xx, a malformed reply and a cancelled call are not.
func TestRetryOnceOnlyWhenItMayHelp(t *testing.T) {
	cases := []struct {
		name    string
		reply   func(n int64, w http.ResponseWriter)
		calls   int64
		wantErr bool
	}{
		{"503 then ok", func(n int64, w http.ResponseWriter) {
			if n == 1 {
				w.WriteHeader(503)
				return
			}
			answer(w, "ok")
		}, 2, false},
		{"always 500", func(_ int64, w http.ResponseWriter) { w.WriteHeader(500) }, 2, true},
		{"400", func(_ int64, w http.ResponseWriter) { w.WriteHeader(400) }, 1, true},
		{"no content", func(_ int64, w http.ResponseWriter) { fmt.Fprint(w, `{"choices":[]}`) }, 1, true},
		{"dropped then ok", func(n int64, w http.ResponseWriter) {
			if n == 1 {
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
				return
			}
			answer(w, "ok")
		}, 2, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(n int64, w http.ResponseWriter, _ []byte) { tc.reply(n, w) })
			c := newClient(t, Options{BaseURL: up.URL})
			_, err := c.Complete(context.Background(), Call{User: "hi"})
			if (err != nil) != tc.wantErr || up.n.Load() != tc.calls {
				t.Fatalf("err %v, %d calls; want error %v, %d calls", err, up.n.Load(), tc.wantErr, tc.calls)
			}
		})
	}
	// A cancelled call is not retried.
	started := make(chan struct{}, 4)
	hold := make(chan struct{})
	up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ []byte) {
		started <- struct{}{}
		<-hold // answers only once the test is over
		answer(w, "late")
	})
	t.Cleanup(func() { close(hold) }) // before the upstream closes: cleanups run last first
	c := newClient(t, Options{BaseURL: up.URL})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	if _, err := c.Complete(ctx, Call{User: "hi"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	if n := up.n.Load(); n != 1 {
		t.Fatalf("cancelled call sent %d times", n)
	}
}

// TestCancelAfterReplyNeverBreaksPooledConnections reproduces issue 12
// row 14: memory cancels a call's context right after the call returns;
// the old client's per-call watcher goroutine could then close the
// connection it had already put back in the pool, and a later call failed
// with "use of closed network connection" (this pattern, run against the
// old proxy.LLM with the race detector's scheduling, failed 10 of 800
// calls). Calls here run back to back on kept-alive connections, each
// context cancelled the moment its call returns, 16 at once; every call
// must succeed on a first attempt, over few connections.
func TestCancelAfterReplyNeverBreaksPooledConnections(t *testing.T) {
	var conns atomic.Int64
	up := newUpstreamConns(t, func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}, func(_ int64, w http.ResponseWriter, _ []byte) { answer(w, "[SKIP]") })
	c := newClient(t, Options{BaseURL: up.URL, MaxConns: 2})
	var wg sync.WaitGroup
	errs := make(chan error, 3200)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := c.Extract(ctx, memory.ExtractRequest{Prompt: "p"})
				cancel()
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("call failed: %v", err)
	}
	if st := c.Stats(); st.Calls != 3200 || st.Retries != 0 || st.Failures != 0 {
		t.Fatalf("stats %+v", st)
	}
	if n := conns.Load(); n > 8 {
		t.Fatalf("%d connections for 3200 calls: cancelled calls spoiled the pool", n)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, bad := range []Options{{}, {BaseURL: "ftp://x"}, {BaseURL: "http://"}, {BaseURL: "http://h", Timeout: -1}} {
		if _, err := New(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	c, err := New(Options{BaseURL: "http://127.0.0.1:9/v1/"})
	if err != nil || c.endpoint != "http://127.0.0.1:9/v1/chat/completions" {
		t.Fatalf("endpoint %q, %v", c.endpoint, err)
	}
	// An unreachable upstream is an error, never a summary.
	if _, err := c.Summarize(context.Background(), memory.SummaryRequest{}); err == nil {
		t.Fatal("unreachable upstream gave a summary")
	}
}
