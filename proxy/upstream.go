package proxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// hopHeaders are hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
var hopHeaders = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// connectionTokens returns the header names a Connection header lists; they
// are hop-by-hop too.
func connectionTokens(v string) map[string]bool {
	if v == "" {
		return nil
	}
	m := map[string]bool{}
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			m[http.CanonicalHeaderKey(f)] = true
		}
	}
	return m
}

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

// copyRequestHeaders copies end-to-end headers from the client's request.
func copyRequestHeaders(dst *fasthttp.RequestHeader, src *fasthttp.RequestHeader) {
	drop := connectionTokens(string(src.Peek("Connection")))
	for k, v := range src.All() {
		key := http.CanonicalHeaderKey(string(k))
		if hopHeaders[key] || drop[key] || key == "Host" || key == "Content-Length" || key == "Expect" {
			continue // the sidecar already holds the body: no 100-continue upstream
		}
		dst.AddBytesKV(k, v)
	}
}

// copyResponseHeaders copies end-to-end headers from the upstream's response.
func copyResponseHeaders(dst *fasthttp.ResponseHeader, src *fasthttp.ResponseHeader) {
	drop := connectionTokens(string(src.Peek("Connection")))
	for k, v := range src.All() {
		key := http.CanonicalHeaderKey(string(k))
		if hopHeaders[key] || drop[key] || key == "Content-Length" {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// classifyUpstreamError maps a failed round trip to a status, an error code
// and a metrics kind.
func classifyUpstreamError(err error) (status int, code, kind string) {
	var ne net.Error
	if errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &ne) && ne.Timeout() {
		return fasthttp.StatusGatewayTimeout, "upstream_timeout", upErrTimeout
	}
	return fasthttp.StatusBadGateway, "upstream_unreachable", upErrUnreachable
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
