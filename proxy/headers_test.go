package proxy

import (
	"fmt"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkCopyHeaders: the request headers of an OpenAI SDK client and an
// engine's response headers, copied as a pass-through request does.
func BenchmarkCopyHeaders(b *testing.B) {
	var in fasthttp.Request
	for _, kv := range [][2]string{
		{"Host", "127.0.0.1:8080"}, {"User-Agent", "OpenAI/Python 1.54.0"}, {"Accept", "application/json"},
		{"Accept-Encoding", "gzip, deflate"}, {"Content-Type", "application/json"}, {"Authorization", "Bearer sk-x"},
		{"X-Stainless-Lang", "python"}, {"X-Stainless-Package-Version", "1.54.0"}, {"X-Stainless-Os", "Linux"},
		{"X-Stainless-Arch", "x64"}, {"X-Stainless-Runtime", "CPython"}, {"X-Stainless-Runtime-Version", "3.12.3"},
		{"X-Stainless-Retry-Count", "0"}, {"Connection", "keep-alive"}, {"Content-Length", "120"},
	} {
		in.Header.Add(kv[0], kv[1])
	}
	var up fasthttp.Response
	for _, kv := range [][2]string{
		{"Server", "llama.cpp"}, {"Date", "Thu, 26 Nov 2026 02:00:00 GMT"}, {"Content-Type", "application/json; charset=utf-8"},
		{"Access-Control-Allow-Origin", ""}, {"Keep-Alive", "timeout=5, max=100"}, {"Content-Length", "300"},
	} {
		up.Header.Add(kv[0], kv[1])
	}
	var out fasthttp.Request
	var resp fasthttp.Response
	b.ReportAllocs()
	for b.Loop() {
		out.Header.Reset()
		copyRequestHeaders(&out.Header, &in.Header)
		resp.Header.Reset()
		copyResponseHeaders(&resp.Header, &up.Header)
	}
}

// TestHopHeadersInAnyCase: hop-by-hop names and the names a Connection
// header lists are dropped in any case and spacing; end-to-end ones pass
// (the rule itself: frontdoor's TestHopByHop).
func TestHopHeadersInAnyCase(t *testing.T) {
	var in fasthttp.Request // names normalized, as the server reads them
	for _, kv := range [][2]string{{"connection", "X-Hop"}, {"x-hop", "1"}, {"X-Keep", "2"}, {"te", "trailers"},
		{"host", "a"}, {"expect", "100-continue"}, {"content-length", "3"}, {"Authorization", "Bearer k"}} {
		in.Header.Add(kv[0], kv[1])
	}
	var out fasthttp.Request
	copyRequestHeaders(&out.Header, &in.Header)
	var got []string
	for k, v := range out.Header.All() {
		got = append(got, string(k)+"="+string(v))
	}
	if want := []string{"X-Keep=2", "Authorization=Bearer k"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("forwarded %q, want %q", got, want)
	}
}
