//go:build linux

package proxy

import (
	"net"
	"testing"
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
