//go:build linux

package frontdoor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
)

// recBackend admits POSTs to /serve whose body is not "hand over", and
// records what it hears.
type recBackend struct {
	mu      sync.Mutex
	events  []string
	retries int
}

func (b *recBackend) log(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, fmt.Sprintf(format, args...))
}

func (b *recBackend) seen() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.events, "|")
}

func (b *recBackend) Eligible(r *Request) bool {
	if r.Body != nil {
		b.log("eligible with a body")
	}
	r.Route = 7
	return string(r.Head.Method(r.Buf)) == "POST" && string(r.Head.Target(r.Buf)) == "/serve"
}

func (b *recBackend) Start(r *Request) bool {
	if string(r.Body) == "hand over" {
		return false
	}
	if r.Start.IsZero() || r.Route != 7 {
		b.log("start without its clock or route")
	}
	b.log("start %s", r.Body)
	r.Send = append([]byte("sent:"), r.Body...)
	r.Uncompressed = true
	return true
}

func (b *recBackend) End(r *Request, status int, body []byte) {
	if r.End.Before(r.Start) {
		b.log("end before start")
	}
	b.log("end %d %s", status, body)
}

func (b *recBackend) Fail(_ *Request, f Failure) (int, []byte) {
	b.log("fail %d", f.Kind)
	return 502, []byte(fmt.Sprintf(`{"failure":%d}`, f.Kind))
}

func (b *recBackend) Retried() {
	b.mu.Lock()
	b.retries++
	b.mu.Unlock()
}

// loopUpstream echoes each request it receives, or, for a body naming an
// answer in raws, writes that answer raw and closes.
func loopUpstream(t *testing.T, raws map[string]string) netip.AddrPort {
	t.Helper()
	addr := sidecartest.ServeConns(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			body, _ := io.ReadAll(req.Body)
			if raw, ok := raws[strings.TrimPrefix(string(body), "sent:")]; ok {
				_, _ = io.WriteString(c, raw)
				return // and close
			}
			echo := fmt.Sprintf("%s %s ae=%q %s", req.Method, req.RequestURI, req.Header.Get("Accept-Encoding"), body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(echo), echo)
		}
	})
	return netip.MustParseAddrPort(addr)
}

// startTestLoop starts a loop in front of up with b, and a server behind
// it that answers each handed-over request "behind: METHOD target body".
func startTestLoop(t *testing.T, up netip.AddrPort, b Backend, mod func(*LoopOptions)) (*Loop, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := LoopOptions{Upstream: up, BasePath: "/base", Host: "up", MaxBody: 1 << 10, MaxAnswer: 1 << 10,
		UpstreamTimeout: 5 * time.Second, StreamIdleTimeout: 5 * time.Second, Front: Options{ReadTimeout: 5 * time.Second}}
	if mod != nil {
		mod(&o)
	}
	l, err := StartLoop(ln.(*net.TCPListener), o, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l.Shutdown(ctx)
		_ = l.Close()
	})
	go func() { // the server behind: the connections handed over, through the front door
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if _, ok := c.(*Conn); !ok {
				t.Errorf("handed over a %T, want a *Conn", c)
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					body, _ := io.ReadAll(req.Body)
					msg := fmt.Sprintf("behind: %s %s %s", req.Method, req.RequestURI, body)
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
				}
			}()
		}
	}()
	return l, ln.Addr().String()
}

// exchange sends raw on a new connection and reads one answer: its status
// and body.
func exchange(t *testing.T, addr, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, raw)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "no answer: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}

func post(target, body string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s", target, len(body), body)
}

// TestLoopServesWhatItsBackendAdmits: an eligible request the Backend
// starts is sent upstream as the Backend says (its body, no
// Accept-Encoding, the base path) and ends once; one it does not admit,
// by its head or by its body, reaches the server behind whole, through a
// Conn.
func TestLoopServesWhatItsBackendAdmits(t *testing.T) {
	b := &recBackend{}
	l, addr := startTestLoop(t, loopUpstream(t, nil), b, nil)
	if got := exchange(t, addr, post("/serve", "hi")); got != `200 POST /base/serve ae="" sent:hi` {
		t.Errorf("served: %s", got)
	}
	if got := exchange(t, addr, post("/other", "hi")); got != "200 behind: POST /other hi" {
		t.Errorf("not eligible: %s", got)
	}
	if got := exchange(t, addr, post("/serve", "hand over")); got != "200 behind: POST /serve hand over" {
		t.Errorf("not started: %s", got)
	}
	if got := exchange(t, addr, "GET /serve HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"); got != "200 behind: GET /serve hi" {
		t.Errorf("chunked: %s", got)
	}
	if served, handed := l.Counts(); served != 1 || handed != 3 {
		t.Errorf("served %d, handed over %d; want 1 and 3", served, handed)
	}
	if got, want := b.seen(), "start hi|end 200 POST /base/serve ae=\"\" sent:hi"; got != want {
		t.Errorf("the backend heard %q, want %q", got, want)
	}
}

// TestLoopFailures: each way an exchange fails reaches the Backend's Fail
// once, with its kind, and the client reads the Backend's error body.
func TestLoopFailures(t *testing.T) {
	raws := map[string]string{
		"nothing":   "",
		"cut head":  "HTTP/1.1 200 OK\r\nContent-Le",
		"garbage":   "hello\r\n\r\n",
		"bad chunk": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"too large": "HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("x", 2000),
		"cut body":  "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
	}
	up := loopUpstream(t, raws)
	for body, want := range map[string]FailKind{
		"nothing": FailNoAnswer, "cut head": FailCutHead, "garbage": FailBadHead,
		"bad chunk": FailBody, "too large": FailTooLarge, "cut body": FailBody,
	} {
		b := &recBackend{}
		_, addr := startTestLoop(t, up, b, nil)
		if got := exchange(t, addr, post("/serve", body)); got != fmt.Sprintf(`502 {"failure":%d}`, want) {
			t.Errorf("%s: the client read %s", body, got)
		}
		if got := b.seen(); got != fmt.Sprintf("start %s|fail %d", body, want) {
			t.Errorf("%s: the backend heard %q", body, got)
		}
	}

	t.Run("refused", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		dead := netip.MustParseAddrPort(ln.Addr().String())
		_ = ln.Close()
		b := &recBackend{}
		_, addr := startTestLoop(t, dead, b, nil)
		if got := exchange(t, addr, post("/serve", "x")); got != fmt.Sprintf(`502 {"failure":%d}`, FailDial) {
			t.Errorf("the client read %s", got)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		hold := make(chan struct{})
		defer close(hold)
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err == nil {
				<-hold
				c.Close()
			}
		}()
		b := &recBackend{}
		_, addr := startTestLoop(t, netip.MustParseAddrPort(ln.Addr().String()), b, nil)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, post("/serve", "x"))
		waitFor(t, func() bool { return b.seen() == "start x" })
		_ = c.Close()
		waitFor(t, func() bool { return b.seen() == fmt.Sprintf("start x|fail %d", FailClientGone) })
	})
	t.Run("read timeout", func(t *testing.T) {
		b := &recBackend{}
		_, addr := startTestLoop(t, up, b, func(o *LoopOptions) { o.Front.ReadTimeout = 200 * time.Millisecond })
		if got := exchange(t, addr, "POST /serve HTTP/1.1\r\nHost: x\r\n"); !strings.HasPrefix(got, "408 ") || !strings.Contains(got, "request_timeout") {
			t.Errorf("a head that stops: %s", got)
		}
		if got := b.seen(); got != "" {
			t.Errorf("the backend heard %q of a request it never saw", got)
		}
	})
}

// TestLoopOptions: an upstream without an address or a Host is refused.
func TestLoopOptions(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, o := range []LoopOptions{{Host: "h"}, {Upstream: netip.MustParseAddrPort("127.0.0.1:1")}} {
		if _, err := StartLoop(ln.(*net.TCPListener), o, &recBackend{}); err == nil {
			t.Errorf("StartLoop(%+v) started", o)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
