package admin

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// newEngineShaped is a scripted llama.cpp-shaped upstream: its page at /,
// its own /metrics, and its 404 for every other path.
func newEngineShaped(t *testing.T) *httptest.Server {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		switch r.Method + " " + r.URL.Path {
		case "GET /":
			h.Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, "<!doctype html><title>llama.cpp</title><div id=app></div>")
		case "GET /metrics":
			h.Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = io.WriteString(w, "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 42\n")
		default:
			h.Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`)
		}
	}))
	t.Cleanup(e.Close)
	return e
}

// TestOwnSurfaceOnTheAdminListener: /metrics, the console and its API are
// on the admin listener only; on the main port /metrics is the engine's;
// /healthz and /readyz answer on both; the sidecar's client APIs keep
// their paths and are never forwarded.
func TestOwnSurfaceOnTheAdminListener(t *testing.T) {
	e := newEngineShaped(t)
	base, _ := startSidecar(t, e.URL, func(o *sidecarOptions) { o.AdminToken = testAdminToken })
	admin := adminURL(t, base)
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := noPoolClient.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := get(base + "/metrics"); code != 200 || !strings.Contains(b, "llamacpp:prompt_tokens_total 42") || strings.Contains(b, "sidecar_") {
		t.Fatalf("main /metrics: %d %q", code, b)
	}
	if code, b := get(admin + "/metrics"); code != 200 || !strings.Contains(b, "sidecar_http_requests_total") || strings.Contains(b, "llamacpp:") {
		t.Fatalf("admin /metrics: %d %.200q", code, b)
	}
	if code, b := get(base + "/"); code != 200 || !strings.Contains(b, "llama.cpp") {
		t.Fatalf("main /: %d %q", code, b)
	}
	if code, b := get(base + "/ui/"); code != 404 || !strings.Contains(b, "File Not Found") {
		t.Fatalf("main /ui/ is the engine's: %d %q", code, b)
	}
	if code, _ := get(admin + "/ui/"); code != 200 {
		t.Fatalf("admin /ui/: %d", code)
	}
	for _, u := range []string{base, admin} {
		if code, b := get(u + "/healthz"); code != 200 || !strings.Contains(b, "ok") {
			t.Fatalf("%s/healthz: %d %s", u, code, b)
		}
	}
	if code, _ := get(admin + "/v1/models"); code != 404 {
		t.Fatalf("the admin listener forwards: %d", code)
	}
	if code, b := get(admin + "/debug/pprof/"); code != 404 {
		t.Fatalf("pprof without Options.Pprof: %d %.100s", code, b)
	}
	// The client APIs stay the sidecar's: never forwarded.
	if code, b := get(base + "/v1/sessions/s1"); code != 404 || !strings.Contains(b, "memory_disabled") {
		t.Fatalf("/v1/sessions/s1: %d %s", code, b)
	}
}

// TestAdminListenerFrontDoor: the admin listener reads its requests
// through the proxy's strict front door: a request whose framing servers
// read differently is refused before any handler acts, and counted.
func TestAdminListenerFrontDoor(t *testing.T) {
	base, _ := startSidecar(t, "http://127.0.0.1:1", func(o *sidecarOptions) { o.AdminToken = testAdminToken })
	addr := strings.TrimPrefix(adminURL(t, base), "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "POST /admin/v1/tenants HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !resp.Close || !strings.Contains(string(b), `"error"`) {
		t.Fatalf("ambiguous framing on the admin listener: %d close=%v %s", resp.StatusCode, resp.Close, b)
	}
	r, err := noPoolClient.Get(adminURL(t, base) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(m), `sidecar_http_requests_total{route="not_found",code="400"} 1`) {
		t.Fatalf("the refusal is not counted:\n%s", m)
	}
}

// TestAdminPprof: /debug/pprof answers only with Options.Pprof.
func TestAdminPprof(t *testing.T) {
	base, _ := startSidecar(t, "http://127.0.0.1:1", func(o *sidecarOptions) { o.Pprof = true })
	r, err := noPoolClient.Get(adminURL(t, base) + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 200 || !strings.Contains(string(b), "goroutine") {
		t.Fatalf("/debug/pprof/goroutine with Pprof: %d %.200s", r.StatusCode, b)
	}
}
