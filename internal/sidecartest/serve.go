package sidecartest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// ServeSidecar serves a test sidecar on two loopback ports until the test
// ends: serve on the main listener, whose base URL ("http://" and its
// address) it returns, and serveAdmin on the admin listener, whose URL
// AdminURL gives for that base URL. An error from serve fails the test
// ("serve: …"), one from serveAdmin too ("serve admin: …"). When the test
// ends, shutdown runs with a 5 s deadline, the admin listener is closed
// (in case serveAdmin had not taken it), and both serves are waited for.
func ServeSidecar(t testing.TB, serve, serveAdmin func(net.Listener) error, shutdown func(context.Context)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	adminURLs.Store(base, "http://"+aln.Addr().String())
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		if err := serve(ln); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		if err := serveAdmin(aln); err != nil {
			t.Errorf("serve admin: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shutdown(ctx)
		_ = aln.Close()
		<-done
		<-done
		adminURLs.Delete(base)
	})
	return base
}

// adminURLs maps the base URL of each sidecar ServeSidecar serves to its
// admin listener's URL, until its test ends.
var adminURLs sync.Map

// AdminURL is the admin listener's URL of the sidecar ServeSidecar serves
// at base.
func AdminURL(t testing.TB, base string) string {
	t.Helper()
	a, ok := adminURLs.Load(base)
	if !ok {
		t.Fatalf("no admin listener for %s", base)
	}
	return a.(string)
}

// Server is what Serve serves: Serve takes the listener and returns once
// Close was called, with nil.
type Server interface {
	Serve(net.Listener) error
	Close() error
}

// Serve serves s on a loopback port until the test ends and returns the
// port's address. When the test ends it closes s, and fails the test if
// Close or Serve returns an error.
func Serve(t testing.TB, s Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}

// ServeConns listens on a loopback port and runs handle on each
// connection it accepts, each in its own goroutine, closing the
// connection when handle returns: a scripted peer speaking raw bytes.
// When the test ends it closes the listener and waits for every handle
// (a handle blocked on its connection must return once the peer closes).
// It returns the port's address.
func ServeConns(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}
