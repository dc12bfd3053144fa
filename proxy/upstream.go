package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
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

// newTransport builds the pooled upstream client.
func newTransport(o *Options) *http.Transport {
	d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil, // the upstream is reached directly
		DialContext:           d.DialContext,
		MaxIdleConns:          o.MaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: o.UpstreamTimeout,
		DisableCompression:    true, // bodies pass through as the upstream encoded them
		ForceAttemptHTTP2:     false,
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
}

// upstreamURL joins the upstream base with the client's raw request URI.
func upstreamURL(base *url.URL, requestURI []byte) string {
	var b strings.Builder
	b.Grow(len(base.Scheme) + 3 + len(base.Host) + len(base.Path) + len(requestURI))
	b.WriteString(base.Scheme)
	b.WriteString("://")
	b.WriteString(base.Host)
	b.WriteString(base.Path)
	b.Write(requestURI)
	return b.String()
}

// copyRequestHeaders copies end-to-end headers from the client's request.
func copyRequestHeaders(dst http.Header, src *fasthttp.RequestHeader) {
	drop := connectionTokens(string(src.Peek("Connection")))
	for k, v := range src.All() {
		key := string(k)
		if hopHeaders[key] || drop[key] || key == "Host" || key == "Content-Length" {
			continue
		}
		dst[key] = append(dst[key], string(v))
	}
}

// copyResponseHeaders copies end-to-end headers from the upstream's response.
func copyResponseHeaders(dst *fasthttp.ResponseHeader, src http.Header) {
	drop := connectionTokens(src.Get("Connection"))
	for k, vs := range src {
		if hopHeaders[k] || drop[k] || k == "Content-Length" {
			continue
		}
		for _, v := range vs {
			dst.Add(k, v)
		}
	}
}

// classifyUpstreamError maps a failed round trip to a status, an error code
// and a metrics kind.
func classifyUpstreamError(err error, idleFired bool) (status int, code, kind string) {
	var ne net.Error
	switch {
	case idleFired, errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return fasthttp.StatusGatewayTimeout, "upstream_timeout", upErrTimeout
	default:
		return fasthttp.StatusBadGateway, "upstream_unreachable", upErrUnreachable
	}
}

// classifyBodyError maps a failure while reading an upstream response body:
// a timeout, or a broken response.
func classifyBodyError(err error, idleFired bool) (status int, code, kind string) {
	status, code, kind = classifyUpstreamError(err, idleFired)
	if kind == upErrUnreachable {
		return fasthttp.StatusBadGateway, "upstream_stream_broken", upErrBroken
	}
	return status, code, kind
}

// idleTimer cancels a context when no progress is reported for d.
type idleTimer struct {
	t     *time.Timer
	d     time.Duration
	fired atomic.Bool
}

func newIdleTimer(d time.Duration, cancel context.CancelFunc) *idleTimer {
	it := &idleTimer{d: d}
	it.t = time.AfterFunc(d, func() {
		it.fired.Store(true)
		cancel()
	})
	return it
}

func (it *idleTimer) progress() { it.t.Reset(it.d) }
func (it *idleTimer) stop()     { it.t.Stop() }

// readAllLimit reads r to the end, at most limit bytes, reporting progress.
func readAllLimit(r io.Reader, limit int64, it *idleTimer) ([]byte, error) {
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			it.progress()
		}
		if int64(len(buf)) > limit {
			return nil, errTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

var errTooLarge = errors.New("upstream response exceeds the size limit")
