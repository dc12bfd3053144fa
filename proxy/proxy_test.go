package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
	"github.com/valyala/fasthttp"
)

// startSidecar serves a Server for upstreamURL on a loopback port and returns
// its base URL. The server is shut down when the test ends.
func startSidecar(t *testing.T, upstreamURL string, mod func(*Options)) (string, *Server) {
	t.Helper()
	// Scripted upstreams answer chat only: no context probes unless a
	// test turns them on.
	o := Options{Upstream: upstreamURL, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoContextProbe: true}
	// make test runs the package once more with the event loop on, as
	// the binary ships it: every test here then goes through the loop
	// where it serves the request.
	o.EventLoop = os.Getenv("SIDECAR_TEST_EVENT_LOOP") != ""
	if mod != nil {
		mod(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	// The sidecar's /metrics is on the admin listener (package admin,
	// which imports nothing of this one's tests): here a listener of the
	// test's own serves it through the front door, as the admin one does.
	ops := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		done := s.CountRequest() // counted as the admin listener counts
		if string(ctx.Path()) != "/metrics" {
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			done("not_found", fasthttp.StatusNotFound)
			return
		}
		ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
		s.Metrics().WritePrometheus(ctx)
		done("metrics", fasthttp.StatusOK)
	}}
	serveOps := func(aln net.Listener) error {
		_ = ops.Serve(s.FrontListener(aln)) // the test's own: ended by closing aln
		return nil
	}
	base := sidecartest.ServeSidecar(t, s.Serve, serveOps, func(ctx context.Context) {
		_ = s.Shutdown(ctx)
		_ = ops.ShutdownWithContext(ctx)
	})
	return base, s
}

// The helpers the proxy and admin tests share (package sidecartest).
var (
	// adminURL is the metrics listener of the server startSidecar started
	// at a base URL: /metrics lives there, as on the sidecar's admin
	// listener.
	adminURL        = sidecartest.AdminURL
	noPoolClient    = sidecartest.NoPoolClient
	post            = sidecartest.Post
	postWith        = sidecartest.PostWith
	wantOpenAIError = sidecartest.WantOpenAIError
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

func TestProxyPassesRequestAndResponseUnchanged(t *testing.T) {
	type seen struct {
		method, uri, body string
		hdr               http.Header
	}
	got := make(chan seen, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, string(b), r.Header.Clone()}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream", "yes")
		w.Header().Set("Connection", "X-Secret-Hop")
		w.Header().Set("X-Secret-Hop", "must not pass")
		w.Header().Set("Keep-Alive", "timeout=5")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[]}`)
	}))
	defer up.Close()
	base, _ := startSidecar(t, up.URL+"/v1", nil) // a trailing /v1 is not doubled

	body := `{"model":"m", "messages":[{"role":"user","content":"héllo"}], "extra":{"kept":true}}`
	resp, b := postWith(t, http.DefaultClient, base+"/v1/chat/completions?x=1&y=%2F", body, map[string]string{
		"Authorization":   "Bearer sk-abc",
		"X-Custom":        "c",
		"Connection":      "X-Hop-Req",
		"X-Hop-Req":       "drop me",
		"Te":              "trailers",
		"Accept-Encoding": "identity",
	})
	if resp.StatusCode != 200 || string(b) != `{"id":"c1","object":"chat.completion","choices":[]}` {
		t.Fatalf("response %d %q", resp.StatusCode, b)
	}
	if resp.Header.Get("X-Upstream") != "yes" || resp.Header.Get("X-Secret-Hop") != "" || resp.Header.Get("Keep-Alive") != "" {
		t.Fatalf("response headers not filtered: %v", resp.Header)
	}
	s := <-got
	if s.method != "POST" || s.uri != "/v1/chat/completions?x=1&y=%2F" || s.body != body {
		t.Fatalf("upstream saw %s %s %q", s.method, s.uri, s.body)
	}
	if s.hdr.Get("Authorization") != "Bearer sk-abc" || s.hdr.Get("X-Custom") != "c" || s.hdr.Get("Accept-Encoding") != "identity" {
		t.Fatalf("end-to-end headers lost: %v", s.hdr)
	}
	if s.hdr.Get("X-Hop-Req") != "" || s.hdr.Get("Te") != "" {
		t.Fatalf("hop-by-hop headers forwarded: %v", s.hdr)
	}
}

func TestProxyPassesOtherV1RoutesAndUpstreamErrors(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		case "/v1/files/abc":
			if r.Method != http.MethodDelete {
				t.Errorf("method %s", r.Method)
			}
			fmt.Fprint(w, `{"deleted":true}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"error":{"message":"slow down","type":"rate_limit","code":"rl"}}`)
		}
	}))
	defer up.Close()
	base, _ := startSidecar(t, up.URL, nil)

	resp, err := noPoolClient.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"m"`) {
		t.Fatalf("models: %d %s", resp.StatusCode, b)
	}
	// HEAD: the upstream's Content-Length describes a body that never comes.
	req, _ := http.NewRequest(http.MethodHead, base+"/v1/models", nil)
	resp, err = noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != int64(len(`{"object":"list","data":[{"id":"m","object":"model"}]}`)) {
		t.Fatalf("HEAD models: %d, length %d", resp.StatusCode, resp.ContentLength)
	}
	// The pooled upstream connection is still usable after a HEAD.
	resp, err = noPoolClient.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"m"`) {
		t.Fatalf("models after HEAD: %d %s", resp.StatusCode, b)
	}
	req, _ = http.NewRequest(http.MethodDelete, base+"/v1/files/abc", nil)
	resp, err = noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"deleted":true}` {
		t.Fatalf("passthrough: %d %s", resp.StatusCode, b)
	}
	resp, b = post(t, base+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 429 || string(b) != `{"error":{"message":"slow down","type":"rate_limit","code":"rl"}}` {
		t.Fatalf("upstream error not passed through: %d %s", resp.StatusCode, b)
	}
}

func TestProxyRejectsBadRequests(t *testing.T) {
	var calls sync.WaitGroup
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1) // must never happen
		t.Errorf("upstream called for %s", r.URL.Path)
	}))
	defer up.Close()
	base, _ := startSidecar(t, up.URL, func(o *Options) { o.MaxBodyBytes = 1 << 10 })

	cases := []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		code             string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"messages": [`, nil, 400, "invalid_request"},
		{"not an object", "/v1/chat/completions", `[1,2]`, nil, 400, "invalid_request"},
		{"empty body", "/v1/chat/completions", ``, nil, 400, "invalid_request"},
		{"no messages", "/v1/chat/completions", `{"model":"m"}`, nil, 400, "invalid_request"},
		{"wrong stream type", "/v1/chat/completions", `{"messages":[],"stream":"yes"}`, nil, 400, "invalid_request"},
		{"no prompt", "/v1/completions", `{"model":"m"}`, nil, 400, "invalid_request"},
		{"no input", "/v1/embeddings", `{"model":"m"}`, nil, 400, "invalid_request"},
		{"body too large", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 2<<10) + `"}]}`, nil, 413, "body_too_large"},
		{"control chars in session id", "/v1/chat/completions", chatBody, map[string]string{"X-Session-ID": "a\tb"}, 400, "invalid_session_id"},
		{"session id too long", "/v1/chat/completions", `{"messages":[],"prompt_cache_key":"` + strings.Repeat("k", 300) + `"}`, nil, 400, "invalid_session_id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := post(t, base+c.path, c.body, c.hdr)
			wantOpenAIError(t, resp, b, c.status, c.code)
		})
	}
}

// TestProxySurvivesDeeplyNestedBodies: a body of eight million '[' (or
// of '{"a":' pairs) within the body limit is refused with a 400, and the
// sidecar goes on serving. A recursive JSON check ran out of stack on it:
// a fatal error that took the whole process down.
func TestProxySurvivesDeeplyNestedBodies(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	}))
	defer up.Close()
	base, _ := startSidecar(t, up.URL, nil)
	for _, open := range []string{"[", `{"a":`} {
		body := `{"model":"m","messages":` + strings.Repeat(open, (8<<20)/len(open))
		resp, b := post(t, base+"/v1/chat/completions", body, nil)
		wantOpenAIError(t, resp, b, 400, "invalid_request")
	}
	resp, b := post(t, base+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("after the nested bodies: %d %s", resp.StatusCode, b)
	}
}

func TestProxyUpstreamUnreachableIs502(t *testing.T) {
	dead := "http://" + refusedAddr(t) // nothing listens there, nor will while the test runs
	base, s := startSidecar(t, dead, nil)
	resp, b := post(t, base+"/v1/chat/completions", chatBody, nil)
	wantOpenAIError(t, resp, b, 502, "upstream_unreachable")

	r2, err := noPoolClient.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(r2.Body)
	r2.Body.Close()
	wantOpenAIError(t, r2, b, 503, "upstream_not_ready")
	if n := s.Metrics().requestCount("chat_completions", 502); n != 1 {
		t.Fatalf("metrics count %d 502s, want 1", n)
	}
}

func TestProxyUpstreamTimeoutIs504(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer up.Close()
	defer close(release)
	base, _ := startSidecar(t, up.URL, func(o *Options) { o.UpstreamTimeout = 200 * time.Millisecond })
	resp, b := post(t, base+"/v1/chat/completions", chatBody, nil)
	wantOpenAIError(t, resp, b, 504, "upstream_timeout")
}

func TestProxyHealthReadyMetrics(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[]}`)
	}))
	defer up.Close()
	base, _ := startSidecar(t, up.URL, nil)
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := noPoolClient.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s = %d", p, resp.StatusCode)
		}
	}
	post(t, base+"/v1/chat/completions", chatBody, nil)
	post(t, base+"/v1/chat/completions", `{`, nil)
	resp, err := noPoolClient.Get(adminURL(t, base) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := string(b)
	for _, want := range []string{
		`sidecar_http_requests_total{route="chat_completions",code="200"} 1`,
		`sidecar_http_requests_total{route="chat_completions",code="400"} 1`,
		`sidecar_http_request_duration_seconds_count{route="chat_completions"} 2`,
		`sidecar_http_ttfb_seconds_count{route="chat_completions"} 1`,
		`sidecar_http_in_flight_requests 1`, // the scrape itself
		`sidecar_upstream_errors_total{kind="timeout"} 0`,
		`process_resident_memory_bytes `,
		`sidecar_http_request_bytes_total `,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	for line := range strings.Lines(m) {
		if f, ok := strings.CutPrefix(line, "# HELP "); ok && !strings.Contains(strings.TrimSpace(f), " ") {
			t.Errorf("a family without help: %q", line) // promtool check metrics refuses it
		}
	}
	if t.Failed() {
		t.Log(m)
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	for _, c := range []struct {
		stream bool
		// late: the client leaves after the server's read timeout
		// passed during the upstream's wait (the check peeks at a socket
		// whose read deadline has passed).
		late bool
	}{{false, false}, {true, false}, {false, true}} {
		stream := c.stream
		t.Run(fmt.Sprintf("stream=%v,late=%v", stream, c.late), func(t *testing.T) {
			started := make(chan struct{})
			cancelled := make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body) // lets net/http notice the connection closing
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: {\"n\":1}\n\n")
					w.(http.Flusher).Flush()
				}
				close(started)
				select {
				case <-r.Context().Done():
					close(cancelled)
				case <-time.After(10 * time.Second):
					t.Error("upstream request was not cancelled")
				}
			}))
			defer up.Close()
			readTimeout := time.Duration(0) // the default
			if c.late {
				readTimeout = 200 * time.Millisecond
			}
			base, s := startSidecar(t, up.URL, func(o *Options) { o.ReadTimeout = readTimeout })

			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
				strings.NewReader(`{"messages":[],"stream":true}`))
			errc := make(chan error, 1)
			headers := make(chan struct{})
			go func() {
				resp, err := noPoolClient.Do(req)
				if err == nil {
					close(headers)
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				errc <- err
			}()
			<-started
			if stream { // cancel after the response headers reached the client
				select {
				case <-headers:
				case err := <-errc:
					t.Fatalf("stream failed before its headers: %v", err)
				}
			}
			if c.late {
				time.Sleep(3 * readTimeout)
			}
			cancel()
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("upstream never saw the cancellation")
			}
			if err := <-errc; err == nil {
				t.Fatal("client request should have failed after cancel")
			}
			waitFor(t, s, func() bool { return s.metrics.disconnects.Load() >= 1 })
		})
	}
}

// waitFor checks cond once s is idle (waitIdle): for effects that land
// after a response, such as a partial reply recorded or the engine's
// after-hook.
func waitFor(t *testing.T, s *Server, cond func() bool) {
	t.Helper()
	s.waitIdle()
	if !cond() {
		t.Fatal("condition not met once the server was idle")
	}
}

// eventually polls cond for up to 10 s: only for package memory's own
// background work (extraction, the reviewer, cross-session indexing),
// which has no hook outside package memory. The proxy's own after-response
// work is waited for with waitFor.
var eventually = sidecartest.Eventually

// waitIdle returns once no request is in flight and no after-response work
// (recording a partial reply, the engine's after-hook and settle, a fleet
// lease's release) runs: the explicit hook tests wait on instead of
// polling.
func (s *Server) waitIdle() {
	s.quiet.wait(func() bool { return s.metrics.inFlight.Load() == 0 && s.bg.running.Load() == 0 })
}

// readEvent reads one SSE event (up to its blank line) from br.
func readEvent(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\n" || line == "\r\n" {
			return b.String(), nil
		}
	}
}

func TestBgTasksWaitThenRunInline(t *testing.T) {
	var b bgTasks
	release := make(chan struct{})
	var order []string
	var mu sync.Mutex
	b.run(func() { <-release; mu.Lock(); order = append(order, "bg"); mu.Unlock() })
	done := make(chan struct{})
	go func() { b.closeAndWait(); close(done) }()
	select {
	case <-done:
		t.Fatal("closeAndWait returned with work still running")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-done
	ran := false
	b.run(func() { ran = true }) // after close: inline, before run returns
	if !ran || len(order) != 1 {
		t.Fatalf("inline run %v, background runs %v", ran, order)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// refusedAddr is a loopback address where connections are refused until
// the test ends: its port is held, so no other test's listener takes it
// (a port closed again may be reused at once and answer 404).
func refusedAddr(t *testing.T) string {
	t.Helper()
	addr, closeFn, err := launch.RefusedAddr()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeFn)
	return addr
}
