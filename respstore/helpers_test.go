package respstore

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
)

// start opens a Server on a fresh folder (or opts.Dir) and serves it on a
// loopback port; cleanup closes it and checks Close returns.
func start(t testing.TB, opts Options) (*Server, string) {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, sidecartest.Serve(t, s)
}

// raw is a client that writes bytes and reads replies as bytes, to check
// them exactly.
type raw struct {
	t  testing.TB
	c  net.Conn
	br *bufio.Reader
}

func dial(t testing.TB, addr string) *raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(time.Minute))
	return &raw{t: t, c: c, br: bufio.NewReaderSize(c, 1<<20)}
}

// cmd encodes args as a RESP array of bulk strings.
func cmd(args ...string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.Bytes()
}

func (r *raw) send(b []byte) {
	r.t.Helper()
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

// expect reads exactly len(want) bytes and compares them.
func (r *raw) expect(want string) {
	r.t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r.br, got); err != nil {
		r.t.Fatalf("reading %q: %v (got %q)", want, err, got)
	}
	if string(got) != want {
		r.t.Fatalf("reply %q, want %q", got, want)
	}
}

// do sends a command and checks its reply exactly.
func (r *raw) do(want string, args ...string) {
	r.t.Helper()
	r.send(cmd(args...))
	r.expect(want)
}

// reply reads one whole reply (any type, nested) and returns its bytes.
func (r *raw) reply() string {
	r.t.Helper()
	var b bytes.Buffer
	r.readOne(&b)
	return b.String()
}

func (r *raw) readOne(b *bytes.Buffer) {
	line, err := r.br.ReadString('\n')
	if err != nil {
		r.t.Fatalf("read reply: %v (%q)", err, line)
	}
	b.WriteString(line)
	body := line[1 : len(line)-2]
	switch line[0] {
	case '$', '=':
		n, _ := strconv.Atoi(body)
		if n >= 0 {
			buf := make([]byte, n+2)
			if _, err := io.ReadFull(r.br, buf); err != nil {
				r.t.Fatal(err)
			}
			b.Write(buf)
		}
	case '*', '~', '>':
		n, _ := strconv.Atoi(body)
		for range n {
			r.readOne(b)
		}
	case '%':
		n, _ := strconv.Atoi(body)
		for range 2 * n {
			r.readOne(b)
		}
	}
}

func bulk(s string) string { return fmt.Sprintf("$%d\r\n%s\r\n", len(s), s) }
