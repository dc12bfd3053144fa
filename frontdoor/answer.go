package frontdoor

// An upstream's answer, as the event loop reads it: leniently, as the
// forward path's client (fasthttp's, with RepairFraming) reads the same
// bytes, so that the two paths answer a client alike
// (TestEventLoopMatchesFasthttp).

import (
	"bytes"
	"strconv"
)

// Framings of an answer's body.
const (
	frLength  = iota // Content-Length bytes (none for 1xx, 204, 304)
	frChunked        // a chunked body (Chunked, Lenient)
	frClose          // to the connection's end
)

// answerHead is what an answer's head says of its status and body.
type answerHead struct {
	status  int
	framing uint8
	length  int64 // frLength's
	close   bool  // Connection: close, or HTTP/1.0: not pooled again
}

// readAnswerHead reads an answer's status line and framing; false for a
// head fasthttp's client refuses (RepairFraming is then tried).
func readAnswerHead(head []byte) (a answerHead, ok bool) {
	line, rest := cutAnswerLine(head)
	a.status = statusOf(line)
	if a.status < 0 {
		return a, false
	}
	a.close = line[7] == '0'
	cl, chunked, tes := int64(-1), false, 0
	for len(rest) > 0 {
		var hl []byte
		hl, rest = cutAnswerLine(rest)
		if len(hl) == 0 {
			break
		}
		k, v, ok := bytes.Cut(hl, []byte(":"))
		if !ok || !isToken(k) || !fieldValue(v) {
			return a, false
		}
		v = bytes.Trim(v, " \t")
		switch {
		case FoldEq(k, "Content-Length"):
			n, err := strconv.ParseInt(string(v), 10, 64)
			if cl >= 0 || err != nil || n < 0 || len(v) == 0 || v[0] == '+' {
				return a, false
			}
			cl = n
		case FoldEq(k, "Transfer-Encoding"):
			tes++
			chunked = FoldEq(v, "chunked")
			if !chunked && !FoldEq(v, "identity") {
				return a, false
			}
		case FoldEq(k, "Connection"):
			if listedIn(v, "close") {
				a.close = true
			}
		}
	}
	if tes > 1 || chunked && cl >= 0 || tes == 1 && !chunked {
		return a, false
	}
	switch {
	case a.status == 204 || a.status == 304 || a.status < 200:
		a.framing, a.length = frLength, 0
	case chunked:
		a.framing = frChunked
	case cl >= 0:
		a.framing, a.length = frLength, cl
	default:
		a.framing = frClose
	}
	return a, true
}

// answerHeadEnd returns the length of the head at b's start (through its
// empty line, CRLF or bare LF), -1 while it is not whole.
func answerHeadEnd(b []byte) int {
	i := 0
	for {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		line := b[i : i+j]
		i += j + 1
		if i > j+1 && (len(line) == 0 || len(line) == 1 && line[0] == '\r') {
			return i
		}
	}
}

// statusOf returns the status of an HTTP/1.x status line, -1 when it is
// not one.
func statusOf(line []byte) int {
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ' ||
		len(line) > 12 && line[12] != ' ' {
		return -1
	}
	status := 0
	for _, ch := range line[9:12] {
		if ch < '0' || ch > '9' {
			return -1
		}
		status = status*10 + int(ch-'0')
	}
	if status < 100 {
		return -1
	}
	return status
}

// cutAnswerLine cuts b after its first line, without the line's end.
func cutAnswerLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return b, nil
	}
	line, rest = b[:i], b[i+1:]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, rest
}

// fieldValue reports whether v holds no control character but tab.
func fieldValue(v []byte) bool {
	for _, ch := range v {
		if ch < ' ' && ch != '\t' || ch == 0x7f {
			return false
		}
	}
	return true
}

// listedIn reports whether the Connection value conn lists name, ASCII
// case ignored. A plain loop (tokens' split, without the iterator): the
// proxy's header copies call it for every field (BenchmarkCopyHeaders).
func listedIn[S ~string | ~[]byte](conn []byte, name S) bool {
	for len(conn) > 0 {
		var t []byte
		if i := bytes.IndexByte(conn, ','); i >= 0 {
			t, conn = conn[:i], conn[i+1:]
		} else {
			t, conn = conn, nil
		}
		if t = bytes.Trim(t, " \t"); len(t) > 0 && FoldEq(t, name) {
			return true
		}
	}
	return false
}

// appendAnswerFields appends the end-to-end fields of an answer's head
// (after its status line) as the fasthttp path writes them to the client:
// names normalised (appendFieldName), values trimmed; hop-by-hop fields,
// those Connection lists, Content-Length and Date left out (the loop
// writes its own).
func appendAnswerFields(dst, head []byte) []byte {
	_, rest := cutAnswerLine(head)
	var conn []byte
	for r := rest; len(r) > 0; {
		var hl []byte
		hl, r = cutAnswerLine(r)
		if k, v, ok := bytes.Cut(hl, []byte(":")); ok && FoldEq(k, "Connection") {
			conn = bytes.Trim(v, " \t")
		}
	}
	for len(rest) > 0 {
		var hl []byte
		hl, rest = cutAnswerLine(rest)
		k, v, ok := bytes.Cut(hl, []byte(":"))
		if !ok || hopByHop(k) || listedIn(conn, k) || FoldEq(k, "Content-Length") || FoldEq(k, "Date") {
			continue
		}
		dst = appendFieldName(dst, k)
		dst = append(dst, ": "...)
		dst = append(dst, bytes.Trim(v, " \t")...)
		dst = append(dst, "\r\n"...)
	}
	return dst
}

// appendFieldName appends k as fasthttp normalises a field name: a
// capital at the start and after each '-', the rest lower case.
func appendFieldName(dst, k []byte) []byte {
	up := true
	for _, ch := range k {
		switch {
		case up && 'a' <= ch && ch <= 'z':
			ch -= 'a' - 'A'
		case !up && 'A' <= ch && ch <= 'Z':
			ch += 'a' - 'A'
		}
		up = ch == '-'
		dst = append(dst, ch)
	}
	return dst
}

// RepairFraming rewrites the framing headers of a response head the way
// lenient clients (curl 8, Python's http.client) read them, where
// fasthttp refuses the head:
//   - a Transfer-Encoding whose last coding is chunked becomes one
//     "Transfer-Encoding: chunked" and any Content-Length goes (chunked
//     wins, RFC 9112 §6.3); the codings before it are not undone;
//   - any other Transfer-Encoding (an unknown coding, "identity") is
//     ignored: Content-Length frames the body or, without one, the
//     connection's end does;
//   - a Content-Length repeated with one value ("5" twice, "5, 5") is
//     kept once. Lengths that disagree are left for the parser to refuse.
//
// Every other line is kept byte for byte. head is a whole head (through
// its empty line); the result may share its memory. The proxy's client
// and the event loop both read a head fasthttp refuses through it.
func RepairFraming(head []byte) []byte {
	var te, cl [][]byte
	found := false
	lines := splitLines(head)
	for _, l := range lines[1:] {
		k, v, ok := bytes.Cut(l, []byte(":"))
		if !ok {
			continue
		}
		k = bytes.TrimRight(k, " \t")
		isTE, isCL := bytes.EqualFold(k, []byte("Transfer-Encoding")), bytes.EqualFold(k, []byte("Content-Length"))
		if !isTE && !isCL {
			continue
		}
		found = true
		for _, f := range bytes.Split(bytes.TrimRight(v, "\r\n"), []byte(",")) {
			if f = bytes.Trim(f, " \t"); len(f) == 0 {
				continue
			}
			if isTE {
				te = append(te, f)
			} else {
				cl = append(cl, f)
			}
		}
	}
	if !found {
		return head
	}
	var framing string
	switch {
	case len(te) > 0 && bytes.EqualFold(te[len(te)-1], []byte("chunked")):
		framing = "Transfer-Encoding: chunked\r\n"
	case len(cl) > 0:
		for _, v := range cl[1:] {
			if !bytes.Equal(v, cl[0]) {
				return head // conflicting lengths
			}
		}
		framing = "Content-Length: " + string(cl[0]) + "\r\n"
	}
	out := make([]byte, 0, len(head)+len(framing))
	out = append(out, lines[0]...)
	for _, l := range lines[1 : len(lines)-1] {
		k, _, _ := bytes.Cut(l, []byte(":"))
		k = bytes.TrimRight(k, " \t")
		if bytes.EqualFold(k, []byte("Transfer-Encoding")) || bytes.EqualFold(k, []byte("Content-Length")) {
			continue
		}
		out = append(out, l...)
	}
	out = append(out, framing...)
	return append(out, lines[len(lines)-1]...)
}

// splitLines cuts b after each '\n'.
func splitLines(b []byte) [][]byte {
	var lines [][]byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n') + 1
		if i == 0 {
			i = len(b)
		}
		lines = append(lines, b[:i])
		b = b[i:]
	}
	return lines
}
