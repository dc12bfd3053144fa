// Command fhproxy is a yardstick, not product code: a bare fasthttp server
// whose handler forwards each request with fasthttp.HostClient.Do, which is
// what fasthttp's own reverse-proxy users do. It exists for
// `make bench-proxy-ceiling` (scripts/bench-proxy-ceiling.sh), which sets the
// sidecar's CPU per request beside it.
//
// Usage: fhproxy -listen 127.0.0.1:19610 -upstream 127.0.0.1:19500.
//
// HostClient reads the whole response before the server writes it, so a
// streamed (chunked) answer reaches the client in one piece, with a
// Content-Length; an upstream failure is a 502 carrying the error's text.
package main

import (
	"flag"
	"log"

	"github.com/valyala/fasthttp"
)

// newServer returns a fasthttp server that forwards every request to
// upstream (host:port) over up to 1024 connections.
func newServer(upstream string) (*fasthttp.Server, *fasthttp.HostClient) {
	hc := &fasthttp.HostClient{Addr: upstream, MaxConns: 1024}
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			}
		},
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
	}
	return s, hc
}

func main() {
	listen := flag.String("listen", "127.0.0.1:19610", "address to listen on")
	upstream := flag.String("upstream", "127.0.0.1:19500", "upstream address")
	flag.Parse()
	s, _ := newServer(*upstream)
	log.Fatal(s.ListenAndServe(*listen))
}
