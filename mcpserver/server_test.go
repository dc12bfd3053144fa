package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/memory"
)

// fakeMemory answers Recall from a table keyed by tenant, session and user,
// and records the calls.
type fakeMemory struct {
	mu    sync.Mutex
	calls []string
	mems  map[string][]memory.RecalledMemory // "tenant/session/user"
	err   error
}

func (f *fakeMemory) Recall(_ context.Context, tenant, session, user, query string) (memory.RecallResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, tenant+"/"+session+"/"+user+"?"+query)
	if f.err != nil {
		return memory.RecallResult{}, f.err
	}
	if strings.TrimSpace(query) == "" {
		return memory.RecallResult{}, fmt.Errorf("%w: empty query", memory.ErrInvalid)
	}
	m, ok := f.mems[tenant+"/"+session+"/"+user]
	if !ok {
		return memory.RecallResult{}, fmt.Errorf("%w: %q", memory.ErrNotFound, session)
	}
	mode := "full"
	if len(f.calls) > 1 {
		mode = "reuse"
	}
	if len(m) == 0 {
		mode = "none"
	}
	return memory.RecallResult{Mode: mode, Memories: m}, nil
}

// serve runs s behind a fasthttp server on loopback the way the proxy
// mounts it: the bearer is the tenant, X-User-ID the end user.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/mcp" {
			ctx.SetStatusCode(404)
			return
		}
		tenant, _ := strings.CutPrefix(string(ctx.Request.Header.Peek("Authorization")), "Bearer ")
		s.Serve(context.Background(), ctx, Caller{Tenant: tenant, User: string(ctx.Request.Header.Peek("X-User-ID"))})
	}, MaxRequestBodySize: 8 << 20}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String() + "/mcp"
}

type headers struct {
	h    map[string]string
	next http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.h {
		r.Header.Set(k, v)
	}
	return h.next.RoundTrip(r)
}

// connect opens a session of the official Go client with the given
// headers.
func connect(t *testing.T, url string, hdr map[string]string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	hc := &http.Client{Transport: headers{hdr, http.DefaultTransport}}
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, args map[string]any) (*mcp.CallToolResult, recallOut) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "session_recall", Arguments: args})
	if err != nil {
		t.Fatalf("CallTool(%v): %v", args, err)
	}
	var out recallOut
	if !res.IsError {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("structured content %s: %v", b, err)
		}
	}
	return res, out
}

func errText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestSessionRecallThroughGoClient: the official Go client lists the tool
// and calls it; the recall runs for the tenant and end user of the HTTP
// request, whatever the arguments say, and answers the memories (cut to
// the bounds), the mode, and tool errors for unknown sessions and bad
// arguments.
func TestSessionRecallThroughGoClient(t *testing.T) {
	at := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	long := strings.Repeat("é", 1500) // 3000 bytes
	fm := &fakeMemory{mems: map[string][]memory.RecalledMemory{
		"key-a/s1/alice": {
			{ID: "f1", Role: "fact", Text: "Alice's dog is called Comet.", At: at},
			{ID: "abc|user|m3", Role: "user", Text: long, OtherSession: true},
			{ID: "f2", Role: "fact", Text: "third"},
		},
		"key-a/empty/": {},
	}}
	s, err := New(Options{Memory: fm, MaxMemories: 2, Version: "test", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, s)
	cs := connect(t, url, map[string]string{"Authorization": "Bearer key-a", "X-User-ID": "alice"})

	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 1 || tools.Tools[0].Name != "session_recall" {
		t.Fatalf("tools: %+v, %v", tools, err)
	}
	tl := tools.Tools[0]
	if tl.Annotations == nil || !tl.Annotations.ReadOnlyHint {
		t.Fatalf("session_recall not marked read-only: %+v", tl.Annotations)
	}
	schema, _ := json.Marshal(tl.InputSchema)
	for _, want := range []string{`"query"`, `"session_id"`, `"required":["query","session_id"]`} {
		if !strings.Contains(string(schema), want) {
			t.Fatalf("input schema %s lacks %s", schema, want)
		}
	}

	res, out := call(t, cs, map[string]any{"query": "dog name", "session_id": "s1"})
	if res.IsError || out.Mode != "full" || !out.FullRecall || len(out.Memories) != 2 {
		t.Fatalf("recall: %+v %+v", res, out)
	}
	m0, m1 := out.Memories[0], out.Memories[1]
	if m0.ID != "f1" || m0.Role != "fact" || m0.Text != "Alice's dog is called Comet." || m0.Date != "2025-05-01T12:00:00Z" || m0.OtherSession {
		t.Fatalf("first memory %+v", m0)
	}
	if !m1.OtherSession || m1.Date != "" || len(m1.Text) > 2000 || !strings.HasSuffix(m1.Text, "…") || !strings.HasPrefix(long, strings.TrimSuffix(m1.Text, "…")) {
		t.Fatalf("second memory: other %v, date %q, %d bytes", m1.OtherSession, m1.Date, len(m1.Text))
	}
	if _, out := call(t, cs, map[string]any{"query": "dog", "session_id": "s1"}); out.Mode != "reuse" || out.FullRecall {
		t.Fatalf("second recall %+v", out)
	}

	// Another end user, another key, no user: the same session id is
	// not found; the caller comes from the request.
	for _, hdr := range []map[string]string{
		{"Authorization": "Bearer key-a", "X-User-ID": "bob"},
		{"Authorization": "Bearer key-b", "X-User-ID": "alice"},
		{"Authorization": "Bearer key-a"},
	} {
		other := connect(t, url, hdr)
		res, _ := call(t, other, map[string]any{"query": "dog", "session_id": "s1"})
		if !res.IsError || !strings.Contains(errText(res), `no session "s1"`) {
			t.Fatalf("%v: %+v %s", hdr, res, errText(res))
		}
	}
	fm.mu.Lock()
	calls := strings.Join(fm.calls, "\n")
	fm.mu.Unlock()
	for _, want := range []string{"key-a/s1/bob?dog", "key-b/s1/alice?dog", "key-a/s1/?dog"} {
		if !strings.Contains(calls, want) {
			t.Fatalf("calls %s lack %s", calls, want)
		}
	}

	// Nothing matched; bad arguments.
	none := connect(t, url, map[string]string{"Authorization": "Bearer key-a"})
	if res, out := call(t, none, map[string]any{"query": "dog", "session_id": "empty"}); res.IsError || out.Mode != "none" || out.Memories == nil || len(out.Memories) != 0 {
		t.Fatalf("empty recall: %+v %+v", res, out)
	}
	for _, args := range []map[string]any{
		{"query": "dog"},
		{"query": "  ", "session_id": "s1"},
		{"query": 3, "session_id": "s1"},
		{"query": "dog", "session_id": "s1", "tenant": "key-b", "user": "bob"}, // the caller is not an argument
	} {
		if res, _ := call(t, cs, args); !res.IsError {
			t.Fatalf("%v: not an error: %+v", args, res)
		}
	}

	fm.err = errors.New("disk on fire")
	if res, _ := call(t, cs, map[string]any{"query": "dog", "session_id": "s1"}); !res.IsError || strings.Contains(errText(res), "fire") {
		t.Fatalf("internal error leaked or not reported: %s", errText(res))
	}
	st := s.Stats()
	if st.Full != 1 || st.Reuse != 1 || st.None != 1 || st.NotFound != 3 || st.Invalid != 1 || st.Errors != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTransportErrors: what is not an MCP POST is refused in the sidecar's
// error shape; an oversized body is 413; a request without a caller is
// 401.
func TestTransportErrors(t *testing.T) {
	// A long timeout: a request that waited for it would hang the test.
	s, err := New(Options{Memory: &fakeMemory{}, MaxBodyBytes: 1024, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, s)
	do := func(method, ct, body string, auth bool) (int, http.Header, string) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth {
			req.Header.Set("Authorization", "Bearer k")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	openAI := func(body string) bool {
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		return json.Unmarshal([]byte(body), &e) == nil && e.Error.Message != "" && e.Error.Type != "" && e.Error.Code != ""
	}
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	if code, h, body := do("POST", "application/json", init, true); code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "application/json") || !strings.Contains(body, `"serverInfo"`) {
		t.Fatalf("initialize: %d %v %s", code, h, body)
	}
	// A subscription stream is refused at once (a buffered answer could
	// only end at the timeout).
	listen := `{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true}}}`
	if code, _, body := do("POST", "application/json", listen, true); code != 200 || !strings.Contains(body, `"id":7`) || !strings.Contains(body, `-32601`) {
		t.Fatalf("subscriptions/listen: %d %s", code, body)
	}
	for _, c := range []struct {
		method, ct, body string
		auth             bool
		code             int
	}{
		{"GET", "", "", true, 405},
		{"DELETE", "", "", true, 405},
		{"POST", "text/plain", init, true, 415},
		{"POST", "application/json", strings.Replace(init, `"x"`, `"`+strings.Repeat("x", 2000)+`"`, 1), true, 413},
		{"POST", "application/json", init, false, 401},
	} {
		code, h, body := do(c.method, c.ct, c.body, c.auth)
		if code != c.code || !openAI(body) {
			t.Errorf("%s %s: %d %s, want %d in the OpenAI error shape", c.method, c.ct, code, body, c.code)
		}
		if code == 405 && h.Get("Allow") != "POST" {
			t.Errorf("405 without Allow: POST: %v", h)
		}
	}
}

// TestCut: texts are cut at a rune boundary within the bound.
func TestCut(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 16, "short"},
		{strings.Repeat("a", 20), 16, strings.Repeat("a", 13) + "…"},
		{strings.Repeat("é", 10), 16, strings.Repeat("é", 6) + "…"},
		{strings.Repeat("日", 10), 16, strings.Repeat("日", 4) + "…"},
	} {
		if got := cut(c.in, c.n); got != c.want || len(got) > c.n {
			t.Errorf("cut(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("New without Memory succeeded")
	}
	if _, err := New(Options{Memory: &fakeMemory{}, MaxTextBytes: 4}); err == nil {
		t.Fatal("MaxTextBytes 4 accepted")
	}
}

// TestConcurrentRecallsAndTurns: tool calls from several clients at once,
// while the session takes chat turns, on a real memory.Store (run with
// -race): every call answers, none fails.
func TestConcurrentRecallsAndTurns(t *testing.T) {
	st, err := memory.Open(memory.Options{Dir: t.TempDir(), Fsync: memory.FsyncNever})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	turn := func(text string) {
		tr, err := st.Prepare(context.Background(), memory.TurnRequest{Tenant: "k", SessionID: "s", UserID: "u",
			Mode: memory.ModeAppend, Messages: []memory.Message{memory.NewMessage("user", text)}})
		if err != nil {
			t.Error(err)
			return
		}
		if err := tr.Complete(memory.NewMessage("assistant", "noted")); err != nil {
			t.Error(err)
		}
	}
	turn("hello")
	for _, f := range []string{"The user's greyhound is called Comet.", "Comet loves the beach at Brighton.", "The user is allergic to walnuts."} {
		if _, err := st.AddMemory("k", "s", memory.CategoryFact, f, 1); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(Options{Memory: st})
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, s)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 10 {
			turn(fmt.Sprintf("turn %d: tell me about the greyhound", i))
		}
	})
	for range 4 {
		cs := connect(t, url, map[string]string{"Authorization": "Bearer k", "X-User-ID": "u"})
		wg.Go(func() {
			for range 10 {
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "session_recall",
					Arguments: map[string]any{"query": "What is my greyhound called?", "session_id": "s"}})
				if err != nil || res.IsError {
					t.Errorf("call: %v %+v", err, res)
					return
				}
			}
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Full+st.Reuse != 40 || st.Errors != 0 {
		t.Fatalf("stats %+v, want 40 recalls", st)
	}
}
