package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/frontdoor"
)

// newUpClient builds the pooled client for the upstream base URL.
func newUpClient(base *url.URL, o *Options) *upClient {
	addr := base.Host
	if base.Port() == "" {
		if base.Scheme == "https" {
			addr = net.JoinHostPort(base.Hostname(), "443")
		} else {
			addr = net.JoinHostPort(base.Hostname(), "80")
		}
	}
	u := &upClient{addr: addr, dialTimeout: o.DialTimeout, maxIdle: o.MaxIdleConnsPerHost, idleFor: o.UpstreamIdleTimeout, now: time.Now}
	if base.Scheme == "https" {
		u.tls = &tls.Config{ServerName: base.Hostname(), MinVersion: tls.VersionTLS12}
	}
	return u
}

// copyRequestHeaders copies end-to-end headers from the client's request
// (frontdoor.HopByHop: byte comparisons, no canonical copy of a name: a
// request of an OpenAI SDK, 15 headers, is copied in a fraction of the
// time and allocations; BenchmarkCopyHeaders).
func copyRequestHeaders(dst *fasthttp.RequestHeader, src *fasthttp.RequestHeader) {
	conn := src.Peek("Connection")
	for k, v := range src.All() {
		if frontdoor.HopByHop(k, conn) || frontdoor.FoldEq(k, "Host") || frontdoor.FoldEq(k, "Content-Length") || frontdoor.FoldEq(k, "Expect") {
			continue // the sidecar already holds the body: no 100-continue upstream
		}
		dst.AddBytesKV(k, v)
	}
}

// copyResponseHeaders copies end-to-end headers from the upstream's response.
func copyResponseHeaders(dst *fasthttp.ResponseHeader, src *fasthttp.ResponseHeader) {
	conn := src.Peek("Connection")
	for k, v := range src.All() {
		if frontdoor.HopByHop(k, conn) || frontdoor.FoldEq(k, "Content-Length") {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// classifyUpstreamError maps a failed round trip to a status, an error code
// and a metrics kind.
func classifyUpstreamError(err error) (status int, code, kind string) {
	var bad *badResponseError
	switch {
	case isTimeout(err):
		return fasthttp.StatusGatewayTimeout, "upstream_timeout", upErrTimeout
	case errors.As(err, &bad):
		return fasthttp.StatusBadGateway, "upstream_bad_response", upErrBadResponse
	}
	return fasthttp.StatusBadGateway, "upstream_unreachable", upErrUnreachable
}

// upstreamMessage is what a client reads about a failed round trip. It
// never carries the upstream's bytes (fasthttp's parse errors quote the
// head they refused; the log has them), only what the sidecar did.
func upstreamMessage(err error) string {
	var (
		bad     *badResponseError
		cut     *cutResponseError
		nothing *noResponseError
		dial    *dialError
	)
	switch {
	case isTimeout(err):
		return "upstream did not answer in time"
	case errors.As(err, &bad) && bad.tooLarge:
		return fmt.Sprintf("upstream response headers exceed %d KiB", maxHeadBytes>>10)
	case errors.As(err, &bad):
		return "upstream sent a malformed response (its status line or headers are not valid HTTP/1.1)"
	case errors.As(err, &cut):
		return "upstream closed the connection in the middle of its response headers"
	case errors.As(err, &nothing):
		return "upstream closed the connection without answering"
	case errors.As(err, &dial):
		return "upstream unreachable: " + dial.Error()
	}
	return "upstream unreachable"
}

// classifyBodyError maps a failure while reading an upstream response body:
// a timeout, or a broken response.
func classifyBodyError(err error, timedOut bool) (status int, code, kind string) {
	if timedOut {
		return fasthttp.StatusGatewayTimeout, "upstream_timeout", upErrTimeout
	}
	status, code, kind = classifyUpstreamError(err)
	if kind == upErrUnreachable {
		return fasthttp.StatusBadGateway, "upstream_stream_broken", upErrBroken
	}
	return status, code, kind
}

// readAllLimit reads r to the end, at most limit bytes.
func readAllLimit(r io.Reader, limit int64) ([]byte, error) {
	var b []byte
	err := readLimited(r, limit, func(p []byte) { b = append(b, p...) })
	return b, err
}

var errTooLarge = errors.New("upstream response exceeds the size limit")

// copyBufs recycles buffers for reading buffered upstream bodies.
var copyBufs = sync.Pool{New: func() any { return new([16 << 10]byte) }}

// readBodyInto reads r to the end into dst's body, at most limit bytes,
// with no buffer of its own beyond a pooled one.
func readBodyInto(dst *fasthttp.Response, r io.Reader, limit int64) error {
	dst.ResetBody()
	return readLimited(r, limit, func(p []byte) { dst.AppendBody(p) })
}

// readLimited hands each piece of r to emit until EOF, failing with
// errTooLarge past limit bytes. The pieces are only valid during emit.
func readLimited(r io.Reader, limit int64, emit func([]byte)) error {
	buf := copyBufs.Get().(*[16 << 10]byte)
	defer copyBufs.Put(buf)
	var n int64
	for {
		k, err := r.Read(buf[:])
		n += int64(k)
		if n > limit {
			return errTooLarge
		}
		emit(buf[:k])
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// maxHeadBytes bounds a response head read by rereadHead, past the
// connection buffer's 32 KiB: the event loop's bound too.
const maxHeadBytes = frontdoor.MaxAnswerHead

var errHeadTooLarge = errors.New("response head too large")

// readHead reads one response head (status line, headers, the empty line)
// from br, at most limit bytes.
func readHead(br *bufio.Reader, limit int) ([]byte, error) {
	var head []byte
	line := 0 // where the current line starts
	for {
		chunk, err := br.ReadSlice('\n')
		if len(head)+len(chunk) > limit {
			return nil, errHeadTooLarge
		}
		head = append(head, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil, err
		}
		if l := head[line:]; line > 0 && (len(l) == 1 || len(l) == 2 && l[0] == '\r') {
			return head, nil
		}
		line = len(head)
	}
}

// hasHeaderLine reports whether a line of b (after the first) names the
// header name, in any case.
func hasHeaderLine(b []byte, name string) bool {
	first := true
	for l := range bytes.Lines(b) {
		if first {
			first = false
			continue
		}
		if k, _, ok := bytes.Cut(l, []byte(":")); ok && bytes.EqualFold(bytes.TrimRight(k, " \t"), []byte(name)) {
			return true
		}
	}
	return false
}
