package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/frontdoor"
	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
)

// poolUpstream is a net/http upstream on loopback whose connections the
// test closes the way real upstreams do: idle ones after their keep-alive
// bound (closeIdle), all of them on a restart, or a pooled one just as
// the next request arrives (closeOnReuse).
type poolUpstream struct {
	t    *testing.T
	addr string
	srv  *http.Server
	// closeOnReuse: a connection's second request is read, then the
	// connection is closed without an answer.
	closeOnReuse bool
	// hold makes the handler wait until that many requests are in flight
	// (a burst that opens as many connections), then it is cleared.
	hold     atomic.Pointer[burst]
	accepted atomic.Int64 // connections
	requests atomic.Int64

	// mu protects idle.
	mu   sync.Mutex
	idle map[net.Conn]bool
}

type burst struct {
	n    atomic.Int64
	want int64
	all  chan struct{}
}

type connCount struct{}

func newPoolUpstream(t *testing.T, addr string) *poolUpstream {
	u := &poolUpstream{t: t, idle: map[net.Conn]bool{}}
	u.start(addr)
	t.Cleanup(func() { _ = u.srv.Close() })
	return u
}

func (u *poolUpstream) start(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		u.t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	u.srv = &http.Server{
		Handler: http.HandlerFunc(u.serve),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connCount{}, new(atomic.Int64))
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			u.mu.Lock()
			defer u.mu.Unlock()
			switch st {
			case http.StateNew:
				u.accepted.Add(1)
			case http.StateIdle:
				u.idle[c] = true
			case http.StateActive:
				u.idle[c] = false
			default:
				delete(u.idle, c)
			}
		},
	}
	go u.srv.Serve(ln) //nolint:errcheck
}

func (u *poolUpstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	u.requests.Add(1)
	if n := r.Context().Value(connCount{}).(*atomic.Int64).Add(1); n > 1 && u.closeOnReuse {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = c.Close()
		}
		return
	}
	if b := u.hold.Load(); b != nil {
		if b.n.Add(1) == b.want {
			close(b.all)
		}
		<-b.all
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[]}`)
}

// closeIdle waits until every connection is idle (net/http marks one so
// just after its response went out), then closes them all, as an
// upstream's keep-alive timeout does; with reset, by RST instead of FIN.
func (u *poolUpstream) closeIdle(reset bool) {
	eventually(u.t, func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, idle := range u.idle {
			if !idle {
				return false
			}
		}
		return true
	})
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.idle {
		if tc, ok := c.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

// restart closes the listener and every connection and serves again on
// the same port, as a restarted engine does.
func (u *poolUpstream) restart() {
	_ = u.srv.Close()
	u.start(u.addr)
}

// burstOf sends n requests at once, each held at the upstream until all
// arrived, so the sidecar pools n connections.
func burstOf(t *testing.T, base string, u *poolUpstream, n int) {
	t.Helper()
	u.hold.Store(&burst{want: int64(n), all: make(chan struct{})})
	defer u.hold.Store(nil)
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := post(t, base+"/v1/chat/completions", chatBody, nil)
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Fatalf("burst request %d: %d", i, c)
		}
	}
}

// TestStalePooledConnectionsNeverFailARequest: after a burst fills the
// pool, the upstream closes its connections (idle timeout, a reset, a
// restart, or just as a pooled connection's next request arrives); every
// request after that succeeds.
func TestStalePooledConnectionsNeverFailARequest(t *testing.T) {
	for _, c := range []struct {
		name  string
		idle  time.Duration // Options.UpstreamIdleTimeout
		reuse bool          // the upstream closes a connection on its second request
		kill  func(u *poolUpstream)
		// dials is how many connections the sequential requests open;
		// retries how many of them were sent twice.
		dials, retries int64
	}{
		// The check on checkout finds the closed connections (once their
		// end reached the sidecar's sockets) and empties the pool at the
		// first: one new connection serves every request.
		{name: "idle closed, default bound", kill: func(u *poolUpstream) { u.closeIdle(false) }, dials: 1},
		{name: "idle closed, bound high", idle: time.Hour, kill: func(u *poolUpstream) { u.closeIdle(false) }, dials: 1},
		{name: "idle reset, bound high", idle: time.Hour, kill: func(u *poolUpstream) { u.closeIdle(true) }, dials: 1},
		{name: "restart on the same port", idle: time.Hour, kill: func(u *poolUpstream) { u.restart() }, dials: 1},
		// The check on checkout cannot see this one: the retry on a
		// freshly dialed connection is what saves each request.
		{name: "closed as the request arrives", idle: time.Hour, reuse: true, kill: func(*poolUpstream) {}, dials: 5, retries: 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newPoolUpstream(t, "127.0.0.1:0")
			u.closeOnReuse = c.reuse
			base, s := startSidecar(t, "http://"+u.addr, func(o *Options) { o.UpstreamIdleTimeout = c.idle })
			burstOf(t, base, u, 4)
			c.kill(u)
			if !c.reuse {
				waitPoolClosed(t, s)
			}
			before := u.accepted.Load()
			const n = 5
			for i := range n {
				resp, b := post(t, base+"/v1/chat/completions", chatBody, nil)
				if resp.StatusCode != 200 {
					t.Fatalf("request %d after the close: %d %s", i, resp.StatusCode, b)
				}
			}
			if got := u.accepted.Load() - before; got != c.dials {
				t.Errorf("the %d requests opened %d connections, want %d", n, got, c.dials)
			}
			if got := s.up.retries.Load(); got != c.retries {
				t.Errorf("%d requests sent again, want %d", got, c.retries)
			}
			for _, kind := range []string{upErrUnreachable, upErrBadResponse, upErrTimeout} {
				if _, ok := s.metrics.upErrors.Load(kind); ok {
					t.Errorf("an upstream error of kind %s was counted", kind)
				}
			}
		})
	}
}

// waitPoolClosed waits until the end of every pooled connection reached
// the sidecar's sockets (the upstream closed them).
func waitPoolClosed(t *testing.T, s *Server) {
	t.Helper()
	eventually(t, func() bool {
		s.up.mu.Lock()
		defer s.up.mu.Unlock()
		for _, uc := range s.up.idle {
			if uc.probe.alive() {
				return false
			}
		}
		return true
	})
}

// rawUpstream answers each request on a loopback port with the bytes
// answer returns for it (conn and req count from 1), then keeps the
// connection or closes it.
func rawUpstream(t *testing.T, answer func(conn, req int) (reply string, keep bool)) (url string, accepted, requests *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted, requests = new(atomic.Int64), new(atomic.Int64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conn := int(accepted.Add(1))
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for req := 1; ; req++ {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, r.Body)
					requests.Add(1)
					reply, keep := answer(conn, req)
					if _, err := io.WriteString(c, reply); err != nil || !keep {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), accepted, requests
}

const okReply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

// TestRequestsTheUpstreamReadAreNotRetried: a retry happens only on a
// reused connection that ended before any response byte; a fresh
// connection's failure, or a response cut short, is one 502.
func TestRequestsTheUpstreamReadAreNotRetried(t *testing.T) {
	for _, c := range []struct {
		name    string
		answer  func(conn, req int) (string, bool)
		warm    bool   // one good request first, so the failing one reuses its connection
		message string // in the client's error
	}{
		{name: "fresh connection closed unanswered", answer: func(int, int) (string, bool) { return "", false },
			message: "without answering"},
		{name: "reused connection, head cut short", warm: true, answer: func(_, req int) (string, bool) {
			if req == 1 {
				return okReply, true
			}
			return "HTTP/1.1 200 OK\r\nContent-Ty", false
		}, message: "in the middle of its response headers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up, accepted, requests := rawUpstream(t, c.answer)
			base, _ := startSidecar(t, up, func(o *Options) { o.UpstreamIdleTimeout = time.Hour })
			if c.warm {
				if resp, b := post(t, base+"/v1/chat/completions", chatBody, nil); resp.StatusCode != 200 {
					t.Fatalf("warm-up: %d %s", resp.StatusCode, b)
				}
			}
			before := requests.Load()
			resp, b := post(t, base+"/v1/chat/completions", chatBody, nil)
			wantOpenAIError(t, resp, b, 502, "upstream_unreachable")
			if !strings.Contains(string(b), c.message) {
				t.Errorf("message %s, want it to say %q", b, c.message)
			}
			if n := requests.Load() - before; n != 1 {
				t.Errorf("the upstream read the failing request %d times, want 1", n)
			}
			if n := accepted.Load(); n != 1 {
				t.Errorf("%d connections, want 1", n)
			}
		})
	}
}

// TestMalformedUpstreamResponses: heads fasthttp refuses are read the way
// lenient clients read them where that is unambiguous (an unknown
// Transfer-Encoding, a repeated Content-Length, a large head); anything
// else is a 502 upstream_bad_response whose message quotes none of the
// upstream's bytes.
func TestMalformedUpstreamResponses(t *testing.T) {
	const secret = "S3CR3T"
	big := strings.Repeat("x", 100<<10)
	huge := strings.Repeat("x", 300<<10)
	for _, c := range []struct {
		name  string
		reply string
		keep  bool // the upstream keeps the connection open after it
		body  string
		bad   bool
	}{
		{name: "unknown transfer-encoding with content-length", keep: true,
			reply: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Up: " + secret + "\r\nTransfer-Encoding: string\r\nContent-Length: 11\r\n\r\n{\"a\":\"b12\"}",
			body:  `{"a":"b12"}`},
		{name: "unknown transfer-encoding, body to the close",
			reply: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: string\r\n\r\n{\"a\":1}",
			body:  `{"a":1}`},
		{name: "codings before chunked", keep: true,
			reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity, chunked\r\nContent-Length: 99\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
			body:  "hello"},
		{name: "two transfer-encoding headers", keep: true,
			reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
			body:  "hello"},
		{name: "content-length repeated with one value", keep: true,
			reply: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
			body:  "hello"},
		{name: "head larger than the connection buffer", keep: true,
			reply: "HTTP/1.1 200 OK\r\nX-Big: " + big + "\r\nContent-Length: 5\r\n\r\nhello",
			body:  "hello"},
		{name: "conflicting content-lengths", bad: true,
			reply: "HTTP/1.1 200 OK\r\nX-Up: " + secret + "\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"},
		{name: "garbage status line", bad: true,
			reply: "HTXP/1.1 2oo " + secret + "\r\nContent-Length: 2\r\n\r\n{}"},
		{name: "not http at all", bad: true, reply: secret + " hello\r\n\r\n"},
		{name: "not http, no end of head, connection kept", bad: true, keep: true, reply: secret + " hello\r\n"},
		{name: "bad status code, no end of head, connection kept", bad: true, keep: true, reply: "HTTP/1.1 2x0 " + secret + "\r\n"},
		{name: "NUL in a header value", bad: true,
			reply: "HTTP/1.1 200 OK\r\nX-Up: a\x00" + secret + "\r\nContent-Length: 2\r\n\r\n{}"},
		{name: "control byte in a header name", bad: true,
			reply: "HTTP/1.1 200 OK\r\nX-" + secret + "\x01: a\r\nContent-Length: 2\r\n\r\n{}"},
		{name: "bad content-length", bad: true,
			reply: "HTTP/1.1 200 OK\r\nContent-Length: 2" + secret + "\r\n\r\n{}"},
		{name: "head larger than 256 KiB", bad: true,
			reply: "HTTP/1.1 200 OK\r\nX-" + secret + ": " + huge + "\r\nContent-Length: 2\r\n\r\n{}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up, _, _ := rawUpstream(t, func(int, int) (string, bool) { return c.reply, c.keep })
			base, s := startSidecar(t, up, nil)
			resp, b := post(t, base+"/v1/chat/completions", chatBody, nil)
			if !c.bad {
				if resp.StatusCode != 200 || string(b) != c.body {
					t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, b, c.body)
				}
				if te := resp.Header.Get("Transfer-Encoding"); te != "" && te != "chunked" {
					t.Errorf("Transfer-Encoding %q reached the client", te)
				}
				return
			}
			wantOpenAIError(t, resp, b, 502, "upstream_bad_response")
			var e struct{ Error struct{ Message string } }
			_ = json.Unmarshal(b, &e)
			for _, leak := range []string{secret, "HTXP", "hello", "Content-Length", "xxxx"} {
				if strings.Contains(e.Error.Message, leak) {
					t.Errorf("the message echoes the upstream's bytes (%q): %s", leak, e.Error.Message)
				}
			}
			if v, ok := s.metrics.upErrors.Load(upErrBadResponse); !ok || v.(interface{ Load() uint64 }).Load() != 1 {
				t.Errorf("bad_response not counted once")
			}
			var m bytes.Buffer
			s.metrics.WritePrometheus(&m)
			if !strings.Contains(m.String(), `sidecar_upstream_errors_total{kind="bad_response"} 1`) {
				t.Errorf("metrics lack the bad_response count")
			}
			// /readyz says the same, in the same words.
			r2, err := noPoolClient.Get(base + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			b2, _ := io.ReadAll(r2.Body)
			r2.Body.Close()
			if r2.StatusCode != 503 || bytes.Contains(b2, []byte(secret)) {
				t.Errorf("/readyz: %d %s", r2.StatusCode, b2)
			}
		})
	}
}

// TestMalformedHeadStreams: a stream whose head carries an unknown
// Transfer-Encoding beside its Content-Length is relayed event by event.
func TestMalformedHeadStreams(t *testing.T) {
	events := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	up, _, _ := rawUpstream(t, func(int, int) (string, bool) {
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: string\r\nContent-Length: %d\r\n\r\n%s", len(events), events), true
	})
	base, _ := startSidecar(t, up, nil)
	resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 200 || string(b) != events {
		t.Fatalf("got %d %q", resp.StatusCode, b)
	}
}

// TestUpstreamPathPrefix: an upstream URL with a path keeps it, for
// forwarded requests and the readiness probe; a trailing /v1 is the API
// root.
func TestUpstreamPathPrefix(t *testing.T) {
	for _, c := range []struct{ suffix, want string }{
		{"/prefix/v1", "/prefix/v1"},
		{"/prefix", "/prefix/v1"},
		{"/prefix/v1/", "/prefix/v1"},
		{"/a/b/v1", "/a/b/v1"},
		{"/pre%20fix/v1", "/pre%20fix/v1"},
		{"/a%2Fb", "/a%2Fb/v1"},
		{"/v1", "/v1"},
		{"", "/v1"},
	} {
		t.Run(c.suffix, func(t *testing.T) {
			var mu sync.Mutex
			var seen []string
			up, _, _ := rawUpstream(t, func(int, int) (string, bool) { return okReply, true })
			// rawUpstream does not report paths: put a recorder in front.
			rec := newPathRecorder(t, strings.TrimPrefix(up, "http://"), func(p string) {
				mu.Lock()
				seen = append(seen, p)
				mu.Unlock()
			})
			base, _ := startSidecar(t, "http://"+rec+c.suffix, nil)
			resp, b := post(t, base+"/v1/chat/completions?x=1", chatBody, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			r2, err := noPoolClient.Get(base + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			r2.Body.Close()
			if r2.StatusCode != 200 {
				t.Fatalf("/readyz %d", r2.StatusCode)
			}
			mu.Lock()
			defer mu.Unlock()
			want := []string{c.want + "/chat/completions?x=1", c.want + "/models"}
			if fmt.Sprint(seen) != fmt.Sprint(want) {
				t.Fatalf("upstream saw %q, want %q", seen, want)
			}
		})
	}
}

// newPathRecorder forwards raw TCP to target and reports each request
// line's target.
func newPathRecorder(t *testing.T, target string, seen func(string)) string {
	t.Helper()
	return sidecartest.ServeConns(t, func(c net.Conn) {
		out, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer out.Close()
		go func() { _, _ = io.Copy(c, out); _ = c.Close() }()
		br := bufio.NewReader(c)
		for {
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			seen(r.RequestURI)
			if err := r.Write(out); err != nil {
				return
			}
		}
	})
}

// TestPoolReaperClosesIdleConnections: a pooled connection idle for
// UpstreamIdleTimeout is closed; younger ones stay.
func TestPoolReaperClosesIdleConnections(t *testing.T) {
	now := time.Unix(1000, 0)
	u := &upClient{maxIdle: 8, idleFor: time.Hour, now: func() time.Time { return now }}
	defer u.closeIdle(true)
	var peers []net.Conn
	for i := range 3 {
		a, b := net.Pipe()
		peers = append(peers, b)
		u.put(&upConn{c: a, br: bufio.NewReader(a)})
		if i < 2 {
			now = now.Add(30 * time.Minute)
		}
	}
	now = now.Add(time.Minute) // idle 61, 31 and 1 minutes
	u.reap()
	if len(u.idle) != 2 {
		t.Fatalf("%d pooled after the reap, want 2", len(u.idle))
	}
	if _, err := peers[0].Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the expired connection is open: %v", err)
	}
	now = now.Add(time.Hour)
	u.reap()
	if len(u.idle) != 0 {
		t.Fatalf("%d pooled, want none", len(u.idle))
	}
	if u.reaperArmed {
		t.Error("the reaper stays armed over an empty pool")
	}
}

func TestReadHeadAndRepairFraming(t *testing.T) {
	for _, c := range []struct{ in, head, out string }{
		{in: "HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody", head: "HTTP/1.1 200 OK\r\nA: b\r\n\r\n", out: "HTTP/1.1 200 OK\r\nA: b\r\n\r\n"},
		{in: "HTTP/1.1 200 OK\nA: b\n\nbody", head: "HTTP/1.1 200 OK\nA: b\n\n", out: "HTTP/1.1 200 OK\nA: b\n\n"},
		{in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: string\r\nContent-Length: 3\r\n\r\nabc",
			head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: string\r\nContent-Length: 3\r\n\r\n",
			out:  "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"},
		{in: "HTTP/1.1 200 OK\r\ntransfer-encoding : gzip\r\nX: y\r\n\r\n",
			head: "HTTP/1.1 200 OK\r\ntransfer-encoding : gzip\r\nX: y\r\n\r\n",
			out:  "HTTP/1.1 200 OK\r\nX: y\r\n\r\n"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
			head: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
			out:  "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n", head: "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n",
			out: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", head: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
			out: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"},
	} {
		head, err := readHead(bufio.NewReaderSize(strings.NewReader(c.in), 16), 1<<10)
		if err != nil || string(head) != c.head {
			t.Errorf("readHead(%q) = %q, %v; want %q", c.in, head, err, c.head)
			continue
		}
		if got := frontdoor.RepairFraming(head); string(got) != c.out {
			t.Errorf("RepairFraming(%q) = %q, want %q", head, got, c.out)
		}
	}
	if _, err := readHead(bufio.NewReaderSize(strings.NewReader("HTTP/1.1 200 OK\r\nA: "+strings.Repeat("b", 100)+"\r\n\r\n"), 16), 64); err != errHeadTooLarge {
		t.Errorf("a head over the limit: %v", err)
	}
	for in, want := range map[string]bool{
		"HTTP/1.1 200 OK\r\ntransfer-encoding : x\r\n": true, "HTTP/1.1 200 OK\r\nX: y\r\nTransfer-Encoding:x": true,
		"Transfer-Encoding: x\r\n": false, "HTTP/1.1 200 OK\r\nX-Transfer-Encoding: x\r\n": false, "": false,
	} {
		if got := hasHeaderLine([]byte(in), "Transfer-Encoding"); got != want {
			t.Errorf("hasHeaderLine(%q) = %v", in, got)
		}
	}
	if _, err := readHead(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nA: b")), 64); err != io.EOF {
		t.Errorf("a head cut short: %v", err)
	}
}

// FuzzRepairFraming: any head repairs without a panic into one that keeps
// its status line and, once repaired, frames the body at most one way.
func FuzzRepairFraming(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: string\r\nContent-Length: 3\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3, 3\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\nContent-Length: 3\nContent-Length: 3\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		head, err := readHead(bufio.NewReaderSize(bytes.NewReader(in), 16), 4<<10)
		if err != nil {
			return
		}
		out := frontdoor.RepairFraming(head)
		first := bytes.SplitAfter(head, []byte("\n"))[0]
		if !bytes.HasPrefix(out, first) {
			t.Fatalf("status line lost: %q -> %q", head, out)
		}
		if !bytes.HasSuffix(out, []byte("\n")) {
			t.Fatalf("head end lost: %q -> %q", head, out)
		}
	})
}

// TestArmKeepsBoundsWithinAnEighth: a deadline is moved only when the one
// set is later than asked, or more than an eighth of the timeout early;
// the connection's own deadline is what arm recorded.
func TestArmKeepsBoundsWithinAnEighth(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	uc := &upConn{c: a}
	t0 := time.Now()
	uc.arm(false, t0, 80*time.Millisecond)
	if !uc.readDL.Equal(t0.Add(80 * time.Millisecond)) {
		t.Fatalf("first arm: %v", uc.readDL.Sub(t0))
	}
	uc.arm(false, t0.Add(5*time.Millisecond), 80*time.Millisecond) // 5 ms spent: kept
	if !uc.readDL.Equal(t0.Add(80 * time.Millisecond)) {
		t.Fatalf("moved after 5 ms of 80: %v", uc.readDL.Sub(t0))
	}
	uc.arm(false, t0.Add(11*time.Millisecond), 80*time.Millisecond) // more than an eighth: moved
	if !uc.readDL.Equal(t0.Add(91 * time.Millisecond)) {
		t.Fatalf("kept after 11 ms of 80: %v", uc.readDL.Sub(t0))
	}
	uc.arm(false, t0.Add(11*time.Millisecond), 20*time.Millisecond) // a shorter bound: moved in
	if !uc.readDL.Equal(t0.Add(31 * time.Millisecond)) {
		t.Fatalf("a shorter bound kept the later deadline: %v", uc.readDL.Sub(t0))
	}
	// The pipe's own deadline is the one recorded: a read times out by it.
	start := time.Now()
	_, err := a.Read(make([]byte, 1))
	if !isTimeout(err) || time.Since(start) > 5*time.Second {
		t.Fatalf("read after arm: %v after %v", err, time.Since(start))
	}
	if uc.writeDL != (time.Time{}) {
		t.Fatal("arming the read deadline set the write deadline")
	}
}

// TestPoolKeepsAtMostMaxIdle: after a burst wider than the pool, the pool
// keeps Options.MaxIdleConnsPerHost connections; the next burst as wide
// reuses those and dials the rest.
func TestPoolKeepsAtMostMaxIdle(t *testing.T) {
	u := newPoolUpstream(t, "127.0.0.1:0")
	base, s := startSidecar(t, "http://"+u.addr, func(o *Options) {
		o.MaxIdleConnsPerHost, o.UpstreamIdleTimeout = 2, time.Hour
		o.EventLoop = false // upClient's pool; TestEventLoopPoolKeepsAtMostMaxIdle is the loop's
	})
	burstOf(t, base, u, 6)
	s.up.mu.Lock()
	idle := len(s.up.idle)
	s.up.mu.Unlock()
	if idle != 2 {
		t.Fatalf("%d idle connections after a burst of 6, want 2", idle)
	}
	before := u.accepted.Load()
	burstOf(t, base, u, 6)
	if got := u.accepted.Load() - before; got != 4 {
		t.Fatalf("the second burst dialed %d connections, want 4", got)
	}
}
