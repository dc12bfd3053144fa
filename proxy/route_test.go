package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// rawRequest sends one request exactly as written (no client-side path
// cleaning) and returns the status and body.
func rawRequest(t *testing.T, base, method, target string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\nContent-Length: %d\r\n", method, target, len(body))
	for k, v := range hdr {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(rb)
}

// targetRecorder is an upstream that records every request target it gets.
type targetRecorder struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string
}

func newTargetRecorder(t *testing.T) *targetRecorder {
	u := &targetRecorder{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen = append(u.seen, r.Method+" "+r.RequestURI+" auth="+r.Header.Get("Authorization"))
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/chat/completions" {
			fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
			return
		}
		fmt.Fprint(w, `{"object":"list","data":[]}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *targetRecorder) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.seen
	u.seen = nil
	return s
}

func stateServer(t *testing.T, upstream string, mod func(*Options)) string {
	t.Helper()
	c, err := kv.Open(kv.Options{Store: tiers.Options{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	st := openMemory(t, memory.Options{})
	base, _ := startSidecar(t, upstream, func(o *Options) {
		o.Memory, o.KV = st, c
		if mod != nil {
			mod(o)
		}
	})
	return base
}

// Issue 12 row 5: routing read the normalised path while the KV and
// session handlers read the raw one, so sidecar routes with dot segments
// or escapes went to the upstream with the client's Authorization, and a
// session named ".." could never be read or deleted.
func TestSidecarRoutesAreNeverForwarded(t *testing.T) {
	up := newTargetRecorder(t)
	base := stateServer(t, up.URL, nil)
	auth := map[string]string{"Authorization": "Bearer secret-key", "X-KV-Dtype": "f16"}

	for _, target := range []string{
		"/v1/kv/%2e%2e/key",
		"/v1/kv/ns/../../etc/passwd",
		"/v1/kv/ns/./key",
		"/v1/kv/%2E/key",
		"/v1/kv",
		"/v1/kv/",
		"/v1//kv/ns/key",
		"/v1/x/../kv/ns/key",
		"/v1/%6Bv/ns/../key",
		"/v1/kv%2Fns/key",
		"/v1/sessions/../../etc/passwd",
		"/v1/sessions/",
		"/v1/sessions?after=x", // the list: GET 400 (no such session), the others 405
		"/v1/./sessions/abc",
		"/v1/pool/../x",
		"/v1/pool%2F..%2Fx",
		"/v1/../../etc/passwd",
		"/v1/models/../../admin",
		"/v1/%2e%2e/etc/passwd",
		"/v1/models/%zz",
		"/v1/models/%",
		"/v1/models/%4",
		"http://evil.example/v1/kv/ns/../key",
	} {
		for _, method := range []string{"PUT", "GET", "DELETE", "HEAD"} {
			status, body := rawRequest(t, base, method, target, auth, "ab")
			if status < 400 || status >= 500 {
				t.Errorf("%s %s: %d %s, want a 4xx", method, target, status, body)
			}
		}
		if seen := up.take(); len(seen) > 0 {
			t.Errorf("%s reached the upstream: %q", target, seen)
		}
	}

	// Ordinary routes still pass, with their query, exactly as sent.
	if status, _ := rawRequest(t, base, "GET", "/v1/models?limit=2&x=%2F", auth, ""); status != 200 {
		t.Fatalf("models: %d", status)
	}
	if status, _ := rawRequest(t, base, "GET", "/v1/models/org%2Fname", auth, ""); status != 200 {
		t.Fatalf("escaped model name: %d", status)
	}
	if status, _ := rawRequest(t, base, "GET", "http://elsewhere.example/v1/models", auth, ""); status != 200 {
		t.Fatalf("absolute-form target: %d", status)
	}
	want := []string{
		"GET /v1/models?limit=2&x=%2F auth=Bearer secret-key",
		"GET /v1/models/org%2Fname auth=Bearer secret-key",
		"GET /v1/models auth=Bearer secret-key",
	}
	if got := up.take(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("upstream saw\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A KV key reads the same however its segments are escaped.
	if status, body := rawRequest(t, base, "PUT", "/v1/kv/ns/a/b", auth, "abcd"); status != 201 {
		t.Fatalf("put: %d %s", status, body)
	}
	if status, body := rawRequest(t, base, "GET", "/v1/kv/n%73/a%2Fb", auth, ""); status != 200 || body != "abcd" {
		t.Fatalf("get escaped: %d %q", status, body)
	}
}

// Issue 12 row 5: a session id accepted through X-Session-ID can be read
// and deleted by its own name, dots included.
func TestSessionNamedDotsIsReadableAndDeletable(t *testing.T) {
	up := newTargetRecorder(t)
	base := stateServer(t, up.URL, nil)
	for _, id := range []string{"..", "."} {
		hdr := map[string]string{"Authorization": "Bearer k", "X-Session-ID": id}
		if status, body := rawRequest(t, base, "POST", "/v1/chat/completions", hdr, chatBody); status != 200 {
			t.Fatalf("chat in session %q: %d %s", id, status, body)
		}
		esc := strings.ReplaceAll(id, ".", "%2E")
		for _, target := range []string{"/v1/sessions/" + id, "/v1/sessions/" + esc, "/v1/sessions/" + id + "/memory"} {
			var status int
			var body string
			// No waiting: a complete reply is recorded before the response.
			status, body = rawRequest(t, base, "GET", target, hdr, "")
			if status != 200 || !strings.HasSuffix(target, "/memory") && !strings.Contains(body, `"ok"`) {
				t.Fatalf("GET %s: %d %s", target, status, body)
			}
			if !strings.Contains(body, fmt.Sprintf(`%q`, id)) && !strings.HasSuffix(target, "/memory") {
				t.Fatalf("GET %s: %s", target, body)
			}
		}
		if status, body := rawRequest(t, base, "DELETE", "/v1/sessions/"+id, hdr, ""); status != 200 || !strings.Contains(body, `"deleted":true`) {
			t.Fatalf("DELETE session %q: %d %s", id, status, body)
		}
		if status, _ := rawRequest(t, base, "GET", "/v1/sessions/"+esc, hdr, ""); status != 404 {
			t.Fatalf("deleted session %q answers %d", id, status)
		}
	}
	for _, s := range up.take() {
		if !strings.HasPrefix(s, "POST /v1/chat/completions ") {
			t.Fatalf("upstream got %s", s)
		}
	}
}

// Issue 12 row 7: requests without a bearer token (no header, an empty
// one, "Bearer" alone) shared one tenant, so any unauthenticated client
// read or deleted another's sessions, pool and KV. They get no state now.
func TestAnonymousRequestsShareNoState(t *testing.T) {
	up := newTargetRecorder(t)
	base := stateServer(t, up.URL, nil)
	anons := []map[string]string{{}, {"Authorization": ""}, {"Authorization": "Bearer"}, {"Authorization": "Bearer   "}}

	// Chat with a session id and no key: answered, but nothing is kept.
	for _, h := range anons {
		hdr := map[string]string{"X-Session-ID": "shared"}
		for k, v := range h {
			hdr[k] = v
		}
		if status, body := rawRequest(t, base, "POST", "/v1/chat/completions", hdr, chatBody); status != 200 {
			t.Fatalf("anonymous chat: %d %s", status, body)
		}
	}
	for _, h := range anons {
		for _, c := range []struct{ method, target, body string }{
			{"GET", "/v1/sessions/shared", ""},
			{"GET", "/v1/sessions/shared/memory", ""},
			{"DELETE", "/v1/sessions/shared", ""},
			{"GET", "/v1/pool", ""},
			{"PUT", "/v1/pool/k", `{"value":1}`},
			{"GET", "/v1/pool/k", ""},
			{"DELETE", "/v1/pool/k", ""},
			{"PUT", "/v1/kv/ns/k", "ab"},
			{"GET", "/v1/kv/ns/k", ""},
			{"HEAD", "/v1/kv/ns/k", ""},
			{"DELETE", "/v1/kv/ns/k", ""},
		} {
			status, body := rawRequest(t, base, c.method, c.target, h, c.body)
			if status != 401 || c.method != "HEAD" && !strings.Contains(body, `"code":"missing_api_key"`) {
				t.Errorf("anonymous (%q) %s %s: %d %s, want 401 missing_api_key", h["Authorization"], c.method, c.target, status, body)
			}
		}
	}
	// No key's tenant holds the anonymous session either.
	if status, _ := rawRequest(t, base, "GET", "/v1/sessions/shared", map[string]string{"Authorization": "Bearer anonymous"}, ""); status != 404 {
		t.Fatalf("anonymous chat left a session: %d", status)
	}
}

// With AllowAnonymous, requests without a key share the one tenant
// "anonymous", as documented.
func TestAllowAnonymousSharesOneTenant(t *testing.T) {
	up := newTargetRecorder(t)
	base := stateServer(t, up.URL, func(o *Options) { o.AllowAnonymous = true })
	if status, _ := rawRequest(t, base, "POST", "/v1/chat/completions", map[string]string{"X-Session-ID": "open"}, chatBody); status != 200 {
		t.Fatal(status)
	}
	if status, body := rawRequest(t, base, "GET", "/v1/sessions/open", map[string]string{"Authorization": "Bearer"}, ""); status != 200 || !strings.Contains(body, `"ok"`) {
		t.Fatalf("anonymous session: %d %s", status, body)
	}
	if status, _ := rawRequest(t, base, "GET", "/v1/sessions/open", map[string]string{"Authorization": "Bearer k"}, ""); status != 404 {
		t.Fatalf("a keyed tenant sees the anonymous session: %d", status)
	}
	if status, _ := rawRequest(t, base, "PUT", "/v1/kv/ns/k", nil, "ab"); status != 201 {
		t.Fatalf("anonymous KV put: %d", status)
	}
}

func TestRouteHelpers(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want route
	}{
		{"/v1/chat/completions", routeChat},
		{"/v1/chat/c%6Fmpletions", routeChat},
		{"/v1/chat%2Fcompletions", routePassthrough},
		{"/v1/chat/completions/x", routePassthrough},
		{"/v1/completions", routeCompletions},
		{"/v1/embeddings", routeEmbeddings},
		{"/v1/models", routeModels},
		{"/v1/models/m", routePassthrough},
		{"/v1/files", routePassthrough},
	} {
		if got := classify([]byte(c.raw)); got != c.want {
			t.Errorf("classify(%q) = %s, want %s", c.raw, got, c.want)
		}
	}
	for _, c := range []struct {
		seg, lit string
		want     bool
	}{
		{"kv", "kv", true}, {"%6bv", "kv", true}, {"%6Bv", "kv", true}, {"k", "kv", false},
		{"kvx", "kv", false}, {"%2", "kv", false}, {"%zz", "kv", false}, {"%2e%2E", "..", true}, {"", "", true},
	} {
		if got := segmentIs([]byte(c.seg), c.lit); got != c.want {
			t.Errorf("segmentIs(%q, %q) = %v", c.seg, c.lit, got)
		}
	}
}

// FuzzForwardable: a path the sidecar forwards names no sidecar route and
// stays under /v1 in every reading a server may give it — fasthttp's
// normalisation, and full decoding with backslashes as slashes followed by
// path.Clean.
func FuzzForwardable(f *testing.F) {
	for _, s := range []string{"/v1/models", "/v1/kv/ns/k", "/v1/x/../kv/a", "/v1/%2e%2e/kv", "/v1//kv/x", "/v1/%2Fkv/x",
		"/v1/a%5C..%5Ckv%5Cx", "/v1/models/org%2Fname", "/v1/%6bv/x", "/v1/.%2e/sessions/x", "/v1/pool%2F..%2Fx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !strings.HasPrefix(raw, "/v1/") {
			return
		}
		if _, _, owned := ownedRoute([]byte(raw)); owned {
			return
		}
		var u fasthttp.URI
		if err := u.Parse(nil, []byte(raw)); err != nil {
			return
		}
		if !forwardable([]byte(raw), u.Path()) {
			return
		}
		dec, err := url.PathUnescape(raw)
		if err != nil {
			t.Fatalf("%q forwarded with a malformed escape", raw)
		}
		for _, reading := range []string{string(u.Path()), path.Clean(strings.ReplaceAll(dec, `\`, "/"))} {
			if !strings.HasPrefix(reading+"/", "/v1/") {
				t.Fatalf("%q forwarded, but reads as %q outside /v1", raw, reading)
			}
			if _, _, owned := ownedRoute([]byte(reading)); owned {
				t.Fatalf("%q forwarded, but reads as the sidecar route %q", raw, reading)
			}
		}
	})
}
