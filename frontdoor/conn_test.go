package frontdoor

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// pair returns a client connection and the server's end read through a
// Conn with o.
func pair(t *testing.T, o Options) (client net.Conn, server *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fl := NewListener(ln, o)
	got := make(chan net.Conn, 1)
	go func() {
		c, err := fl.Accept()
		if err != nil {
			got <- nil
			return
		}
		got <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-got
	if sc == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = client.Close(); _ = sc.Close() })
	return client, sc.(*Conn)
}

// readOne reads one Read's worth from c within a second.
func readOne(t *testing.T, c *Conn) (string, error) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	b := make([]byte, 64<<10)
	n, err := c.Read(b)
	return string(b[:n]), err
}

// TestConnOneRequestPerRead: pipelined requests come out one at a time,
// canonical, and a request whose body has not come yet is not read
// before the one ahead of it was taken whole.
func TestConnOneRequestPerRead(t *testing.T) {
	client, c := pair(t, Options{})
	r1 := "POST /a HTTP/1.1\nHost: h\nContent-Length: 3\n\nabc"
	r2 := "GET /b HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
	r3 := "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n0\r\nX-Session-ID: t\r\n\r\n"
	if _, err := io.WriteString(client, r1+r2+r3[:20]); err != nil {
		t.Fatal(err)
	}
	got, err := readOne(t, c)
	if err != nil || got != "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n" {
		t.Fatalf("head 1: %q %v", got, err)
	}
	if got, err = readOne(t, c); err != nil || got != "abc" {
		t.Fatalf("body 1: %q %v", got, err)
	}
	if got, err = readOne(t, c); err != nil || got != "GET /b HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" {
		t.Fatalf("request 2: %q %v", got, err)
	}
	// Request 3 is incomplete: the Read waits for it.
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	done := make(chan string, 1)
	go func() {
		b := make([]byte, 4096)
		n, _ := c.Read(b)
		done <- string(b[:n])
	}()
	time.Sleep(30 * time.Millisecond)
	if _, err := io.WriteString(client, r3[20:]); err != nil {
		t.Fatal(err)
	}
	if got := <-done; got != "POST /c HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nxy" {
		t.Fatalf("request 3: %q", got)
	}
}

// TestConnRefuses: a refused request is answered on the connection with
// the rule it broke, without quoting it, and the connection ends; a
// request not read in time is a 408; a client that sends nothing is let go
// without an answer.
func TestConnRefuses(t *testing.T) {
	client, c := pair(t, Options{Linger: 50 * time.Millisecond})
	if _, err := io.WriteString(client, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nAuthorization: Bearer secret\r\n\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, c); err != io.EOF {
		t.Fatalf("read: %v, want io.EOF", err)
	}
	if _, err := readOne(t, c); err != io.EOF {
		t.Fatalf("second read: %v, want io.EOF", err)
	}
	_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(client), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !resp.Close || bytes.Contains(body, []byte("secret")) || !bytes.Contains(body, []byte("Content-Length and Transfer-Encoding")) {
		t.Fatalf("%d close=%v %s", resp.StatusCode, resp.Close, body)
	}

	client, c = pair(t, Options{ReadTimeout: 100 * time.Millisecond, Linger: -1})
	if _, err := io.WriteString(client, "GET / HTTP/1.1\r\nHost:"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second)) // the front door's own read timeout comes first
	if _, err := c.Read(make([]byte, 4096)); err != io.EOF || time.Since(start) > 2*time.Second {
		t.Fatalf("read: %v after %v", err, time.Since(start))
	}
	_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReader(client), nil)
	if err != nil || resp.StatusCode != 408 {
		t.Fatalf("timeout: %v %v", resp, err)
	}

	client, c = pair(t, Options{ReadTimeout: 50 * time.Millisecond})
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.Read(make([]byte, 4096)); err != io.EOF {
		t.Fatalf("idle: %v", err)
	}
	_ = client.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _ := client.Read(make([]byte, 10)); n != 0 {
		t.Fatal("an idle client got an answer")
	}
}

// TestConnContinue: Expect: 100-continue is answered before the body, and
// the server behind the door never sees the Expect.
func TestConnContinue(t *testing.T) {
	client, c := pair(t, Options{})
	if _, err := io.WriteString(client, "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	got, err := readOne(t, c)
	if err != nil || strings.Contains(got, "Expect") || !strings.HasSuffix(got, "Content-Length: 2\r\n\r\n") {
		t.Fatalf("head: %q %v", got, err)
	}
	_ = client.SetReadDeadline(time.Now().Add(time.Second))
	b := make([]byte, 64)
	n, err := client.Read(b)
	if err != nil || string(b[:n]) != "HTTP/1.1 100 Continue\r\n\r\n" {
		t.Fatalf("interim: %q %v", b[:n], err)
	}
	if _, err := io.WriteString(client, "hi"); err != nil {
		t.Fatal(err)
	}
	if got, err := readOne(t, c); err != nil || got != "hi" {
		t.Fatalf("body: %q %v", got, err)
	}
}
