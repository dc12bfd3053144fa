package respstore

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
)

func TestSplitInline(t *testing.T) {
	for _, c := range []struct {
		line string
		args []string
		ok   bool
	}{
		{"GET k", []string{"GET", "k"}, true},
		{"  SET   a\tb  ", []string{"SET", "a", "b"}, true},
		{`SET "a b" 'c d'`, []string{"SET", "a b", "c d"}, true},
		{`ECHO "\x41\n\"q\""`, []string{"ECHO", "A\n\"q\""}, true},
		{`ECHO 'it\'s'`, []string{"ECHO", "it's"}, true},
		{`ECHO "open`, nil, false},
		{`ECHO "a"b`, nil, false},
		{"", nil, true},
	} {
		args, ok := splitInline(nil, []byte(c.line))
		if ok != c.ok {
			t.Errorf("%q: ok %v", c.line, ok)
			continue
		}
		var got []string
		for _, a := range args {
			got = append(got, string(a))
		}
		if strings.Join(got, "|") != strings.Join(c.args, "|") {
			t.Errorf("%q: %q, want %q", c.line, got, c.args)
		}
	}
}

// The writer's RESP2 and RESP3 forms, byte for byte.
func TestWriterForms(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go io.Copy(io.Discard, b)
	w := writer{conn: a}
	w.null()
	w.mapHeader(2)
	w.resp3 = true
	w.null()
	w.mapHeader(2)
	w.error("ERR two\r\nlines")
	if got := string(w.buf); got != "$-1\r\n*4\r\n_\r\n%2\r\n-ERR two  lines\r\n" {
		t.Fatalf("%q", got)
	}
}

// FuzzReader feeds the request parser arbitrary bytes: it never panics,
// never returns an argument longer than the limit, and every command it
// returns re-encodes to a request that parses to the same arguments.
func FuzzReader(f *testing.F) {
	f.Add([]byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"))
	f.Add([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$70000\r\n" + strings.Repeat("v", 70000) + "\r\n"))
	f.Add([]byte("PING\r\nSET \"a b\" 'c'\r\n\r\n"))
	f.Add([]byte("*-1\r\n*0\r\n*1\r\n$-1\r\n"))
	f.Add([]byte("*1\r\n$99999999999999999999\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		lim := limits{maxArgs: 16, maxBulk: 100 << 10}
		r := newReader(bytes.NewReader(in), nil)
		for range 64 {
			req, err := r.next(lim)
			if err != nil {
				var pe *errProto
				if !errors.As(err, &pe) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			if len(req.args) > lim.maxArgs {
				t.Fatalf("%d args over the limit", len(req.args))
			}
			var enc bytes.Buffer
			var want []string
			enc.Write([]byte("*"))
			enc.WriteString(itoa(len(req.args)) + "\r\n")
			for _, a := range req.args {
				if int64(len(a)) > lim.maxBulk {
					t.Fatalf("argument of %d bytes over the limit", len(a))
				}
				enc.WriteString("$" + itoa(len(a)) + "\r\n")
				enc.Write(a)
				enc.WriteString("\r\n")
				want = append(want, string(a))
			}
			if len(req.args) == 0 {
				continue
			}
			again, err := newReader(&enc, nil).next(lim)
			if err != nil {
				t.Fatalf("re-encoded command does not parse: %v", err)
			}
			for i, a := range again.args {
				if string(a) != want[i] {
					t.Fatalf("argument %d: %q, want %q", i, a, want[i])
				}
			}
		}
	})
}

func itoa(n int) string { return strconv.Itoa(n) }
