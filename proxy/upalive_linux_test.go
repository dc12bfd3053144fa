//go:build linux

package proxy

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

// TestConnProbe: a quiet open connection is alive; one with bytes no
// request asked for, or one its peer closed, is not.
func TestConnProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (*connProbe, net.Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		peer, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = peer.Close() })
		p := new(connProbe)
		p.init(c)
		return p, peer
	}

	p, peer := pair()
	if !p.alive() || !p.alive() {
		t.Fatal("a quiet open connection is not alive")
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return !p.alive() })

	p, peer = pair()
	_ = peer.Close()
	eventually(t, func() bool { return !p.alive() })

	if !new(connProbe).alive() {
		t.Error("the zero probe is not alive")
	}
}

// BenchmarkConnProbe is the check a pooled connection gets on checkout.
func BenchmarkConnProbe(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	peer, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
	var p connProbe
	p.init(c)
	b.ReportAllocs()
	for b.Loop() {
		if !p.alive() {
			b.Fatal("dead")
		}
	}
}

// TestConnProbeOnRawConn: the probe and connBroken read a rawconn.Conn
// (every upstream connection is one) as a net.TCPConn: a peek does not
// consume the byte it sees, and a closed or reset connection's errors are
// broken ones (a request on it is sent again).
func TestConnProbeOnRawConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (net.Conn, *net.TCPConn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		peer, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		raw := rawconn.New(c)
		if _, ok := raw.(*rawconn.Conn); !ok {
			t.Fatalf("rawconn.New made a %T", raw)
		}
		t.Cleanup(func() { _ = raw.Close(); _ = peer.Close() })
		return raw, peer.(*net.TCPConn)
	}
	raw, peer := pair()
	var p connProbe
	p.init(raw)
	if !p.alive() {
		t.Fatal("an open, quiet connection is not alive")
	}
	_, _ = peer.Write([]byte("x"))
	eventually(t, func() bool { return !p.alive() }) // bytes no request asked for
	b := make([]byte, 1)
	if n, err := raw.Read(b); n != 1 || err != nil || b[0] != 'x' {
		t.Fatalf("the peek consumed the byte: %d %q %v", n, b, err)
	}

	done := make(chan error, 1)
	go func() { _, err := raw.Read(b); done <- err }()
	time.Sleep(20 * time.Millisecond)
	_ = raw.Close()
	if err := <-done; !connBroken(err) {
		t.Fatalf("a Read on a closed connection failed with %v: not broken", err)
	}

	raw, peer = pair()
	_ = peer.SetLinger(0)
	_ = peer.Close() // RST
	for range 100 {
		if _, err = raw.Read(b); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) || !connBroken(err) {
		t.Fatalf("a Read after a reset failed with %v: not broken", err)
	}
}

// TestProxyConnectionsAreRaw: the upstream's connections are rawconn
// Conns, and so are the clients' under the front door's Conn.
func TestProxyConnectionsAreRaw(t *testing.T) {
	u := newPoolUpstream(t, "127.0.0.1:0")
	base, s := startSidecar(t, "http://"+u.addr, func(o *Options) { o.EventLoop = false }) // the loop has a pool of its own
	burstOf(t, base, u, 1)
	s.up.mu.Lock()
	defer s.up.mu.Unlock()
	if len(s.up.idle) == 0 {
		t.Fatal("no pooled connection")
	}
	if _, ok := s.up.idle[0].c.(*rawconn.Conn); !ok {
		t.Fatalf("the upstream connection is %T", s.up.idle[0].c)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	c, err := s.FrontListener(ln).Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if h, ok := asTailHolder(c); !ok {
		t.Fatalf("the client connection under %T is no rawconn.Conn (%T)", c, h)
	}
}
