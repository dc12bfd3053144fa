package proxy

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine/generic"
	"github.com/kvsidecar/kvsidecar/memory"
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
	benchProxyWith(b, body, Options{})
}

func benchProxyWith(b *testing.B, body string, o Options) {
	up := benchUpstream(b)
	o.Upstream, o.Logger = up, slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(o)
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

// BenchmarkProxyChatEngine is BenchmarkProxyChat with the generic engine
// connector, as `sidecar serve` runs by default: the pass-through path
// of make bench-proxy.
func BenchmarkProxyChatEngine(b *testing.B) {
	benchProxyWith(b, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		Options{Engine: generic.New(generic.Options{})})
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

// BenchmarkParseRequestLong: a 27 KB chat request, forty turns of history
// with newlines in the replies: the body is mostly message text.
func BenchmarkParseRequestLong(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"mock","messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 20) + `"}`)
	for i := range 40 {
		fmt.Fprintf(&sb, `,{"role":"user","content":"%s"},{"role":"assistant","content":"%s"}`,
			strings.Repeat(fmt.Sprintf("Tell me about item %d in detail please. ", i), 8),
			strings.Repeat(fmt.Sprintf("Item %d is a thing with properties.\\n ", i), 8))
	}
	sb.WriteString(`],"stream":false,"max_tokens":64}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseRequest(epChat, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSessionTurn is one chat turn of a session (append mode, a new
// user message each time) as the client sees it: from the request to the
// end of the answer (the last byte of the JSON, or data: [DONE]). The
// reply is recorded before that end (issue 12 row 15), so with
// fsync=always each turn pays two fsyncs on the client's path (the user
// message before forwarding, the reply before the end); fsync=never shows
// the same turn without them. Turns are spaced (untimed) so that work a
// turn leaves behind never lands on the next one's clock: ns/op is one
// turn's latency, not throughput.
func BenchmarkSessionTurn(b *testing.B) {
	for _, stream := range []bool{false, true} {
		for _, pol := range []memory.FsyncPolicy{memory.FsyncAlways, memory.FsyncNever} {
			b.Run(fmt.Sprintf("stream=%v/fsync=%s", stream, pol), func(b *testing.B) {
				st, err := memory.Open(memory.Options{Dir: b.TempDir(), Fsync: pol})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = st.Close() })
				up := benchUpstream(b)
				s, err := New(Options{Upstream: up, Memory: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
				req.Header.Set("X-Session-ID", "bench")
				req.Header.Set("X-Session-Mode", "append")
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					req.SetBodyString(fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"turn %d"}]}`, stream, i))
					if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
					}
					b.StopTimer()
					time.Sleep(5 * time.Millisecond)
					b.StartTimer()
				}
			})
		}
	}
}

// BenchmarkRelayPass is the relay's own work on one streamed answer of
// make bench-proxy's upstream (16 content chunks, a finish, [DONE]): each
// event checked, its choices followed to tell a whole answer, queued.
func BenchmarkRelayPass(b *testing.B) {
	var events [][]byte
	for i := range 16 {
		events = append(events, fmt.Appendf(nil, "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"mock\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i))
	}
	events = append(events, []byte("data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"),
		[]byte("data: [DONE]\n\n"))
	b.ReportAllocs()
	for b.Loop() {
		r := relay{sse: true, validate: true}
		r.takeMem()
		for _, ev := range events {
			if !r.pass(ev) {
				b.Fatal("refused")
			}
		}
		if !r.end.done || !r.end.finished() {
			b.Fatal("not finished")
		}
		r.giveMem()
	}
}
