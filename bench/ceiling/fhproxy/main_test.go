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
	s, hc := newServer(upstream)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		if err := s.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		hc.CloseIdleConnections()
	})
	return ln.Addr().String()
}

func upstreamAddr(t *testing.T) string {
	return ceilingtest.NewUpstream(t, nil).Listener.Addr().String()
}

// TestRelay: answers, streamed ones included (buffered whole by HostClient),
// pass through unchanged, statuses included, on one keep-alive connection.
func TestRelay(t *testing.T) {
	up := upstreamAddr(t)
	ceilingtest.CheckRelay(t, startProxy(t, up), up, true)
}

// TestConcurrent: answers on connections served at once do not mix.
func TestConcurrent(t *testing.T) {
	ceilingtest.CheckConcurrent(t, startProxy(t, upstreamAddr(t)), 16, 10, true)
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
	if r := c.Do("POST", ceilingtest.ChatPath, ceilingtest.ChatBody("m", "hi", false)); r.Status != 502 {
		t.Fatalf("status %d, want 502", r.Status)
	}
}
