package frontdoor

import (
	"bytes"
	"errors"
	"fmt"
)

// ErrNeedMore is Parse's answer for a head that has not arrived whole.
var ErrNeedMore = errors.New("frontdoor: the request head is not complete")

// Body framings of a request.
const (
	// FrameNone: no Content-Length and no Transfer-Encoding, a body of
	// zero bytes (RFC 9112 §6.3, rule 7).
	FrameNone = iota
	// FrameLength: Content-Length bytes follow the head.
	FrameLength
	// FrameChunked: a chunked body follows the head (decode with Chunked).
	FrameChunked
)

// span is a range of the parsed buffer.
type span struct{ at, end int32 }

func (s span) of(b []byte) []byte { return b[s.at:s.end:s.end] }

type field struct{ name, value span }

// Head is one request head as Parse accepted it. Its spans point into the
// buffer Parse read; the accessors take that buffer (or one holding the
// same bytes at the same offsets, such as a grown copy). A Head is reused
// across requests: Parse resets it.
type Head struct {
	// Len is the head's length in the buffer: the request line, the field
	// lines and the empty line that ends them (and any empty lines before
	// the request line, which are skipped).
	Len int
	// Minor is the HTTP/1.x minor version: 0 or 1.
	Minor int
	// Framing is FrameNone, FrameLength or FrameChunked.
	Framing int
	// Length is the Content-Length with FrameLength; 0 otherwise.
	Length int64
	// Close: the connection ends after this request's answer
	// (Connection: close, or HTTP/1.0 without keep-alive).
	Close bool
	// Continue: the client sent Expect: 100-continue (HTTP/1.1) and waits
	// for an interim answer before its body.
	Continue bool

	method, target span
	rootOnly       bool // an absolute-form target without a path: "/"
	// fields are the end-to-end field lines in the order sent: the
	// hop-by-hop ones (Connection and those it lists, Keep-Alive, TE,
	// Trailer, Transfer-Encoding, Upgrade, Proxy-*), Expect and
	// Content-Length are not among them; the framing above stands for
	// them.
	fields []field
	conn   []span // the Connection field values, read after every line
}

// Method returns the request method.
func (h *Head) Method(b []byte) []byte { return h.method.of(b) }

// Target returns the request target in origin-form: it starts with "/"
// (the path and query of an absolute-form target).
func (h *Head) Target(b []byte) []byte {
	if h.rootOnly {
		return []byte("/")
	}
	return h.target.of(b)
}

// NumFields is the number of end-to-end field lines.
func (h *Head) NumFields() int { return len(h.fields) }

// Field returns field line i's name as sent and its value without the
// surrounding whitespace.
func (h *Head) Field(b []byte, i int) (name, value []byte) {
	f := h.fields[i]
	return f.name.of(b), f.value.of(b)
}

// Get returns the value of the end-to-end field named name (ASCII case
// ignored), and whether it is there. Names that matter to the sidecar are
// unique (Parse refuses a second line), so the first is the only one.
func (h *Head) Get(b []byte, name string) ([]byte, bool) {
	for _, f := range h.fields {
		if FoldEq(f.name.of(b), name) {
			return f.value.of(b), true
		}
	}
	return nil, false
}

// Lookup is Get's value as offsets in b: where it starts and ends.
func (h *Head) Lookup(b []byte, name string) (at, end int, ok bool) {
	for _, f := range h.fields {
		if FoldEq(f.name.of(b), name) {
			return int(f.value.at), int(f.value.end), true
		}
	}
	return 0, 0, false
}

// Limits bound what Parse accepts; zero fields take the defaults (Parse
// applies EnsureDefaults).
type Limits struct {
	// MaxHead bounds the whole head (431 beyond). Zero or negative:
	// DefaultMaxHead, 32 KiB, nginx's four large header buffers of 8 KiB.
	MaxHead int
	// MaxLine bounds the request line (414 beyond) and each field line
	// (431 beyond). Zero or negative: DefaultMaxLine, 8 KiB, nginx's large
	// header buffer. At most MaxHead.
	MaxLine int
	// MaxBody bounds a body (413 beyond); 0: no bound.
	MaxBody int64
}

// Default limits.
const (
	DefaultMaxHead = 32 << 10
	DefaultMaxLine = 8 << 10
)

// EnsureDefaults fills every zero field with its documented default,
// lowers MaxLine to MaxHead, and returns l. Parse calls it; calling it
// twice changes nothing.
func (l *Limits) EnsureDefaults() *Limits {
	if l.MaxHead <= 0 {
		l.MaxHead = DefaultMaxHead
	}
	if l.MaxLine <= 0 {
		l.MaxLine = DefaultMaxLine
	}
	if l.MaxLine > l.MaxHead {
		l.MaxLine = l.MaxHead
	}
	return l
}

// maxFields bounds the field lines of a head, as a bound on Parse's work
// and memory whatever the head's size: a line takes at least three bytes
// ("a:\n"), so 32 KiB could otherwise hold 10,000.
const maxFields = 500

// Parse reads the request head at the start of b, strictly: RFC 9112 as
// nginx applies it, refusing what nginx refuses and some things it lets
// by (a stricter 400 where the two parsers of a chain could disagree).
// Every refusal is a 4xx — where nginx answers 501 (an unknown
// Transfer-Encoding) or 505 (HTTP/2.0), a 400 — so a 5xx always means the
// sidecar or its engine failed, never the client.
// It returns ErrNeedMore while b holds no whole head and a head within
// the limits may still come, or an *Error to answer the client with (the
// connection closes after it). On success h describes the head, which
// takes b[:h.Len]; the body (h.Framing) follows.
//
// Accepted as nginx does: empty lines before the request line, bare LF
// line ends, whitespace around field values, "chunked" in any case, an
// absolute-form target (its path taken).
// Refused: a request line that is not "METHOD SP target SP HTTP/1.x"
// (methods of upper-case letters, '_' and '-'; targets of visible ASCII
// or bytes from 0x80, a path or an http(s) URL without userinfo), a version other than 1.0 and
// 1.1, a CR not followed by LF, obs-fold, a
// field name that is not a token (whitespace within it or before the
// colon included; a token name of other characters than letters, digits
// and '-' is dropped, as nginx drops it), a control character other than
// HTAB in a value, a second Host, Content-Length, Transfer-Encoding, Authorization,
// Content-Type, or one of the sidecar's own session fields (X-Session-ID,
// X-User-ID, X-Session-Mode, X-Pool-Prefix), a Content-Length that is not
// digits, Transfer-Encoding with Content-Length or in HTTP/1.0, one other
// than exactly chunked, an HTTP/1.1 request without a Host or with
// one nginx refuses, a Connection field that lists Host, Content-Length
// or Transfer-Encoding.
func (h *Head) Parse(b []byte, lim Limits) error {
	lim.EnsureDefaults()
	*h = Head{fields: h.fields[:0], conn: h.conn[:0]}
	i := 0
	// Empty lines before the request line (RFC 9112 §2.2).
	for i < len(b) && (b[i] == '\n' || b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n') {
		if b[i] == '\r' {
			i++
		}
		i++
		if i > lim.MaxLine {
			return errBadRequest("the request starts with empty lines")
		}
	}
	if i == len(b) || b[i] == '\r' && i+1 == len(b) {
		return ErrNeedMore
	}
	line, next, err := cutLine(b, i, lim.MaxLine)
	if err != nil {
		if err == ErrNeedMore && len(b)-i > lim.MaxLine {
			return &Error{Status: 414, Code: "uri_too_long", Msg: fmt.Sprintf("the request line passes %d bytes", lim.MaxLine)}
		}
		if err == errLineTooLong {
			return &Error{Status: 414, Code: "uri_too_long", Msg: fmt.Sprintf("the request line passes %d bytes", lim.MaxLine)}
		}
		return err
	}
	if err := h.requestLine(b, line); err != nil {
		return err
	}
	i = next
	for {
		if i > lim.MaxHead {
			return errHeadTooLarge(lim.MaxHead)
		}
		line, next, err := cutLine(b, i, lim.MaxLine)
		if err != nil {
			switch {
			case err == ErrNeedMore && len(b)-i > lim.MaxLine, err == errLineTooLong:
				return &Error{Status: 431, Code: "header_too_large", Msg: fmt.Sprintf("a header line passes %d bytes", lim.MaxLine)}
			case err == ErrNeedMore && len(b) > lim.MaxHead:
				return errHeadTooLarge(lim.MaxHead)
			}
			return err
		}
		if next > lim.MaxHead {
			return errHeadTooLarge(lim.MaxHead)
		}
		i = next
		if line.at == line.end {
			break // the empty line: the head's end
		}
		if err := h.fieldLine(b, line); err != nil {
			return err
		}
		if len(h.fields) > maxFields {
			return &Error{Status: 431, Code: "header_too_large", Msg: fmt.Sprintf("the request has more than %d header lines", maxFields)}
		}
	}
	h.Len = i
	return h.settle(b, lim)
}

var errLineTooLong = errors.New("frontdoor: line too long")

// cutLine finds the line starting at b[i]: its content without the line
// end, and where the next line starts. A CR is allowed only right before
// the LF.
func cutLine(b []byte, i, maxLine int) (line span, next int, err error) {
	rest := b[i:]
	if len(rest) > maxLine+2 {
		rest = rest[:maxLine+2]
	}
	j := bytes.IndexByte(rest, '\n')
	if j < 0 {
		if k := bytes.IndexByte(rest, '\r'); k >= 0 && k+1 < len(rest) {
			return span{}, 0, errBadRequest("a CR in the request head is not followed by LF")
		}
		if len(rest) == maxLine+2 {
			return span{}, 0, errLineTooLong
		}
		return span{}, 0, ErrNeedMore
	}
	end := j
	if end > 0 && rest[end-1] == '\r' {
		end--
	}
	if bytes.IndexByte(rest[:end], '\r') >= 0 {
		return span{}, 0, errBadRequest("a CR in the request head is not followed by LF")
	}
	if end > maxLine {
		return span{}, 0, errLineTooLong
	}
	return span{int32(i), int32(i + end)}, i + j + 1, nil
}

func (h *Head) requestLine(b []byte, line span) error {
	l := line.of(b)
	m := 0
	for m < len(l) && ('A' <= l[m] && l[m] <= 'Z' || l[m] == '_' || l[m] == '-') {
		m++
	}
	if m == 0 || m == len(l) || l[m] != ' ' {
		return errBadRequest("the request line is not METHOD SP target SP HTTP/1.x (methods are upper-case letters)")
	}
	h.method = span{line.at, line.at + int32(m)}
	t := m + 1
	e := t
	for e < len(l) && l[e] > ' ' && l[e] != 0x7f {
		e++
	}
	if e == t || e == len(l) || l[e] != ' ' {
		return errBadRequest("the request line is not METHOD SP target SP HTTP/1.x")
	}
	h.target = span{line.at + int32(t), line.at + int32(e)}
	if l[t] != '/' {
		path, ok := absolutePath(l[t:e])
		if !ok {
			return errBadRequest("the request target is neither a path starting with / nor an http URL")
		}
		// Absolute-form (RFC 9112 §3.2.2): nginx takes the path from it;
		// so does the canonical head.
		if path < 0 {
			h.target, h.rootOnly = span{}, true
		} else {
			h.target.at += int32(path)
		}
	}
	v := l[e+1:]
	switch {
	case string(v) == "HTTP/1.1":
		h.Minor = 1
	case string(v) == "HTTP/1.0":
		h.Minor = 0
	case len(v) == 8 && string(v[:5]) == "HTTP/" && v[6] == '.' && isDigit(v[5]) && isDigit(v[7]) && v[5] >= '2':
		return &Error{Status: 400, Code: "http_version_not_supported", Msg: "only HTTP/1.0 and HTTP/1.1 are served here"}
	default:
		return errBadRequest("the request line's version is not HTTP/1.0 or HTTP/1.1")
	}
	return nil
}

func (h *Head) fieldLine(b []byte, line span) error {
	l := line.of(b)
	if l[0] == ' ' || l[0] == '\t' {
		return errBadRequest("a header line continues the one before it (obs-fold)")
	}
	c := bytes.IndexByte(l, ':')
	if c <= 0 || !isToken(l[:c]) {
		return errBadRequest("a header name is empty, holds whitespace or a character outside a token, or has no colon")
	}
	vs, ve := c+1, len(l)
	for vs < ve && (l[vs] == ' ' || l[vs] == '\t') {
		vs++
	}
	for ve > vs && (l[ve-1] == ' ' || l[ve-1] == '\t') {
		ve--
	}
	for _, ch := range l[vs:ve] {
		if ch < ' ' && ch != '\t' || ch == 0x7f {
			return errBadRequest("a header value holds a control character")
		}
	}
	h.fields = append(h.fields, field{
		name:  span{line.at, line.at + int32(c)},
		value: span{line.at + int32(vs), line.at + int32(ve)},
	})
	return nil
}

// absolutePath finds the path in an absolute-form target, "http://" or
// "https://" (any case), an authority without userinfo, then the path
// from its "/" (-1: none, the target is the root). ok is false for any
// other target.
func absolutePath(t []byte) (path int, ok bool) {
	i := bytes.Index(t, []byte("://"))
	if i < 0 || !FoldEq(t[:i], "http") && !FoldEq(t[:i], "https") {
		return 0, false
	}
	a := i + 3
	j := a
	for j < len(t) && t[j] != '/' {
		if t[j] == '@' || t[j] == '?' || t[j] == '#' || t[j] == '\\' {
			return 0, false
		}
		j++
	}
	if j == a || !validHost(t[a:j]) {
		return 0, false
	}
	if j == len(t) {
		return -1, true
	}
	return j, true
}

// uniques are the fields of which a request may carry one line only:
// nginx's unique fields that frame or route it, and the sidecar's own
// that pick a tenant, session or end user.
var uniques = [...]string{"Host", "Content-Length", "Transfer-Encoding", "Authorization", "Content-Type",
	"X-Session-ID", "X-User-ID", "X-Session-Mode", "X-Pool-Prefix"}

// settle reads the fields that frame the request and drops the hop-by-hop
// ones.
func (h *Head) settle(b []byte, lim Limits) error {
	var seen [len(uniques)]int8
	var host, cl, te span
	keepAlive := false
	for _, f := range h.fields {
		name := f.name.of(b)
		for u, n := range uniques {
			if FoldEq(name, n) {
				if seen[u]++; seen[u] > 1 {
					return errBadRequest("the request has two " + n + " header lines")
				}
				switch u {
				case 0:
					host = f.value
				case 1:
					cl = f.value
				case 2:
					te = f.value
				}
				break
			}
		}
		if FoldEq(name, "Connection") {
			h.conn = append(h.conn, f.value)
		}
	}
	// Connection: its options, and the fields it names as hop-by-hop.
	listed := false
	for _, v := range h.conn {
		for tok := range tokens(v.of(b)) {
			switch {
			case FoldEq(tok, "close"):
				h.Close = true
			case FoldEq(tok, "keep-alive"):
				keepAlive = true
			case FoldEq(tok, "host"), FoldEq(tok, "content-length"), FoldEq(tok, "transfer-encoding"):
				return errBadRequest("the Connection header names a header that frames the request")
			default:
				listed = true
			}
		}
	}
	if h.Minor == 0 && !keepAlive {
		h.Close = true
	}
	if seen[0] == 0 && h.Minor == 1 {
		return errBadRequest("an HTTP/1.1 request needs a Host header")
	}
	if seen[0] == 1 && !validHost(host.of(b)) {
		return errBadRequest("the Host header is not a host name")
	}
	if seen[1] == 1 {
		v := cl.of(b)
		if len(v) == 0 || len(v) > 18 {
			return errBadRequest("the Content-Length header is not a length")
		}
		var n int64
		for _, ch := range v {
			if !isDigit(ch) {
				return errBadRequest("the Content-Length header is not a length")
			}
			n = n*10 + int64(ch-'0')
		}
		h.Framing, h.Length = FrameLength, n
	}
	if seen[2] == 1 {
		if h.Minor == 0 {
			return errBadRequest("an HTTP/1.0 request cannot have a Transfer-Encoding")
		}
		if !FoldEq(te.of(b), "chunked") {
			return &Error{Status: 400, Code: "transfer_encoding_not_supported", Msg: "the only Transfer-Encoding served is chunked"}
		}
		if seen[1] == 1 {
			return errBadRequest("the request has both Content-Length and Transfer-Encoding")
		}
		h.Framing, h.Length = FrameChunked, 0
	}
	if lim.MaxBody > 0 && h.Length > lim.MaxBody {
		return errTooLarge(lim.MaxBody)
	}
	// Expect: 100-continue is answered here; other expectations are
	// ignored, as nginx does.
	if v, ok := h.Get(b, "Expect"); ok && h.Minor == 1 && FoldEq(v, "100-continue") && h.Framing != FrameNone {
		h.Continue = true
	}
	// Keep the end-to-end fields. A name of other characters than
	// letters, digits and '-' (an underscore, a dot) is dropped as nginx
	// drops it (ignore_invalid_headers, underscores_in_headers off): a
	// server behind could read "X_User_ID" as "X-User-ID".
	kept := h.fields[:0]
	for _, f := range h.fields {
		name := f.name.of(b)
		if hopByHop(name) || FoldEq(name, "Content-Length") || FoldEq(name, "Expect") || listed && h.listed(b, name) || !plainName(name) {
			continue
		}
		kept = append(kept, f)
	}
	h.fields = kept
	return nil
}

// listed reports whether a Connection field lists name.
func (h *Head) listed(b, name []byte) bool {
	for _, v := range h.conn {
		if listedIn(v.of(b), name) {
			return true
		}
	}
	return false
}

// tokens yields the comma-separated, trimmed, non-empty elements of v.
func tokens(v []byte) func(func([]byte) bool) {
	return func(yield func([]byte) bool) {
		for len(v) > 0 {
			var t []byte
			if i := bytes.IndexByte(v, ','); i >= 0 {
				t, v = v[:i], v[i+1:]
			} else {
				t, v = v, nil
			}
			if t = bytes.Trim(t, " \t"); len(t) > 0 && !yield(t) {
				return
			}
		}
	}
}

// HopByHop reports whether the field name is hop-by-hop, never forwarded:
// one RFC 9110 §7.6.1 names (and the Proxy-* fields of RFC 2616 §13.5.1),
// or one the message's Connection value conn lists. Names compare without
// case, byte by byte (no canonical copy). The one rule of the front door's
// reader, the loop's answers and the proxy's header copies.
func HopByHop(name, conn []byte) bool { return hopByHop(name) || listedIn(conn, name) }

// hopByHop reports whether name is a hop-by-hop field (RFC 9110 §7.6.1,
// and the Proxy-* fields of RFC 2616 §13.5.1).
func hopByHop(k []byte) bool {
	switch len(k) {
	case 2:
		return FoldEq(k, "TE")
	case 7:
		return FoldEq(k, "Trailer") || FoldEq(k, "Upgrade")
	case 10:
		return FoldEq(k, "Connection") || FoldEq(k, "Keep-Alive")
	case 16:
		return FoldEq(k, "Proxy-Connection")
	case 17:
		return FoldEq(k, "Transfer-Encoding")
	case 18:
		return FoldEq(k, "Proxy-Authenticate")
	case 19:
		return FoldEq(k, "Proxy-Authorization")
	}
	return false
}

// validHost applies nginx's check of a Host value (ngx_http_validate_host):
// not empty once a port and a final dot are cut, no whitespace, control
// character, '/' or '\\', no empty label.
func validHost(v []byte) bool {
	hostLen, dot := len(v), -2
	literal, rest := false, false
	for i, ch := range v {
		switch {
		case ch == '.':
			if dot == i-1 {
				return false
			}
			dot = i
		case ch == ':':
			if !rest && !literal {
				hostLen, rest = i, true
			}
		case ch == '[':
			if i == 0 {
				literal = true
			}
		case ch == ']':
			if literal && !rest {
				hostLen, rest, literal = i+1, true, false
			}
		case ch <= ' ' || ch == 0x7f || ch == '/' || ch == '\\':
			return false
		}
	}
	if dot == hostLen-1 {
		hostLen--
	}
	return hostLen > 0
}

// plainName reports whether k holds only letters, digits and '-'.
func plainName(k []byte) bool {
	for _, ch := range k {
		if !('a' <= ch|0x20 && ch|0x20 <= 'z' || isDigit(ch) || ch == '-') {
			return false
		}
	}
	return true
}

// isToken reports whether k is an HTTP token (RFC 9110 §5.6.2).
func isToken(k []byte) bool {
	for _, ch := range k {
		if !tokenChar[ch] {
			return false
		}
	}
	return len(k) > 0
}

var tokenChar = func() (t [256]bool) {
	for ch := 0x21; ch < 0x7f; ch++ {
		t[ch] = true
	}
	for _, ch := range []byte(`"(),/:;<=>?@[\]{}`) {
		t[ch] = false
	}
	return t
}()

func isDigit(ch byte) bool { return '0' <= ch && ch <= '9' }

// FoldEq reports whether b equals s, ASCII letters compared without case:
// how a field name (or the "Bearer " of an Authorization value) is
// compared, byte by byte, with no canonical copy.
func FoldEq[S ~string | ~[]byte](b []byte, s S) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
