package sidecartest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

func TestRecordingUpstreamEchoesAndKeeps(t *testing.T) {
	u := NewRecordingUpstream(t)
	resp, b := Post(t, u.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"echo: hi"`) {
		t.Fatalf("plain: %d %s", resp.StatusCode, b)
	}
	resp, b = Post(t, u.URL+"/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"yo"}]}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"yo"`) || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	if got := u.Last(); got != `[{"role":"user","content":"yo"}]` {
		t.Fatalf("Last = %s", got)
	}
	// A session request asking for compression is refused, and not kept.
	resp, _ = Post(t, u.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"z"}]}`, map[string]string{"X-Session-ID": "s", "Accept-Encoding": "gzip"})
	if resp.StatusCode != 400 {
		t.Fatalf("compressed session request: %d", resp.StatusCode)
	}
	if n := len(u.Bodies()); n != 2 {
		t.Fatalf("%d bodies kept, want 2", n)
	}
}

func TestWantOpenAIErrorAndGetJSON(t *testing.T) {
	srv := &closingServer{http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("Authorization") != "Bearer k" {
			w.WriteHeader(401)
			fmt.Fprint(w, `{"error":{"message":"no key","type":"invalid_request_error","code":"missing_api_key"}}`)
			return
		}
		fmt.Fprint(w, `{"n":7}`)
	})}}
	base := ServeSidecar(t, srv.Serve, func(ln net.Listener) error { return nil }, func(ctx context.Context) { _ = srv.Shutdown(ctx) })
	if a := AdminURL(t, base); !strings.HasPrefix(a, "http://127.0.0.1:") || a == base {
		t.Fatalf("AdminURL = %q (base %q)", a, base)
	}
	var v struct{ N int }
	if code := GetJSON(t, base+"/x", "k", &v); code != 200 || v.N != 7 {
		t.Fatalf("GetJSON: %d %+v", code, v)
	}
	resp, b := Post(t, base+"/x", "{}", nil)
	WantOpenAIError(t, resp, b, 401, "missing_api_key")
}

// closingServer is an http.Server whose Serve returns nil once closed,
// as the RESP store's does.
type closingServer struct{ http.Server }

func (s *closingServer) Serve(ln net.Listener) error {
	if err := s.Server.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func TestServe(t *testing.T) {
	s := &closingServer{http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") })}}
	addr := Serve(t, s)
	resp, err := NoPoolClient.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); string(b) != "up" {
		t.Fatalf("served %q", b)
	}
}

func TestServeConnsHandlesEachConnection(t *testing.T) {
	var n atomic.Int32
	addr := ServeConns(t, func(c net.Conn) {
		n.Add(1)
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		_, _ = c.Write(bytes.ToUpper(b))
	})
	for i := range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c) // the connection closes once handle returns
		c.Close()
		if err != nil || string(got) != "PING" {
			t.Fatalf("connection %d: %q, %v", i, got, err)
		}
	}
	if n.Load() != 3 {
		t.Fatalf("%d connections handled, want 3", n.Load())
	}
}
