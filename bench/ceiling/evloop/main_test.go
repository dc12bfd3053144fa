//go:build linux

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/ceiling/internal/ceilingtest"
)

// startProxy runs an event loop forwarding to upstream on a loopback port
// until the test ends, then stops it and waits for it, and returns its
// address.
func startProxy(t *testing.T, upstream string) string {
	t.Helper()
	s, err := listen(netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort(upstream))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.serve() }()
	t.Cleanup(func() {
		s.shutdown()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s.addr.String()
}

// TestWork: with -work the loop runs the sidecar's per-request code on
// every request (the engine hooks hear each request and its answer, the
// metrics count it) and the answers are the same.
func TestWork(t *testing.T) {
	up := upstreamAddr(t, nil)
	s, err := listen(netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort(up))
	if err != nil {
		t.Fatal(err)
	}
	s.work = newWork()
	done := make(chan error, 1)
	go func() { done <- s.serve() }()
	c := ceilingtest.Dial(t, s.addr.String())
	const n = 5
	for i := range n {
		body := ceilingtest.ChatBody("m", fmt.Sprintf("hi %d", i), false)
		if r := c.Do("POST", ceilingtest.ChatPath, body); r.Status != 200 || r.Body != ceilingtest.ChatAnswer(body) {
			t.Fatalf("request %d: %d %q", i, r.Status, r.Body)
		}
	}
	c.Close()
	s.shutdown()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := s.work.conn.Stats()
	if st.Requests != n || st.Responses != n || s.work.requests.Get() != n || s.work.bad != 0 {
		t.Fatalf("engine heard %d requests and %d answers, metrics counted %d, %d refused; want %d each, none refused",
			st.Requests, st.Responses, s.work.requests.Get(), s.work.bad, n)
	}
}

func upstreamAddr(t *testing.T, hold <-chan struct{}) string {
	return ceilingtest.NewUpstream(t, hold).Listener.Addr().String()
}

// TestRelay: answers, streamed ones included, pass through unchanged,
// statuses included, on one keep-alive connection.
func TestRelay(t *testing.T) {
	up := upstreamAddr(t, nil)
	ceilingtest.CheckRelay(t, startProxy(t, up), up, true)
}

// TestPipelined: requests written in one write on one connection are all
// answered, in order.
func TestPipelined(t *testing.T) {
	addr := startProxy(t, upstreamAddr(t, nil))
	c := ceilingtest.Dial(t, addr)
	conn, br := c.Raw()
	bodies := []string{
		ceilingtest.ChatBody("m", "first", false),
		ceilingtest.ChatBody("m", "second", true),
		ceilingtest.ChatBody("m", "third", false),
	}
	want := []string{ceilingtest.ChatAnswer(bodies[0]), ceilingtest.StreamAnswer("m"), ceilingtest.ChatAnswer(bodies[2])}
	var buf bytes.Buffer
	reqs := make([]*http.Request, len(bodies))
	for i, b := range bodies {
		reqs[i] = ceilingtest.NewRequest(t, "POST", addr, ceilingtest.ChatPath, b)
		if err := reqs[i].Write(&buf); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	for i, req := range reqs {
		r := ceilingtest.ReadResponse(t, br, req)
		if r.Status != 200 || r.Body != want[i] {
			t.Fatalf("answer %d: %d %q, want 200 %q", i, r.Status, r.Body, want[i])
		}
	}
}

// TestStreamedAsItArrives: a streamed answer's first event reaches the client
// while the upstream still holds the rest back.
func TestStreamedAsItArrives(t *testing.T) {
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	addr := startProxy(t, upstreamAddr(t, hold))
	c := ceilingtest.Dial(t, addr)
	conn, br := c.Raw()
	req := ceilingtest.NewRequest(t, "POST", addr, ceilingtest.ChatPath, ceilingtest.ChatBody("m", "hi", true))
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len(ceilingtest.StreamEvent("m", 0)))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatalf("first event: %v", err)
	}
	release()
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(first) + string(rest); got != ceilingtest.StreamAnswer("m") {
		t.Fatalf("streamed %q", got)
	}
}

const (
	keepOpen         = iota // the upstream keeps its connections open
	closeAfterAnswer        // the upstream closes each connection after its first answer
	closeOnSecond           // the upstream closes a connection on its second request, unanswered
	closeDelimited          // the upstream answers without a length and closes
)

// rawUpstream serves keep-alive answers "conn<N>" (Content-Length; N counts
// connections from 1) that close their connection as mode says, until the
// test ends, and returns its address.
func rawUpstream(t *testing.T, mode int) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 1; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if _, err := io.Copy(io.Discard, req.Body); err != nil {
						return
					}
					if mode == closeOnSecond && i == 2 {
						return
					}
					body := fmt.Sprintf("conn%d", n)
					if mode == closeDelimited {
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n%s", body)
						return
					}
					if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
						return
					}
					if mode == closeAfterAnswer {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestUpstreamReuse: requests one after another reuse one upstream
// connection, and a pooled upstream connection that the upstream closed does
// not fail the next request. After closeAfterAnswer the loop sees the close
// either while the connection is idle (and drops it) or when it reuses it
// (and resends); closeOnSecond always takes the resend path.
func TestUpstreamReuse(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode int
		conn func(i int) int // the upstream connection that answers request i
	}{
		{"keep open", keepOpen, func(int) int { return 1 }},
		// Every upstream connection answers once, so request i is answered
		// on connection i.
		{"close after answer", closeAfterAnswer, func(i int) int { return i }},
		{"close on second request", closeOnSecond, func(i int) int { return i }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ceilingtest.Dial(t, startProxy(t, rawUpstream(t, tc.mode)))
			for i := 1; i <= 5; i++ {
				r := c.Do("POST", ceilingtest.ChatPath, ceilingtest.ChatBody("m", "hi", false))
				if want := fmt.Sprintf("conn%d", tc.conn(i)); r.Status != 200 || r.Body != want {
					t.Fatalf("request %d: %d %q, want 200 %q", i, r.Status, r.Body, want)
				}
			}
		})
	}
}

// TestCloseDelimited: an answer framed by the upstream's close is relayed
// whole, and the client connection closes after it.
func TestCloseDelimited(t *testing.T) {
	addr := startProxy(t, rawUpstream(t, closeDelimited))
	for i := 1; i <= 3; i++ {
		c := ceilingtest.Dial(t, addr)
		r := c.Do("POST", ceilingtest.ChatPath, ceilingtest.ChatBody("m", "hi", false))
		if want := fmt.Sprintf("conn%d", i); r.Status != 200 || r.Body != want {
			t.Fatalf("request %d: %d %q, want 200 %q", i, r.Status, r.Body, want)
		}
		conn, br := c.Raw()
		if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err == nil {
			if _, err := br.ReadByte(); err == nil {
				t.Fatalf("request %d: the client connection stays open after a close-delimited answer", i)
			}
		}
		c.Close()
	}
}

// TestUpstreamWithoutKeepAlive: when the upstream closes every connection
// (Connection: close), a keep-alive net/http client still gets every answer.
func TestUpstreamWithoutKeepAlive(t *testing.T) {
	up := ceilingtest.NewUpstream(t, nil)
	up.Config.SetKeepAlivesEnabled(false)
	addr := startProxy(t, up.Listener.Addr().String())
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for i := range 5 {
		body := ceilingtest.ChatBody("m", fmt.Sprint(i), false)
		resp, err := client.Post("http://"+addr+ceilingtest.ChatPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if want := ceilingtest.ChatAnswer(body); resp.StatusCode != 200 || string(b) != want {
			t.Fatalf("request %d: %d %q, want 200 %q", i, resp.StatusCode, b, want)
		}
	}
}

// TestHead: the answer to HEAD has no body whatever its Content-Length says,
// and the connection goes on.
func TestHead(t *testing.T) {
	c := ceilingtest.Dial(t, startProxy(t, upstreamAddr(t, nil)))
	for range 2 {
		if r := c.Do("HEAD", ceilingtest.ChatPath, ""); r.Status != http.StatusNotFound || r.Body != "" || r.Close {
			t.Fatalf("HEAD: %d %q close=%v", r.Status, r.Body, r.Close)
		}
		body := ceilingtest.ChatBody("m", "hi", false)
		if r := c.Do("POST", ceilingtest.ChatPath, body); r.Status != 200 || r.Body != ceilingtest.ChatAnswer(body) {
			t.Fatalf("POST after HEAD: %d %q", r.Status, r.Body)
		}
	}
}

// TestClientGoneMidStream: a client that leaves in the middle of a streamed
// answer costs the loop nothing: the next client is served.
func TestClientGoneMidStream(t *testing.T) {
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	addr := startProxy(t, upstreamAddr(t, hold))
	c := ceilingtest.Dial(t, addr)
	conn, br := c.Raw()
	req := ceilingtest.NewRequest(t, "POST", addr, ceilingtest.ChatPath, ceilingtest.ChatBody("long", "hi", true))
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	release()
	ceilingtest.CheckConcurrent(t, addr, 4, 4, true)
}

// TestChunkedRequest: a request body in chunked encoding is refused with 501.
func TestChunkedRequest(t *testing.T) {
	c := ceilingtest.Dial(t, startProxy(t, upstreamAddr(t, nil)))
	conn, br := c.Raw()
	const req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("status %d, want 501", resp.StatusCode)
	}
}

// TestConcurrent: answers on connections served at once do not mix.
func TestConcurrent(t *testing.T) {
	ceilingtest.CheckConcurrent(t, startProxy(t, upstreamAddr(t, nil)), 16, 10, true)
}

// TestUpstreamDown: a refused upstream connection is a 502.
func TestUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	c := ceilingtest.Dial(t, startProxy(t, dead))
	if r := c.Do("POST", ceilingtest.ChatPath, ceilingtest.ChatBody("m", "hi", false)); r.Status != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", r.Status)
	}
}

// TestShutdownBeforeServe: shutdown before serve makes serve return at once.
func TestShutdownBeforeServe(t *testing.T) {
	s, err := listen(netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	s.shutdown()
	if err := s.serve(); err != nil {
		t.Fatal(err)
	}
	s.shutdown()
}

// TestChunkDec: the chunked-body tracker finds the end of a body (extensions,
// bare LFs and trailers included) whether the bytes come at once or one by
// one, and flags bad framing.
func TestChunkDec(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		end      int // bytes of in that belong to the body; -1: not complete
		bad      bool
	}{
		{"last chunk only", "0\r\n\r\n", 5, false},
		{"extension and trailer", "5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: t\r\n\r\nNEXT", 67, false},
		{"bare LF", "3\nabc\n0\n\nNEXT", 9, false},
		{"upper-case hex", "A\r\n0123456789\r\n0\r\n\r\n", 20, false},
		{"incomplete", "5\r\nhel", -1, false},
		{"not hex", "zz\r\n", -1, true},
		{"no CRLF after data", "3\r\nabcX\r\n0\r\n\r\n", -1, true},
		{"size overflow", "11111111111111111\r\n", -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(how string, n int, done, bad bool) {
				t.Helper()
				switch {
				case bad != tc.bad:
					t.Errorf("%s: bad %v, want %v", how, bad, tc.bad)
				case tc.bad:
				case tc.end < 0 && (done || n != len(tc.in)):
					t.Errorf("%s: done %v after %d bytes, want all %d consumed", how, done, n, len(tc.in))
				case tc.end >= 0 && (!done || n != tc.end):
					t.Errorf("%s: done %v after %d bytes, want done after %d", how, done, n, tc.end)
				}
			}
			var d chunkDec
			n, done, bad := d.feed([]byte(tc.in))
			check("at once", n, done, bad)

			d = chunkDec{}
			n, done, bad = 0, false, false
			for i := 0; i < len(tc.in) && !done && !bad; i++ {
				k, dn, bd := d.feed([]byte(tc.in[i : i+1]))
				n, done, bad = n+k, dn, bd
			}
			check("byte by byte", n, done, bad)
		})
	}
}
