package main

import (
	"net"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/ceiling/internal/ceilingtest"
)

// startProxy serves a proxy to upstream on a loopback port until the test
// ends and returns its address.
func startProxy(t *testing.T, upstream string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(upstream)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.serve(ln)
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done // every client connection has gone: the tests close theirs first
		p.closeIdle()
	})
	return ln.Addr().String()
}

func upstreamAddr(t *testing.T) string {
	return ceilingtest.NewUpstream(t, nil).Listener.Addr().String()
}

// TestRelay: Content-Length answers (netproxy frames nothing else) pass
// through unchanged, statuses included, on one keep-alive connection.
func TestRelay(t *testing.T) {
	up := upstreamAddr(t)
	ceilingtest.CheckRelay(t, startProxy(t, up), up, false)
}

// TestConcurrent: answers on connections served at once, which share the
// idle upstream connections, do not mix.
func TestConcurrent(t *testing.T) {
	ceilingtest.CheckConcurrent(t, startProxy(t, upstreamAddr(t)), 16, 10, false)
}

// TestNegativeContentLength: a request claiming a negative Content-Length
// loses its connection (it used to panic the whole process), and the proxy
// goes on serving.
func TestNegativeContentLength(t *testing.T) {
	addr := startProxy(t, upstreamAddr(t))
	c := ceilingtest.Dial(t, addr)
	conn, br := c.Raw()
	if _, err := conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if b, err := br.ReadByte(); err == nil {
		t.Fatalf("read %q, want the connection closed", b)
	}
	body := ceilingtest.ChatBody("m", "hi", false)
	if r := ceilingtest.Dial(t, addr).Do("POST", ceilingtest.ChatPath, body); r.Status != 200 || r.Body != ceilingtest.ChatAnswer(body) {
		t.Fatalf("next connection: %d %q", r.Status, r.Body)
	}
}
