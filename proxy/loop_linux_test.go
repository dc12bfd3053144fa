//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/frontdoor"
	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
)

// scriptUpstream answers each request with the raw answer its X-Answer
// header names, and records what it received.
type scriptUpstream struct {
	addr string
	mu   sync.Mutex
	got  []string // each request: method, target, sorted headers, body
	// held answers wait until release is closed.
	release chan struct{}
	closed  atomic.Int64 // connections the proxy closed while held
}

var upAnswers = map[string]struct {
	raw   string
	close bool // close the connection after the answer
}{
	"plain":     {raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nServer: up\r\nX-Request-Id: r1\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"},
	"chunked":   {raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\n{\"a\"\r\n5\r\n:1, \"\r\n6\r\nb\":2}\n\r\n0\r\nX-Trailer: t\r\n\r\n"},
	"close":     {raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"to\":\"the close\"}", close: true},
	"hop":       {raw: "HTTP/1.1 201 Whatever\r\nx-lower: a\r\nX-Multi: 1\r\nX-Multi: 2\r\nConnection: keep-alive, X-Drop\r\nX-Drop: yes\r\nKeep-Alive: timeout=5\r\nContent-Length: 3\r\n\r\nabc"},
	"interim":   {raw: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"},
	"nocontent": {raw: "HTTP/1.1 204 No Content\r\n\r\n"},
	"limited":   {raw: "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nContent-Type: application/json\r\nContent-Length: 24\r\n\r\n{\"error\":{\"code\":\"slow\"}}"},
	"dupcl":     {raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}"},
	"http10":    {raw: "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", close: true},
	"badstatus": {raw: "HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n"},
	"garbage":   {raw: "hello there\r\n\r\n"},
	"nulvalue":  {raw: "HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n"},
	"conflict":  {raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"},
	"toolarge":  {raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n" + strings.Repeat("x", 5000)},
	"bigchunks": {raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1388\r\n" + strings.Repeat("y", 5000) + "\r\n0\r\n\r\n"},
	"cut":       {raw: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", close: true},
	"cuthead":   {raw: "HTTP/1.1 200 OK\r\nContent-Le", close: true},
	"nothing":   {raw: "", close: true},
	"badchunk":  {raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", close: true},
}

func newScriptUpstream(t *testing.T) *scriptUpstream {
	t.Helper()
	u := &scriptUpstream{release: make(chan struct{})}
	u.addr = sidecartest.ServeConns(t, func(c net.Conn) {
		addr := c.LocalAddr().String() // the listener's: u.addr
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			body, _ := io.ReadAll(req.Body)
			var hs []string
			for k, vs := range req.Header {
				hs = append(hs, k+": "+strings.Join(vs, ","))
			}
			sort.Strings(hs)
			u.mu.Lock()
			host := strings.ReplaceAll(req.Host, addr, "UPSTREAM")
			u.got = append(u.got, fmt.Sprintf("%s %s host=%s\n%s\n%s", req.Method, req.RequestURI, host, strings.Join(hs, "\n"), body))
			u.mu.Unlock()
			name := req.Header.Get("X-Answer")
			if name == "hold" {
				select {
				case <-u.release:
				case <-readEOF(br):
					u.closed.Add(1)
					return
				}
				_, _ = io.WriteString(c, upAnswers["plain"].raw)
				return // br is readEOF's now
			}
			a, ok := upAnswers[name]
			if !ok {
				a = upAnswers["plain"]
			}
			if _, err := io.WriteString(c, a.raw); err != nil || a.close {
				return
			}
		}
	})
	return u
}

// readEOF is closed once br's connection ends.
func readEOF(br *bufio.Reader) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		_, _ = br.ReadByte()
		close(ch)
	}()
	return ch
}

func (u *scriptUpstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.got...)
}

// rawExchange sends raw on a new connection to addr and reads one response:
// its status, sorted headers but Date, and body.
func rawExchange(t *testing.T, addr, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode == http.StatusContinue { // the final answer follows
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		return "no response: " + err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "body: " + err.Error()
	}
	var hs []string
	for k, vs := range resp.Header {
		if k != "Date" {
			hs = append(hs, k+": "+strings.Join(vs, ","))
		}
	}
	if resp.Close {
		hs = append(hs, "Connection: close")
	}
	sort.Strings(hs)
	return fmt.Sprintf("%d\n%s\n%s", resp.StatusCode, strings.Join(hs, "\n"), body)
}

func chatRequest(extra, body string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n" + extra +
		fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)) + body
}

// loopOf returns s's event loop once Serve started it.
func loopOf(s *Server) *frontdoor.Loop {
	s.loopMu.Lock()
	defer s.loopMu.Unlock()
	return s.loop
}

// served is the number of requests s's loop served.
func served(s *Server) uint64 {
	n, _ := loopCounts(s)
	return n
}

// loopCounts are the requests s's loop served and the connections it
// handed over.
func loopCounts(s *Server) (served, handed uint64) { return loopOf(s).Counts() }

// startLoopPair starts two servers in front of two upstreams with the same
// script: one with the event loop, one without.
func startLoopPair(t *testing.T, mod func(*Options)) (loop, plain *Server, loopAddr, plainAddr string, uLoop, uPlain *scriptUpstream) {
	uLoop, uPlain = newScriptUpstream(t), newScriptUpstream(t)
	m := func(on bool) func(*Options) {
		return func(o *Options) {
			o.MaxResponseBytes = 4096
			o.MaxBodyBytes = 1 << 20
			if mod != nil {
				mod(o)
			}
			o.EventLoop = on
		}
	}
	lb, ls := startSidecar(t, "http://"+uLoop.addr+"/base", m(true))
	pb, ps := startSidecar(t, "http://"+uPlain.addr+"/base", m(false))
	eventually(t, func() bool {
		ls.loopMu.Lock()
		defer ls.loopMu.Unlock()
		return ls.loop != nil
	})
	return ls, ps, strings.TrimPrefix(lb, "http://"), strings.TrimPrefix(pb, "http://"), uLoop, uPlain
}

// TestEventLoopMatchesFasthttp sends one corpus of requests and upstream
// answers through a server with the event loop and one without: the
// client reads the same status, headers (but Date) and body, the upstream
// receives the same requests; the loop serves what it should and hands
// the rest over.
func TestEventLoopMatchesFasthttp(t *testing.T) {
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	type tc struct {
		name  string
		raw   string
		loop  bool // the loop serves it (else hands it over)
		noUp  bool // nothing reaches the upstream
		phase string
	}
	var cases []tc
	for name := range upAnswers {
		cases = append(cases, tc{name: "answer " + name, raw: chatRequest("X-Answer: "+name+"\r\n", chat), loop: true})
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].name < cases[j].name })
	cases = append(cases,
		tc{name: "completions", raw: strings.Replace(chatRequest("", `{"model":"m","prompt":"hi"}`), "/v1/chat/completions", "/v1/completions", 1), loop: true},
		tc{name: "client headers", raw: chatRequest("authorization: Bearer k1\r\nUser-Agent: t/1\r\nAccept-Encoding: gzip\r\nX-Dup: 1\r\nx-dup: 2\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: p\r\nTE: trailers\r\n", chat), loop: true},
		tc{name: "connection close", raw: chatRequest("Connection: close\r\n", chat), loop: true},
		tc{name: "no user agent, empty value", raw: chatRequest("X-Empty:\r\n", chat), loop: true},
		tc{name: "stream", raw: chatRequest("", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)},
		tc{name: "session header", raw: chatRequest("X-Session-ID: s1\r\n", chat)},
		tc{name: "empty session header", raw: chatRequest("X-Session-ID:\r\n", chat), loop: true}, // stateless on both paths (sessionKey)
		tc{name: "prompt cache key", raw: chatRequest("", `{"model":"m","prompt_cache_key":"k","messages":[{"role":"user","content":"hi"}]}`)},
		tc{name: "bad json", raw: chatRequest("", `{"model":`), noUp: true},
		tc{name: "no messages", raw: chatRequest("", `{"model":"m"}`), noUp: true},
		tc{name: "models", raw: "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"},
		tc{name: "healthz", raw: "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", noUp: true},
		tc{name: "query", raw: strings.Replace(chatRequest("", chat), "completions HTTP", "completions?a=b HTTP", 1)},
		tc{name: "escaped path", raw: strings.Replace(chatRequest("", chat), "/v1/chat/completions", "/v1/chat/c%6Fmpletions", 1)},
		tc{name: "trailing slash", raw: strings.Replace(chatRequest("", chat), "/v1/chat/completions", "/v1/chat/completions/", 1)},
		tc{name: "http 1.0", raw: strings.Replace(chatRequest("", chat), "HTTP/1.1", "HTTP/1.0", 1)},
		tc{name: "no content type", raw: strings.Replace(chatRequest("", chat), "Content-Type: application/json\r\n", "", 1)},
		tc{name: "chunked request", raw: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(chat), chat)},
		tc{name: "expect", raw: chatRequest("Expect: 100-continue\r\n", chat)},
		tc{name: "two content lengths", raw: chatRequest(fmt.Sprintf("Content-Length: %d\r\n", len(chat)), chat), noUp: true},
		tc{name: "space before colon", raw: chatRequest("X-Bad : 1\r\n", chat), noUp: true},
		tc{name: "two hosts", raw: chatRequest("Host: other\r\n", chat), noUp: true},
		tc{name: "body too large", raw: chatRequest("", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("z", 1<<20)+`"}]}`), noUp: true},
		tc{name: "head larger than the loop's buffer", raw: chatRequest("X-Big: "+strings.Repeat("h", 20<<10)+"\r\n", chat)},
		tc{name: "garbage", raw: "\x00\x01\x02 not http\r\n\r\n", noUp: true},
	)
	ls, _, la, pa, ul, up := startLoopPair(t, nil)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			servedBefore, handedBefore := loopCounts(ls)
			nl, np := len(ul.requests()), len(up.requests())
			got, want := rawExchange(t, la, c.raw), rawExchange(t, pa, c.raw)
			if got != want {
				t.Errorf("through the loop:\n%s\n\nwithout:\n%s", got, want)
			}
			gl, gp := ul.requests()[nl:], up.requests()[np:]
			if strings.Join(gl, "\n--\n") != strings.Join(gp, "\n--\n") {
				t.Errorf("the upstream received through the loop:\n%s\n\nwithout:\n%s", strings.Join(gl, "\n--\n"), strings.Join(gp, "\n--\n"))
			}
			if c.noUp && len(gl) != 0 {
				t.Errorf("%d requests reached the upstream, want none", len(gl))
			}
			served, handed := loopCounts(ls)
			served, handed = served-servedBefore, handed-handedBefore
			if c.loop && (served != 1 || handed != 0) || !c.loop && (served != 0 || handed != 1) {
				t.Errorf("the loop served %d and handed over %d, want the loop to serve: %v", served, handed, c.loop)
			}
		})
	}
}

// TestEventLoopKeepAliveAndHandOver: one connection carries requests the
// loop serves, pipelined ones too, then one it hands over; the fasthttp
// server answers that one and the rest, in order.
func TestEventLoopKeepAliveAndHandOver(t *testing.T) {
	ls, _, la, _, _, _ := startLoopPair(t, nil)
	c, err := net.Dial("tcp", la)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	read := func(want int, wantBody string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || !strings.Contains(string(b), wantBody) {
			t.Fatalf("got %d %s, want %d with %q", resp.StatusCode, b, want, wantBody)
		}
	}
	_, _ = io.WriteString(c, chatRequest("X-Answer: plain\r\n", chat))
	read(200, `"ok":true`)
	_, _ = io.WriteString(c, chatRequest("X-Answer: chunked\r\n", chat)+chatRequest("X-Answer: hop\r\n", chat))
	read(200, `"b":2`)
	read(201, "abc")
	_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"+chatRequest("X-Answer: plain\r\n", chat))
	read(200, `"status":"ok"`)
	read(200, `"ok":true`)
	if s, h := loopCounts(ls); s != 3 || h != 1 {
		t.Fatalf("the loop served %d and handed over %d, want 3 and 1", s, h)
	}
	if n, m := ls.metrics.requestCount("chat_completions", 200), ls.metrics.requestCount("chat_completions", 201); n != 3 || m != 1 {
		t.Fatalf("chat_completions counted %d times 200 and %d times 201, want 3 and 1", n, m)
	}
}

// TestEventLoopUpstreamFailures: a refused upstream is 502, a silent one
// 504 after UpstreamTimeout, a client that leaves is 499 and its upstream
// connection closed; a stale pooled connection is sent again once.
func TestEventLoopUpstreamFailures(t *testing.T) {
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	t.Run("refused", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		_ = ln.Close()
		b, s := startSidecar(t, "http://"+addr, func(o *Options) { o.EventLoop = true })
		got := rawExchange(t, strings.TrimPrefix(b, "http://"), chatRequest("", chat))
		if !strings.HasPrefix(got, "502") || !strings.Contains(got, "upstream_unreachable") || served(s) != 1 {
			t.Fatalf("got %s (served %d)", got, served(s))
		}
	})
	t.Run("timeout", func(t *testing.T) {
		u := newScriptUpstream(t)
		defer close(u.release)
		b, s := startSidecar(t, "http://"+u.addr, func(o *Options) { o.EventLoop = true; o.UpstreamTimeout = 300 * time.Millisecond })
		got := rawExchange(t, strings.TrimPrefix(b, "http://"), chatRequest("X-Answer: hold\r\n", chat))
		if !strings.HasPrefix(got, "504") || !strings.Contains(got, "upstream_timeout") {
			t.Fatalf("got %s", got)
		}
		eventually(t, func() bool { return u.closed.Load() == 1 })
		if n := s.metrics.requestCount("chat_completions", 504); n != 1 {
			t.Fatalf("504 counted %d times", n)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		u := newScriptUpstream(t)
		defer close(u.release)
		b, s := startSidecar(t, "http://"+u.addr, func(o *Options) { o.EventLoop = true })
		c, err := net.Dial("tcp", strings.TrimPrefix(b, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, chatRequest("X-Answer: hold\r\n", chat))
		eventually(t, func() bool { return len(u.requests()) == 1 })
		_ = c.Close()
		eventually(t, func() bool { return u.closed.Load() == 1 })
		eventually(t, func() bool { return s.metrics.requestCount("chat_completions", statusClientClosed) == 1 })
		if n := s.metrics.disconnects.Load(); n != 1 {
			t.Fatalf("disconnects %d, want 1", n)
		}
		if n := s.metrics.inFlight.Load(); n != 0 {
			t.Fatalf("in flight %d, want 0", n)
		}
	})
	t.Run("stale pooled connection", func(t *testing.T) {
		u := newPoolUpstream(t, "127.0.0.1:0")
		u.closeOnReuse = true
		base, s := startSidecar(t, "http://"+u.addr, func(o *Options) { o.EventLoop = true; o.UpstreamIdleTimeout = time.Hour })
		for i := range 3 {
			resp, b := post(t, base+"/v1/chat/completions", chatBody, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
			}
		}
		if got := s.up.retries.Load(); got != 2 {
			t.Fatalf("%d requests sent again, want 2", got)
		}
	})
}

// TestEventLoopPoolKeepsAtMostMaxIdle: after a burst, the loop keeps
// MaxIdleConnsPerHost upstream connections and reuses them.
func TestEventLoopPoolKeepsAtMostMaxIdle(t *testing.T) {
	u := newPoolUpstream(t, "127.0.0.1:0")
	base, _ := startSidecar(t, "http://"+u.addr, func(o *Options) {
		o.EventLoop, o.MaxIdleConnsPerHost, o.UpstreamIdleTimeout = true, 2, time.Hour
	})
	burstOf(t, base, u, 6)
	before := u.accepted.Load()
	burstOf(t, base, u, 6)
	if got := u.accepted.Load() - before; got != 4 {
		t.Fatalf("the second burst dialed %d connections, want 4", got)
	}
}

// hookCounter is an engine connector whose hooks never block
// (engine.NonBlocking) that records what they hear.
type hookCounter struct {
	mu      sync.Mutex
	before  []string // tenant, model
	after   []string // status, body prefix
	rewrite []byte
}

func (h *hookCounter) Name() string { return "counter" }

func (h *hookCounter) NeverBlocks() bool { return true }

func (h *hookCounter) Before(_ context.Context, r *engine.Request) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.before = append(h.before, r.Tenant+" "+r.Model)
	if r.Start.IsZero() {
		h.before = append(h.before, "no start")
	}
	return h.rewrite, nil
}

func (h *hookCounter) After(_ context.Context, _ *engine.Request, resp *engine.Response) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.after = append(h.after, fmt.Sprintf("%d %s", resp.Status, resp.Body))
}

// TestEventLoopEngineHooks: the connector hears each request the loop
// serves, with the key's tenant, and its answer; a body it rewrites is the
// one sent, with Accept-Encoding dropped.
func TestEventLoopEngineHooks(t *testing.T) {
	chat := `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`
	h := &hookCounter{rewrite: []byte(`{"model":"m1","messages":[],"x":1}`)}
	ls, _, la, _, ul, _ := startLoopPair(t, func(o *Options) { o.Engine = h })
	got := rawExchange(t, la, chatRequest("Authorization: Bearer key-1\r\nAccept-Encoding: gzip\r\nX-Answer: plain\r\n", chat))
	if !strings.HasPrefix(got, "200") {
		t.Fatalf("got %s", got)
	}
	if served(ls) != 1 {
		t.Fatal("the loop did not serve the request")
	}
	h.mu.Lock()
	before, after := strings.Join(h.before, "|"), strings.Join(h.after, "|")
	h.mu.Unlock()
	if want := tenantOf([]byte("Bearer key-1")) + " m1"; !strings.Contains(before, want) || strings.Contains(before, "|") || strings.Contains(before, "no start") {
		t.Fatalf("before-hook heard %q, want %q once", before, want)
	}
	if !strings.Contains(after, `200 {"ok":true}`) {
		t.Fatalf("after-hook heard %q", after)
	}
	reqs := ul.requests()
	if len(reqs) != 1 || !strings.HasSuffix(reqs[0], string(h.rewrite)) || strings.Contains(reqs[0], "Accept-Encoding") {
		t.Fatalf("the upstream received %q", reqs)
	}
}

// TestEventLoopShutdown: Shutdown lets a request under way finish, closes
// idle connections, and Serve returns.
func TestEventLoopShutdown(t *testing.T) {
	u := newScriptUpstream(t)
	s, err := New(Options{Upstream: "http://" + u.addr, EventLoop: true, NoContextProbe: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	answer := make(chan string, 1)
	go func() {
		answer <- rawExchange(t, ln.Addr().String(), chatRequest("X-Answer: hold\r\n", `{"model":"m","messages":[]}`))
	}()
	eventually(t, func() bool { return len(u.requests()) == 1 })
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := idle.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the idle connection stayed open: %d, %v", n, err)
	}
	close(u.release)
	if got := <-answer; !strings.HasPrefix(got, "200") || !strings.Contains(got, "Connection: close") {
		t.Fatalf("the request under way got %s", got)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
}

// TestEventLoopReadTimeout: a request whose head stops coming is answered
// 408 after ReadTimeout, as fasthttp answers it.
func TestEventLoopReadTimeout(t *testing.T) {
	u := newScriptUpstream(t)
	b, _ := startSidecar(t, "http://"+u.addr, func(o *Options) { o.EventLoop = true; o.ReadTimeout = 300 * time.Millisecond })
	got := rawExchange(t, strings.TrimPrefix(b, "http://"), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
	if !strings.HasPrefix(got, "408") || !strings.Contains(got, "request_timeout") {
		t.Fatalf("got %s", got)
	}
}

// TestEventLoopBodyInPieces: a body that arrives in pieces, larger than
// the loop's buffer, is read whole and forwarded unchanged.
func TestEventLoopBodyInPieces(t *testing.T) {
	ls, _, la, _, ul, _ := startLoopPair(t, nil)
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("w", 100<<10) + `"}]}`
	raw := chatRequest("X-Answer: plain\r\n", body)
	c, err := net.Dial("tcp", la)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < len(raw); i += 7000 {
		_, _ = io.WriteString(c, raw[i:min(i+7000, len(raw))])
		time.Sleep(2 * time.Millisecond)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || served(ls) != 1 {
		t.Fatalf("status %d, served %d", resp.StatusCode, served(ls))
	}
	if reqs := ul.requests(); len(reqs) != 1 || !bytes.HasSuffix([]byte(reqs[0]), []byte(body)) {
		t.Fatal("the upstream did not receive the body whole")
	}
}

// namedGeneric has the generic connector's name and hooks, but not its
// word that they never block.
type namedGeneric struct{ hookCounter }

func (*namedGeneric) Name() string      { return "generic" }
func (*namedGeneric) NeverBlocks() bool { return false }

// TestEventLoopNeedsNonBlockingHooks: the loop runs with a connector that
// says its hooks never block (engine.NonBlocking), or none; not with one
// that does not, whatever its name.
func TestEventLoopNeedsNonBlockingHooks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, c := range []struct {
		name string
		eng  engine.Plugin
		on   bool
	}{
		{"none", nil, true},
		{"non-blocking", &hookCounter{}, true},
		{"named generic, may block", &namedGeneric{}, false},
	} {
		s, err := New(Options{Upstream: "http://127.0.0.1:1", Engine: c.eng, NoContextProbe: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, why := s.loopOptions(ln); (why == "") != c.on {
			t.Errorf("%s: the loop's eligibility says %q, want on: %v", c.name, why, c.on)
		}
	}
}
