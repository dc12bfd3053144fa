// Command netproxy is a yardstick, not product code: a minimal HTTP/1.1
// reverse proxy on Go's netpoller, for `make bench-proxy-ceiling`
// (scripts/bench-proxy-ceiling.sh), which sets the sidecar's CPU per request
// beside it. It measures the ceiling of net.Conn, bufio and a goroutine per
// client connection, with nothing else in the way.
//
// Usage: netproxy -listen 127.0.0.1:19600 -upstream 127.0.0.1:19500.
//
// Each client connection's goroutine reads one whole request, sends it on an
// idle upstream connection (dialled when none is idle), reads the whole
// response and writes it back; the upstream connection then goes back to the
// idle list.
//
// Limitations, deliberate for a yardstick: messages are framed by
// Content-Length only, in both directions (no chunked encoding, no response
// read until the upstream closes, no HEAD), so the upstream must answer every
// request with a Content-Length; headers pass through untouched (Connection
// included); a failed upstream connection is not retried: the client
// connection is closed.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
)

const bufSize = 16 << 10

// proxy forwards every connection accepted by serve to one upstream address.
type proxy struct {
	upstream string

	conns sync.WaitGroup // one per client connection being served

	// mu protects the field below.
	mu   sync.Mutex
	idle []*upConn // idle upstream connections, LIFO
}

// upConn is one upstream connection with its buffered reader.
type upConn struct {
	c  net.Conn
	br *bufio.Reader
}

func newProxy(upstream string) *proxy {
	return &proxy{upstream: upstream}
}

// get returns an idle upstream connection, or dials one (nil if that fails).
func (p *proxy) get() *upConn {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		u := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return u
	}
	p.mu.Unlock()
	c, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return nil
	}
	return &upConn{c: c, br: bufio.NewReaderSize(c, bufSize)}
}

// put returns u to the idle list.
func (p *proxy) put(u *upConn) {
	p.mu.Lock()
	p.idle = append(p.idle, u)
	p.mu.Unlock()
}

// closeIdle closes the idle upstream connections.
func (p *proxy) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, u := range idle {
		u.c.Close()
	}
}

var errBadLength = errors.New("bad Content-Length")

// readMsg reads a header block and its Content-Length body into buf[:0] and
// returns the whole message.
func readMsg(br *bufio.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	cl := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		buf = append(buf, line...)
		if len(line) <= 2 {
			break
		}
		if len(line) > 16 && (line[0] == 'C' || line[0] == 'c') && bytes.EqualFold(line[:15], []byte("content-length:")) {
			cl, _ = strconv.Atoi(string(bytes.TrimSpace(line[15:])))
			if cl < 0 {
				return nil, errBadLength
			}
		}
	}
	n := len(buf)
	buf = append(buf, make([]byte, cl)...)
	_, err := io.ReadFull(br, buf[n:])
	return buf, err
}

// serveConn relays c's requests one at a time until c or its upstream fails.
func (p *proxy) serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, bufSize)
	req := make([]byte, 0, bufSize)
	resp := make([]byte, 0, bufSize)
	for {
		var err error
		req, err = readMsg(br, req)
		if err != nil {
			return
		}
		u := p.get()
		if u == nil {
			return
		}
		if _, err = u.c.Write(req); err != nil {
			u.c.Close()
			return
		}
		resp, err = readMsg(u.br, resp)
		if err != nil {
			u.c.Close()
			return
		}
		p.put(u)
		if _, err = c.Write(resp); err != nil {
			return
		}
	}
}

// serve serves the connections ln accepts, a goroutine each. When ln fails
// (it was closed) it waits until every client connection is gone and returns
// the error; idle upstream connections stay open until closeIdle.
func (p *proxy) serve(ln net.Listener) error {
	defer p.conns.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		p.conns.Add(1)
		go func() {
			defer p.conns.Done()
			p.serveConn(c)
		}()
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:19600", "address to listen on")
	upstream := flag.String("upstream", "127.0.0.1:19500", "upstream address")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(newProxy(*upstream).serve(ln))
}
