package frontdoor

import (
	"io"
	"net"
	"testing"
)

// sdkHead is the head of an OpenAI Python SDK chat request.
const sdkHead = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept-Encoding: gzip, deflate\r\n" +
	"Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\nUser-Agent: OpenAI/Python 1.54.0\r\n" +
	"X-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.54.0\r\nX-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\n" +
	"X-Stainless-Runtime: CPython\r\nX-Stainless-Runtime-Version: 3.12.3\r\nAuthorization: Bearer sk-xxxxxxxxxxxxxxxxxxxxxxxx\r\n" +
	"X-Stainless-Async: false\r\nx-stainless-retry-count: 0\r\nContent-Length: 120\r\n\r\n"

// BenchmarkParse: the front door's reading of an SDK head, and its
// canonical form (what the fasthttp path adds per request).
func BenchmarkParse(b *testing.B) {
	buf := []byte(sdkHead)
	var h Head
	var out []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if err := h.Parse(buf, Limits{}); err != nil {
			b.Fatal(err)
		}
		out = appendLength(appendCanonical(out[:0], &h, buf), h.Length)
	}
}

// BenchmarkConnRead: one request through a Conn, head and body.
func BenchmarkConnRead(b *testing.B) {
	req := []byte(sdkHead + string(make([]byte, 120)))
	src := &loopReader{b: req}
	c := NewConn(nopConn{r: src}, &Options{})
	p := make([]byte, 32<<10)
	b.ReportAllocs()
	b.SetBytes(int64(len(req)))
	for b.Loop() {
		for got := 0; got < len(req); {
			n, err := c.Read(p)
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
}

type loopReader struct {
	b  []byte
	at int
}

func (l *loopReader) Read(p []byte) (int, error) {
	n := copy(p, l.b[l.at:])
	l.at = (l.at + n) % len(l.b)
	return n, nil
}

// nopConn reads r; nothing else of it is used.
type nopConn struct {
	net.Conn
	r io.Reader
}

func (c nopConn) Read(p []byte) (int, error) { return c.r.Read(p) }
