package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/histogram"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/proxy"
)

// The admin listener's tests run it as the sidecar does (cmd/sidecar
// wires the two): a proxy.Server on a main listener and a Server on an
// admin listener, reading its requests through the proxy's front door.

// sidecarOptions are a test sidecar's: the proxy's, and the admin
// listener's console options beside them.
type sidecarOptions struct {
	proxy.Options
	AdminToken         string
	Pprof              bool
	Knowledge          Knowledge
	RESP               RESP
	ConsoleSampleEvery time.Duration
}

// startSidecar serves a proxy for upstreamURL and its admin listener on
// loopback ports and returns the main listener's base URL (adminURL gives
// the admin listener's) and the proxy. Both are shut down when the test
// ends.
func startSidecar(t *testing.T, upstreamURL string, mod func(*sidecarOptions)) (string, *proxy.Server) {
	t.Helper()
	o := sidecarOptions{Options: proxy.Options{Upstream: upstreamURL, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoContextProbe: true}}
	o.EventLoop = os.Getenv("SIDECAR_TEST_EVENT_LOOP") != ""
	if mod != nil {
		mod(&o)
	}
	var win *Windows
	if o.AdminToken != "" {
		win = NewWindows(ConsoleWindows)
		o.Windows = win
	}
	px, err := proxy.New(o.Options)
	if err != nil {
		t.Fatal(err)
	}
	ao := Options{Token: o.AdminToken, Pprof: o.Pprof, SampleEvery: o.ConsoleSampleEvery, Logger: o.Logger,
		Front: px, Health: px, Metrics: px.Metrics(), Sessions: px, Windows: win, Knowledge: o.Knowledge, RESP: o.RESP}
	if m, ok := o.Memory.(Memory); ok {
		ao.Memory = m
	}
	if o.KV != nil {
		ao.KV = o.KV
	}
	if h := engine.Wrap(o.Engine); h != nil {
		ao.Engine = h
	}
	adm, err := New(ao)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	adminURLs.Store(base, "http://"+aln.Addr().String())
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		if err := px.Serve(ln); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		if err := adm.Serve(aln); err != nil {
			t.Errorf("serve admin: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = px.Shutdown(ctx)
		_ = adm.Shutdown(ctx)
		<-done
		<-done
		adminURLs.Delete(base)
	})
	return base, px
}

// adminURLs maps a test sidecar's base URL to its admin listener's.
var adminURLs sync.Map

// adminURL is the admin listener of the sidecar startSidecar started at
// base.
func adminURL(t *testing.T, base string) string {
	t.Helper()
	a, ok := adminURLs.Load(base)
	if !ok {
		t.Fatalf("no admin listener for %s", base)
	}
	return a.(string)
}

// noPoolClient never reuses connections, so each test request stands alone.
var noPoolClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}

func post(t *testing.T, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, b
}

func getJSON(t *testing.T, url, key string, v any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v in %s", url, err, b)
		}
	}
	return resp.StatusCode
}

// wantOpenAIError checks that b is an OpenAI error envelope with code.
func wantOpenAIError(t *testing.T, resp *http.Response, b []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d (body %s)", resp.StatusCode, status, b)
	}
	var e struct {
		Error struct {
			Message, Type, Code string
		}
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body is not JSON: %q", b)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code != code {
		t.Fatalf("error = %+v, want code %q and a message", e.Error, code)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type = %q", ct)
	}
}

// eventually polls cond for up to 10 s: for what lands after a response
// (a reply recorded, package memory's background work).
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}

// tenantOf is the tenant the proxy derives from an Authorization header
// (package proxy's session.go): "t_" and the first 8 bytes of the
// bearer token's SHA-256 in hex.
func tenantOf(authorization []byte) string {
	tok := strings.TrimSpace(string(authorization))
	if len(tok) >= 6 && strings.EqualFold(tok[:6], "bearer") && (len(tok) == 6 || tok[6] == ' ') {
		tok = strings.TrimSpace(tok[6:])
	}
	if tok == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(tok))
	return "t_" + hex.EncodeToString(sum[:8])
}

// recordingUpstream answers chat completions with "echo: " and the last
// message, streamed or not.
type recordingUpstream struct {
	*httptest.Server
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	u := &recordingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream   bool            `json:"stream"`
			Messages json.RawMessage `json:"messages"`
		}
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
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

func openMemory(t *testing.T, o memory.Options) *memory.Store {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	st, err := memory.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// fakeSessions is a Sessions whose window counters the test sets.
type fakeSessions struct {
	mu                          sync.Mutex
	turns, windowTokens, limits uint64
	recall                      []time.Duration
}

func (f *fakeSessions) DeleteSession(context.Context, string, string) error { return nil }

func (f *fakeSessions) WindowCounters() (turns, windowTokens, windowLimit uint64, recall histogram.Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h histogram.Histogram
	for _, d := range f.recall {
		h.Observe(d)
	}
	return f.turns, f.windowTokens, f.limits, h.Snapshot()
}
