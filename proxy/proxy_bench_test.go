package proxy

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// benchUpstream serves a canned chat completion (and a short stream) on
// loopback with fasthttp, so the proxy's own cost dominates.
func benchUpstream(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if bytes.Contains(ctx.Request.Body(), []byte(`"stream":true`)) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyString("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)
	}}
	go srv.Serve(ln) //nolint:errcheck
	b.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func benchProxy(b *testing.B, body string) {
	up := benchUpstream(b)
	s, err := New(Options{Upstream: up, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(ln) //nolint:errcheck
	b.Cleanup(func() { _ = s.srv.Shutdown() })
	c := &fasthttp.HostClient{Addr: ln.Addr().String()}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	req.SetRequestURI("http://" + ln.Addr().String() + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.Set("Authorization", "Bearer k")
	req.SetBodyString(body)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
		}
	}
}

// BenchmarkProxyChat is one proxied non-streaming chat request end to end on
// loopback (client, sidecar and upstream in one process); allocations are
// the whole process's per request.
func BenchmarkProxyChat(b *testing.B) {
	benchProxy(b, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
}

// BenchmarkProxyChatStream is the same for a short streamed answer.
func BenchmarkProxyChatStream(b *testing.B) {
	benchProxy(b, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
}

// BenchmarkParseRequest is the cost of reading a chat body on the request
// path (validation plus the fields the proxy needs).
func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"mock","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say something short."}]}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := parseRequest(epChat, body); err != nil {
			b.Fatal(err)
		}
	}
}
