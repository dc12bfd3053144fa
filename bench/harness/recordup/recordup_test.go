package recordup

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func start(t *testing.T, o Options) *Proxy {
	t.Helper()
	p, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// echo answers with the method, path and body it got; /sse streams three
// events.
func echo(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/base/sse" {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				io.WriteString(w, "data: "+strings.Repeat("x", i+1)+"\n\n")
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("X-Seen", r.Header.Get("X-Client"))
		io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+string(b))
	}))
	t.Cleanup(up.Close)
	return up
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("X-Client", "c1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestForwardsAndRecords(t *testing.T) {
	up := echo(t)
	p := start(t, Options{Upstream: up.URL + "/base"})
	if code, body := post(t, p.URL()+"/v1/chat?x=1", `{"a":1}`); code != 200 || body != `POST /base/v1/chat?x=1 {"a":1}` {
		t.Fatalf("got %d %q", code, body)
	}
	if code, body := post(t, p.URL()+"/sse", ""); code != 200 || body != "data: x\n\ndata: xx\n\ndata: xxx\n\n" {
		t.Fatalf("stream: %d %q", code, body)
	}
	rs := finished(t, p, 2)
	if len(rs) != 2 || p.Len() != 2 {
		t.Fatalf("recorded %d", len(rs))
	}
	r := rs[0]
	if r.Seq != 0 || r.Method != "POST" || r.Path != "/v1/chat?x=1" || string(r.Body) != `{"a":1}` || r.Header.Get("X-Client") != "c1" ||
		r.Status != 200 || r.Injected || r.Aborted || r.End.Before(r.Start) {
		t.Fatalf("record: %+v", r)
	}
	if rs[1].Seq != 1 || rs[1].Path != "/sse" || rs[1].Status != 200 {
		t.Fatalf("record: %+v", rs[1])
	}
}

// finished returns the proxy's records once n of them have ended: the
// proxy records the end of a request after the answer's last byte left,
// so the client can read it first.
func finished(t *testing.T, p *Proxy, n int) []Request {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rs := p.Requests()
		done := 0
		for _, r := range rs {
			if !r.End.IsZero() {
				done++
			}
		}
		if done >= n || time.Now().After(deadline) {
			return rs
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFailNextFiresOnce(t *testing.T) {
	up := echo(t)
	p := start(t, Options{Upstream: up.URL + "/base"})
	p.FailNext(func(r Request) bool { return strings.Contains(string(r.Body), "refuse-me") }, 429,
		[]byte(`{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limited"}}`))
	if code, _ := post(t, p.URL()+"/v1/x", "other"); code != 200 {
		t.Fatalf("a request the rule does not match: %d", code)
	}
	if code, body := post(t, p.URL()+"/v1/x", "refuse-me"); code != 429 || !strings.Contains(body, "slow down") {
		t.Fatalf("matched: %d %q", code, body)
	}
	if code, _ := post(t, p.URL()+"/v1/x", "refuse-me"); code != 200 {
		t.Fatalf("the retry: %d", code)
	}
	rs := finished(t, p, 3)
	if len(rs) != 3 || rs[1].Status != 429 || !rs[1].Injected || rs[2].Status != 200 || rs[2].Injected {
		t.Fatalf("records: %+v", rs)
	}
}

func TestRefusesLargeBodies(t *testing.T) {
	p := start(t, Options{Upstream: echo(t).URL, MaxBodyBytes: 10})
	if code, _ := post(t, p.URL()+"/v1/x", strings.Repeat("y", 11)); code != 413 {
		t.Fatalf("got %d", code)
	}
	if rs := finished(t, p, 1); len(rs) != 1 || rs[0].Status != 413 || rs[0].Body != nil {
		t.Fatalf("records: %+v", rs)
	}
}

// waitEOF reads from c until EOF; it fails the test on data or when
// nothing happens for 10 s (a hang guard, not a timing).
func waitEOF(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("read %q, %v; want EOF", b, err)
	}
}

// rawKeepAlive sends one keep-alive request on a new connection and reads
// its answer.
func rawKeepAlive(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	io.WriteString(c, "POST /v1/x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n\r\nhi")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("status %d, close %t", resp.StatusCode, resp.Close)
	}
	return c, br
}

func TestClosesIdleConnections(t *testing.T) {
	p := start(t, Options{Upstream: echo(t).URL, IdleTimeout: 20 * time.Millisecond})
	c, br := rawKeepAlive(t, p.Addr())
	waitEOF(t, c, br)
}

func TestDropConnsClosesIdleConnections(t *testing.T) {
	p := start(t, Options{Upstream: echo(t).URL, IdleTimeout: -1})
	c, br := rawKeepAlive(t, p.Addr())
	p.DropConns()
	waitEOF(t, c, br)
	if code, _ := post(t, p.URL()+"/v1/x", "again"); code != 200 {
		t.Fatalf("after DropConns: %d", code)
	}
}

// An upstream that cannot be reached shows as a connection closed without
// any response, as a dead server's would.
func TestUnreachableUpstreamClosesWithoutResponse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	p := start(t, Options{Upstream: dead})
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /v1/x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n\r\nhi")
	waitEOF(t, c, bufio.NewReader(c))
	if rs := finished(t, p, 1); len(rs) != 1 || rs[0].Status != 0 || rs[0].End.IsZero() || string(rs[0].Body) != "hi" {
		t.Fatalf("records: %+v", rs)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{{}, {Upstream: "ftp://x"}, {Upstream: "http://x", MaxBodyBytes: -1}, {Upstream: "::"}} {
		if _, err := Start(o); err == nil {
			t.Errorf("Start(%+v) accepted", o)
		}
	}
}
