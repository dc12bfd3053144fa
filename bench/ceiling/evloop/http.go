//go:build linux

package main

// HTTP/1.1 as the yardstick reads it: a request's head (Content-Length
// bodies only), an answer's head and its framing (Content-Length, chunked
// through the sidecar's own decoder, or close), and the canned refusals.

import (
	"bytes"

	"github.com/kvsidecar/kvsidecar/frontdoor"
)

// response framing
const (
	frLen = iota
	frChunked
	frClose
)

var (
	resp400 = []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp413 = []byte("HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp431 = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp501 = []byte("HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp502 = []byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	crlf2   = []byte("\r\n\r\n")
)

// chunkDec finds the end of a chunked answer with the sidecar's own
// decoder (frontdoor.Chunked, lenient as for an upstream's answer), its
// data skipped: the yardstick relays the body as it came.
type chunkDec struct{ d frontdoor.Chunked }

// feed consumes bytes of a chunked body. It returns how many bytes belong to
// the body, whether the body ended, and whether the framing was invalid.
func (c *chunkDec) feed(b []byte) (int, bool, bool) {
	c.d.Lenient = true
	n, done, err := c.d.Feed(b, nil, 0, 0)
	return n, done, err != nil
}

func asciiLower(b byte) byte {
	if b >= 'A' && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// eqFold compares b with the lower-case ASCII string s case-insensitively.
func eqFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if asciiLower(b[i]) != s[i] {
			return false
		}
	}
	return true
}

// containsFold reports whether b contains the lower-case ASCII string s.
func containsFold(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if eqFold(b[i:i+len(s)], s) {
			return true
		}
	}
	return false
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		v = v*10 + int64(ch-'0')
	}
	return v, true
}

// nextLine splits off one header line (without its line ending).
func nextLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return trimSpace(b), nil
	}
	line = b[:i]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, b[i+1:]
}

// parseRequest looks for a complete request head in c.buf. It returns 0 if
// more bytes are needed, 1 when c.reqLen is set, -1 if c was closed.
func (s *server) parseRequest(c *conn) int {
	start := c.scan
	i := bytes.Index(c.buf[start:c.rlen], crlf2)
	if i < 0 {
		c.scan = c.rlen - 3
		if c.scan < 0 {
			c.scan = 0
		}
		return 0
	}
	hend := start + i + 4
	line, rest := nextLine(c.buf[:hend])
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || len(line) < sp+10 {
		s.reject(c, resp400)
		return -1
	}
	c.isHead = string(line[:sp]) == "HEAD"
	ver := line[len(line)-8:]
	switch string(ver) {
	case "HTTP/1.1":
		c.keepAlive = true
	case "HTTP/1.0":
		c.keepAlive = false
	default:
		s.reject(c, resp400)
		return -1
	}
	var cl int64
	for len(rest) > 0 {
		line, rest = nextLine(rest)
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			s.reject(c, resp400)
			return -1
		}
		name := line[:colon]
		switch len(name) {
		case 14:
			if eqFold(name, "content-length") {
				v, ok := parseDecimal(trimSpace(line[colon+1:]))
				if !ok {
					s.reject(c, resp400)
					return -1
				}
				cl = v
			}
		case 17:
			if eqFold(name, "transfer-encoding") {
				s.reject(c, resp501)
				return -1
			}
		case 10:
			if eqFold(name, "connection") {
				v := line[colon+1:]
				if containsFold(v, "close") {
					c.keepAlive = false
				} else if containsFold(v, "keep-alive") {
					c.keepAlive = true
				}
			}
		}
	}
	total := int64(hend) + cl
	if total > maxReq {
		s.reject(c, resp413)
		return -1
	}
	if int(total) > len(c.buf) {
		nb := make([]byte, (int(total)+bufSize-1)/bufSize*bufSize)
		copy(nb, c.buf[:c.rlen])
		c.buf = nb
	}
	c.reqLen = int(total)
	c.bodyAt = hend
	return 1
}

// parseRespHead parses the response head u.buf[u.hstart:hend]. It returns
// the status code, or -1 if the head is malformed.
func parseRespHead(u *conn, hend int, reqHead bool) int {
	line, rest := nextLine(u.buf[u.hstart:hend])
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' {
		return -1
	}
	status := 0
	for _, ch := range line[9:12] {
		if ch < '0' || ch > '9' {
			return -1
		}
		status = status*10 + int(ch-'0')
	}
	if status >= 100 && status < 200 && status != 101 {
		return status // interim response: no body, another head follows
	}
	u.status = status
	u.respClose = line[7] == '0'
	var cl int64 = -1
	chunked := false
	for len(rest) > 0 {
		line, rest = nextLine(rest)
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			continue
		}
		name := line[:colon]
		switch len(name) {
		case 14:
			if eqFold(name, "content-length") {
				v, ok := parseDecimal(trimSpace(line[colon+1:]))
				if !ok {
					return -1
				}
				cl = v
			}
		case 17:
			if eqFold(name, "transfer-encoding") && containsFold(line[colon+1:], "chunked") {
				chunked = true
			}
		case 10:
			if eqFold(name, "connection") {
				v := line[colon+1:]
				if containsFold(v, "close") {
					u.respClose = true
				} else if containsFold(v, "keep-alive") {
					u.respClose = false
				}
			}
		}
	}
	switch {
	case reqHead || status == 204 || status == 304:
		u.framing, u.remain = frLen, 0
	case status == 101: // no tunnel support: relay until the upstream closes
		u.framing = frClose
	case chunked:
		u.framing = frChunked
	case cl >= 0:
		u.framing, u.remain = frLen, cl
	default:
		u.framing = frClose
	}
	return status
}

// onUpstreamData accounts for newly read bytes u.buf[old rlen:u.rlen]: it
// parses heads and advances u.wend over bytes that belong to the response.
// It returns false if the response is malformed.
func onUpstreamData(u *conn, reqHead bool) bool {
	for !u.headDone {
		i := bytes.Index(u.buf[u.scan:u.rlen], crlf2)
		if i < 0 {
			u.scan = u.rlen - 3
			if u.scan < u.hstart {
				u.scan = u.hstart
			}
			// head larger than the buffer?
			return !(u.rlen == len(u.buf) && u.hstart == 0)
		}
		hend := u.scan + i + 4
		status := parseRespHead(u, hend, reqHead)
		if status < 0 {
			return false
		}
		u.wend, u.hstart, u.scan = hend, hend, hend
		u.bodyAt = hend
		if status >= 100 && status < 200 && status != 101 {
			continue
		}
		u.headDone = true
	}
	switch u.framing {
	case frLen:
		k := int64(u.rlen - u.wend)
		if k >= u.remain {
			k = u.remain
			u.done = true
			if u.wend+int(k) < u.rlen {
				u.noReuse = true // bytes beyond the response
			}
		}
		u.remain -= k
		u.wend += int(k)
	case frChunked:
		k, done, bad := u.chunk.feed(u.buf[u.wend:u.rlen])
		if bad {
			return false
		}
		u.wend += k
		if done {
			u.done = true
			if u.wend < u.rlen {
				u.noReuse = true
			}
		}
	case frClose:
		u.wend = u.rlen
	}
	return true
}
