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

func maxTokensOf(t *testing.T, body string) int {
	t.Helper()
	var req struct {
		MaxTokens *int `json:"max_tokens"`
	}
	if err := json.Unmarshal([]byte(body), &req); err != nil || req.MaxTokens == nil {
		t.Fatalf("request without max_tokens: %s", body)
	}
	return *req.MaxTokens
}

// Issue 20: every call the sidecar makes on its own carries a max_tokens
// sized to what it expects back, so no call runs to the context limit.
func TestEveryCallKindSendsMaxTokens(t *testing.T) {
	up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ []byte) { answer(w, "A summary.\nFACT: x\n") })
	c := newClient(t, Options{BaseURL: up.URL})
	ctx := context.Background()
	if _, err := c.Summarize(ctx, memory.SummaryRequest{Messages: []memory.Message{memory.NewMessage("user", "hi")}}); err != nil {
		t.Fatal(err)
	}
	want := []int{SummaryMaxTokens}
	for kind, n := range map[string]int{"facts": FactsMaxTokens, "episode": EpisodeMaxTokens, "review": ReviewMaxTokens,
		"tool_context": ToolContextMaxTokens, "l4_merge": L4MergeMaxTokens, "something new": DefaultMaxTokens} {
		if _, err := c.Extract(ctx, memory.ExtractRequest{Kind: kind, Prompt: "p"}); err != nil {
			t.Fatal(err)
		}
		want = append(want, n)
	}
	if _, err := c.Complete(ctx, Call{User: "u"}); err != nil {
		t.Fatal(err)
	}
	want = append(want, DefaultMaxTokens)
	up.mu.Lock()
	defer up.mu.Unlock()
	got := []int{}
	for _, b := range up.bodies {
		got = append(got, maxTokensOf(t, b))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("max_tokens %v, want %v", got, want)
	}
	for _, n := range want {
		if n <= 0 || n > 512 {
			t.Fatalf("max_tokens %d: not a bound sized to a memory reply", n)
		}
	}
}

// A reply the engine cut at max_tokens (finish_reason "length") keeps only
// whole lines where replies are read line by line, fails where it must be
// whole, and is kept elsewhere; each is counted.
func TestTruncatedReplies(t *testing.T) {
	reply := "[ADD] The user likes tea.\n[ADD] The user has a"
	up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ []byte) {
		c, _ := json.Marshal(reply)
		fmt.Fprintf(w, `{"choices":[{"index":0,"finish_reason":"length","message":{"role":"assistant","content":%s}}]}`, c)
	})
	c := newClient(t, Options{BaseURL: up.URL})
	ctx := context.Background()
	if out, err := c.Extract(ctx, memory.ExtractRequest{Kind: "facts", Prompt: "p"}); err != nil || out != "[ADD] The user likes tea.\n" {
		t.Fatalf("facts: %q, %v", out, err)
	}
	if out, err := c.Extract(ctx, memory.ExtractRequest{Kind: "episode", Prompt: "p"}); err != nil || out != reply {
		t.Fatalf("episode: %q, %v", out, err)
	}
	if _, err := c.Extract(ctx, memory.ExtractRequest{Kind: "tool_context", Prompt: "p"}); !errors.Is(err, ErrTruncated) {
		t.Fatalf("tool context: %v", err)
	}
	if _, err := c.Extract(ctx, memory.ExtractRequest{Kind: "l4_merge", Prompt: "p"}); !errors.Is(err, ErrTruncated) {
		t.Fatalf("l4 merge: %v", err)
	}
	reply = "[ADD] one unfinished line"
	if _, err := c.Extract(ctx, memory.ExtractRequest{Kind: "facts", Prompt: "p"}); !errors.Is(err, ErrTruncated) {
		t.Fatalf("facts without a whole line: %v", err)
	}
	if st := c.Stats(); st.Truncated != 5 || st.Retries != 0 || up.n.Load() != 5 {
		t.Fatalf("stats %+v after %d calls", st, up.n.Load())
	}
}

// sse writes a chat completion stream of the words, finishing with
// finish and llama.cpp's timings.
func sse(w http.ResponseWriter, finish string, words ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, wd := range words {
		c, _ := json.Marshal(wd)
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"finish_reason\":null,\"delta\":{\"content\":%s}}]}\n\n", c)
	}
	fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"finish_reason\":%q,\"delta\":{}}],\"timings\":{\"cache_n\":3,\"prompt_n\":5,\"predicted_n\":%d}}\n\n", finish, len(words))
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// With Options.Stream the calls are streamed and the reply is read from
// the events; the router hears the timings; an error event is a failure
// retried once like a 5xx.
func TestStreamedCalls(t *testing.T) {
	up := newUpstream(t, func(n int64, w http.ResponseWriter, body []byte) {
		if !strings.Contains(string(body), `"stream":true`) {
			http.Error(w, "not streamed", 400)
			return
		}
		if n == 2 {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n")
			fmt.Fprint(w, "data: {\"error\":{\"code\":500,\"message\":\"The model produced output that does not match\",\"type\":\"server_error\"}}\n\n")
			return
		}
		sse(w, "stop", "[ADD] ", "The user ", "likes tea.")
	})
	var metas []string
	rt := &router{}
	c := newClient(t, Options{BaseURL: up.URL, Stream: true, Router: &metaRouter{router: rt, metas: &metas}})
	ctx := context.Background()
	out, err := c.Extract(ctx, memory.ExtractRequest{Kind: "facts", Prompt: "p"})
	if err != nil || out != "[ADD] The user likes tea." {
		t.Fatalf("streamed reply %q, %v", out, err)
	}
	if tm, ok := engine.ParseTimings([]byte(metas[0])); !ok || tm.PredictedN != 3 || tm.CacheN != 3 {
		t.Fatalf("router heard %q", metas[0])
	}
	// Second call: an error event, then a retry that succeeds.
	if out, err := c.Extract(ctx, memory.ExtractRequest{Kind: "facts", Prompt: "p"}); err != nil || out != "[ADD] The user likes tea." {
		t.Fatalf("after an error event: %q, %v", out, err)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if fmt.Sprint(rt.after) != "[200 500 200]" {
		t.Fatalf("router heard statuses %v", rt.after)
	}
	if st := c.Stats(); st.Retries != 1 || st.Failures != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// metaRouter is a router that also keeps the bodies After hears.
type metaRouter struct {
	*router
	metas *[]string
}

func (m *metaRouter) After(ctx context.Context, req *engine.Request, resp *engine.Response) {
	m.router.After(ctx, req, resp)
	m.router.mu.Lock()
	*m.metas = append(*m.metas, string(resp.Body))
	m.router.mu.Unlock()
}

// preemptRouter cancels each call's context with engine.ErrPreempted once
// the upstream holds it, as the llama.cpp connector does when a client
// needs the slot, for the first times calls; or answers ErrBusy.
type preemptRouter struct {
	mu      sync.Mutex
	times   int
	busy    bool
	cancels []context.CancelCauseFunc
	befores int
	afters  int
}

func (r *preemptRouter) Before(_ context.Context, req *engine.Request) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.befores++
	if r.busy {
		return nil, engine.ErrBusy
	}
	if req.Cancel == nil {
		panic("background request without Cancel")
	}
	r.cancels = append(r.cancels, req.Cancel)
	return req.Body, nil
}

func (r *preemptRouter) After(context.Context, *engine.Request, *engine.Response) {
	r.mu.Lock()
	r.afters++
	r.mu.Unlock()
}

// preempt cancels the newest call's context if it is one of the first
// times.
func (r *preemptRouter) preempt() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cancels) > r.times {
		return false
	}
	r.cancels[len(r.cancels)-1](engine.ErrPreempted)
	return true
}

// A call the router takes back for a client (its context cancelled with
// engine.ErrPreempted: the upstream sees its client go away) is sent again
// after a backoff, up to Options.Preemptions times; beyond that it is
// dropped and counted, and the caller gets an error (memory retries the
// work after a later turn).
func TestPreemptedCallsAreResentThenDropped(t *testing.T) {
	var (
		rt   atomic.Pointer[preemptRouter]
		gone atomic.Int64
		sent atomic.Int64
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		sent.Add(1)
		if rt.Load().preempt() {
			<-r.Context().Done() // generating until the client goes away
			gone.Add(1)
			return
		}
		answer(w, "[SKIP]")
	}))
	t.Cleanup(srv.Close)
	run := func(times, preemptions int) (string, error, Stats) {
		t.Helper()
		rt.Store(&preemptRouter{times: times})
		gone.Store(0)
		sent.Store(0)
		c := newClient(t, Options{BaseURL: srv.URL, Router: rt.Load(), Preemptions: preemptions, PreemptBackoff: time.Millisecond})
		out, err := c.Extract(context.Background(), memory.ExtractRequest{Kind: "facts", Prompt: "p"})
		r := rt.Load()
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.befores != r.afters {
			t.Errorf("%d Before, %d After", r.befores, r.afters)
		}
		return out, err, c.Stats()
	}
	// Preempted twice, then done: three attempts, one call, no failure.
	out, err, st := run(2, 0)
	if err != nil || out != "[SKIP]" || sent.Load() != 3 || st.Preempted != 2 || st.Dropped != 0 || st.Calls != 1 || st.Failures != 0 || st.Retries != 0 {
		t.Fatalf("preempted twice: %q, %v, %d sent, stats %+v", out, err, sent.Load(), st)
	}
	waitGone := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); gone.Load() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the upstream saw %d of %d preempted calls go away", gone.Load(), n)
			}
		}
	}
	waitGone(2)
	// Preempted every time: dropped after the first send and 2 resends.
	_, err, st = run(100, 0)
	if !errors.Is(err, engine.ErrPreempted) || sent.Load() != 3 || st.Preempted != 3 || st.Dropped != 1 || st.Failures != 1 {
		t.Fatalf("always preempted: %v, %d sent, stats %+v", err, sent.Load(), st)
	}
	waitGone(3)
	// Preemptions < 0: never resent.
	if _, err, st = run(100, -1); !errors.Is(err, engine.ErrPreempted) || sent.Load() != 1 || st.Dropped != 1 {
		t.Fatalf("no resends: %v, %d sent, stats %+v", err, sent.Load(), st)
	}
}

// A router that finds no slot before the attempt's deadline (ErrBusy)
// gets its After, and nothing is sent; the call fails without a retry.
func TestBusyRouterSendsNothing(t *testing.T) {
	up := newUpstream(t, func(_ int64, w http.ResponseWriter, _ []byte) { answer(w, "x") })
	rt := &preemptRouter{busy: true}
	c := newClient(t, Options{BaseURL: up.URL, Router: rt})
	if _, err := c.Extract(context.Background(), memory.ExtractRequest{Kind: "facts", Prompt: "p"}); !errors.Is(err, engine.ErrBusy) {
		t.Fatalf("busy router: %v", err)
	}
	if up.n.Load() != 0 || rt.befores != 1 || rt.afters != 1 {
		t.Fatalf("%d sent, %d Before, %d After", up.n.Load(), rt.befores, rt.afters)
	}
	if st := c.Stats(); st.Failures != 1 || st.Retries != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Calls are replayable: one that meets a kept-alive connection the
// upstream closed without reading it (as llama-server and uvicorn do after
// 5 s idle) is sent again on a fresh connection by net/http, and is not a
// failure the client must retry.
func TestCallsReplayOnAClosedConnection(t *testing.T) {
	var conns atomic.Int64
	up := newUpstreamConns(t, func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}, func(n int64, w http.ResponseWriter, _ []byte) {
		if n == 2 { // the second call comes on the first's connection
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		answer(w, "ok")
	})
	c := newClient(t, Options{BaseURL: up.URL})
	for range 2 {
		if _, err := c.Complete(context.Background(), Call{User: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.Retries != 0 || st.Failures != 0 || up.n.Load() != 3 || conns.Load() != 2 {
		t.Fatalf("stats %+v, %d requests on %d connections", st, up.n.Load(), conns.Load())
	}
}
