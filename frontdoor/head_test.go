package frontdoor

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// canon parses raw whole and returns its canonical head (with the body's
// length line), or the refusal's status.
func canon(raw string, lim Limits) (string, int) {
	var h Head
	b := []byte(raw)
	if err := h.Parse(b, lim); err != nil {
		var fe *Error
		if errors.As(err, &fe) {
			return "", fe.Status
		}
		return "", -1 // ErrNeedMore
	}
	out := appendCanonical(nil, &h, b)
	switch h.Framing {
	case FrameLength:
		out = appendLength(out, h.Length)
	case FrameChunked:
		out = append(out, "Transfer-Encoding: chunked\r\n\r\n"...)
	default:
		out = append(out, "\r\n"...)
	}
	return string(out), 0
}

func TestParse(t *testing.T) {
	const host = "Host: a\r\n"
	for _, tc := range []struct {
		name, raw string
		status    int    // 0: accepted; -1: needs more
		want      string // the canonical head when accepted
	}{
		{"plain", "GET / HTTP/1.1\r\n" + host + "\r\n", 0, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"post", "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}", 0,
			"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"},
		{"values trimmed", "GET / HTTP/1.1\r\nHost:a \r\nX-A: \t b c \t\r\n\r\n", 0, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b c\r\n\r\n"},
		{"bare LF accepted as nginx", "GET / HTTP/1.1\nHost: a\nX: 1\n\n", 0, "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n"},
		{"empty lines first", "\r\n\nGET / HTTP/1.1\r\n" + host + "\r\n", 0, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"1.0 without host closes", "GET / HTTP/1.0\r\n\r\n", 0, "GET / HTTP/1.0\r\n\r\n"},
		{"1.0 keep-alive", "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 0, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"},
		{"close", "GET / HTTP/1.1\r\n" + host + "Connection: close\r\n\r\n", 0, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"},
		{"hop-by-hop dropped", "GET / HTTP/1.1\r\n" + host + "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Authorization: x\r\nX-Keep: 2\r\n\r\n", 0,
			"GET / HTTP/1.1\r\nHost: a\r\nX-Keep: 2\r\n\r\n"},
		{"listed authorization dropped before anyone reads it", "GET / HTTP/1.1\r\n" + host + "Authorization: Bearer k\r\nConnection: Authorization\r\n\r\n", 0,
			"GET / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"chunked any case", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: Chunked \r\n\r\n", 0, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"expect dropped", "POST / HTTP/1.1\r\n" + host + "Expect: 100-continue\r\nContent-Length: 1\r\n\r\n", 0, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n"},
		{"underscore and dot names dropped as nginx drops them", "GET / HTTP/1.1\r\n" + host + "X_User_ID: 1\r\nX.A: 2\r\nX-B-9: 3\r\n\r\n", 0, "GET / HTTP/1.1\r\nHost: a\r\nX-B-9: 3\r\n\r\n"},
		{"obs-text value", "GET / HTTP/1.1\r\n" + host + "X: caf\xc3\xa9\r\n\r\n", 0, "GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n"},
		{"host with a percent: accepted, escaped for the server behind", "GET / HTTP/1.1\r\nHost: %x:80\r\n\r\n", 0, "GET / HTTP/1.1\r\nHost: %25x:80\r\n\r\n"},
		{"ipv6 host", "GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", 0, "GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"},

		{"incomplete", "GET / HTTP/1.1\r\nHost: a\r\n", -1, ""},
		{"incomplete line", "GET / HT", -1, ""},
		{"CL and TE", "POST / HTTP/1.1\r\n" + host + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", 400, ""},
		{"TE and CL", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", 400, ""},
		{"TE identity", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: identity\r\nContent-Length: 4\r\n\r\n", 400, ""},
		{"TE list", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: gzip, chunked\r\n\r\n", 400, ""},
		{"TE chunked twice", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400, ""},
		{"TE in 1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, ""},
		{"TE with tab junk", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: \x0bchunked\r\n\r\n", 400, ""},
		{"TE name with space", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding : chunked\r\n\r\n", 400, ""},
		{"obs-fold", "POST / HTTP/1.1\r\n" + host + "X: a\r\n Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", 400, ""},
		{"obs-fold tab", "GET / HTTP/1.1\r\n" + host + "X: a\r\n\tb\r\n\r\n", 400, ""},
		{"space in name", "GET / HTTP/1.1\r\n" + host + "Author ization: x\r\n\r\n", 400, ""},
		{"space before colon", "GET / HTTP/1.1\r\n" + host + "Authorization : x\r\n\r\n", 400, ""},
		{"no colon", "GET / HTTP/1.1\r\n" + host + "Foo\r\n\r\n", 400, ""},
		{"empty name", "GET / HTTP/1.1\r\n" + host + ": x\r\n\r\n", 400, ""},
		{"lower-case method", "post / HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"method with digit", "P0ST / HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"two spaces", "GET  / HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"space in target", "GET /a b HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"absolute form", "GET http://b.example/v1/x?q=1 HTTP/1.1\r\n" + host + "\r\n", 0, "GET /v1/x?q=1 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"absolute form, root", "GET HTTPS://b:8 HTTP/1.1\r\n" + host + "\r\n", 0, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"},
		{"absolute form with userinfo", "GET http://u@b/ HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"absolute form, other scheme", "GET ftp://b/ HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"absolute form, no authority", "GET http:///x HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"absolute form, query at root", "GET http://b?x HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"asterisk", "OPTIONS * HTTP/1.1\r\n" + host + "\r\n", 400, ""},
		{"no version", "GET /\r\n\r\n", 400, ""},
		{"http2", "GET / HTTP/2.0\r\n" + host + "\r\n", 400, ""},
		{"bad version", "GET / HTTP/1.1x\r\n" + host + "\r\n", 400, ""},
		{"lower version", "GET / http/1.1\r\n" + host + "\r\n", 400, ""},
		{"two authorization", "GET / HTTP/1.1\r\n" + host + "Authorization: a\r\nauthorization: b\r\n\r\n", 400, ""},
		{"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, ""},
		{"two lengths same", "POST / HTTP/1.1\r\n" + host + "Content-Length: 1\r\nContent-Length: 1\r\n\r\n", 400, ""},
		{"length list", "POST / HTTP/1.1\r\n" + host + "Content-Length: 1, 1\r\n\r\n", 400, ""},
		{"signed length", "POST / HTTP/1.1\r\n" + host + "Content-Length: +1\r\n\r\n", 400, ""},
		{"hex length", "POST / HTTP/1.1\r\n" + host + "Content-Length: 0x1\r\n\r\n", 400, ""},
		{"empty length", "POST / HTTP/1.1\r\n" + host + "Content-Length:\r\n\r\n", 400, ""},
		{"huge length", "POST / HTTP/1.1\r\n" + host + "Content-Length: 99999999999999999999\r\n\r\n", 400, ""},
		{"two session ids", "GET / HTTP/1.1\r\n" + host + "X-Session-ID: a\r\nX-Session-Id: b\r\n\r\n", 400, ""},
		{"two user ids", "GET / HTTP/1.1\r\n" + host + "X-User-ID: a\r\nX-User-ID: a\r\n\r\n", 400, ""},
		{"no host", "GET / HTTP/1.1\r\n\r\n", 400, ""},
		{"empty host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", 400, ""},
		{"host with space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, ""},
		{"host with slash", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, ""},
		{"host with dots", "GET / HTTP/1.1\r\nHost: a..b\r\n\r\n", 400, ""},
		{"NUL in value", "GET / HTTP/1.1\r\n" + host + "X: a\x00b\r\n\r\n", 400, ""},
		{"CR in value", "GET / HTTP/1.1\r\n" + host + "X: a\rb\r\n\r\n", 400, ""},
		{"bare CR line end", "GET / HTTP/1.1\r" + host + "\r\n", 400, ""},
		{"DEL in value", "GET / HTTP/1.1\r\n" + host + "X: a\x7f\r\n\r\n", 400, ""},
		{"connection lists length", "POST / HTTP/1.1\r\n" + host + "Connection: Content-Length\r\nContent-Length: 1\r\n\r\n", 400, ""},
		{"connection lists host", "GET / HTTP/1.1\r\n" + host + "Connection: host\r\n\r\n", 400, ""},
	} {
		got, status := canon(tc.raw, Limits{})
		if status != tc.status || got != tc.want {
			t.Errorf("%s: got %d %q, want %d %q", tc.name, status, got, tc.status, tc.want)
		}
	}
}

func TestParseLimits(t *testing.T) {
	lim := Limits{MaxHead: 1024, MaxLine: 256, MaxBody: 100}
	f := func(name, raw string, want int) {
		t.Helper()
		if _, got := canon(raw, lim); got != want {
			t.Errorf("%s: status %d, want %d", name, got, want)
		}
	}
	long := strings.Repeat("a", 300)
	f("long target", "GET /"+long+" HTTP/1.1\r\nHost: a\r\n\r\n", 414)
	f("long target still coming", "GET /"+long, 414)
	f("long line", "GET / HTTP/1.1\r\nHost: a\r\nX: "+long+"\r\n\r\n", 431)
	f("long line still coming", "GET / HTTP/1.1\r\nHost: a\r\nX: "+long, 431)
	many := strings.Repeat("X: "+strings.Repeat("b", 200)+"\r\n", 6)
	f("large head", "GET / HTTP/1.1\r\nHost: a\r\n"+many+"\r\n", 431)
	f("large head still coming", "GET / HTTP/1.1\r\nHost: a\r\n"+many, 431)
	f("body over the limit", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n", 413)
	f("body at the limit", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n", 0)
	f("many fields", "GET / HTTP/1.1\r\nHost: a\r\n"+strings.Repeat("a:\n", maxFields+1)+"\r\n", 431)
	// The default limits take a 5 KiB head, as nginx does.
	if _, got := canon("GET / HTTP/1.1\r\nHost: a\r\nCookie: "+strings.Repeat("c", 5<<10)+"\r\n\r\n", Limits{}); got != 0 {
		t.Errorf("5 KiB cookie: %d", got)
	}
}

// TestParseSplitAnywhere: a head cut at any byte needs more, and whole it
// parses the same.
func TestParseSplitAnywhere(t *testing.T) {
	raw := []byte("\r\nPOST /x?y=1 HTTP/1.1\r\nHost: a:1\nContent-Length: 3\r\nX-A:  b \r\nConnection: close, X-A\r\n\r\nabc")
	var h Head
	if err := h.Parse(raw, Limits{}); err != nil {
		t.Fatal(err)
	}
	end := h.Len
	for i := range end {
		if err := h.Parse(raw[:i], Limits{}); err != ErrNeedMore {
			t.Fatalf("cut at %d: %v", i, err)
		}
	}
	if err := h.Parse(raw, Limits{}); err != nil || h.Len != end || h.Length != 3 || !h.Close || h.NumFields() != 1 {
		t.Fatalf("whole: %v %+v", err, h)
	}
}

// feedChunked feeds body and "NEXT" to d in pieces of step bytes: the data
// decoded, whether the body ended, the status of an error, what follows.
func feedChunked(t *testing.T, d *Chunked, body string, step int) (out []byte, done bool, status int, rest string) {
	t.Helper()
	b := []byte(body + "NEXT")
	at := 0
	for at < len(b) && !done {
		end := min(at+step, len(b))
		n, dn, err := d.Feed(b[at:end], &out, 64, 32)
		at += n
		done = dn
		if err != nil {
			var fe *Error
			errors.As(err, &fe)
			return out, false, fe.Status, ""
		}
		if !dn && n != end-(at-n) {
			t.Fatalf("consumed %d of %d without ending", n, end-(at-n))
		}
	}
	return out, done, 0, string(b[at:])
}

func TestChunked(t *testing.T) {
	f := func(name, body, want string, status int, lenient bool) {
		t.Helper()
		for _, step := range []int{1, 2, 3, len(body)} {
			d := Chunked{Lenient: lenient}
			out, done, status2, rest := feedChunked(t, &d, body, step)
			if status2 != status {
				t.Errorf("%s (step %d, lenient %v): status %d, want %d", name, step, lenient, status2, status)
				continue
			}
			if status == 0 && (!done || string(out) != want || rest != "NEXT") {
				t.Errorf("%s (step %d, lenient %v): done %v out %q rest %q", name, step, lenient, done, out, rest)
			}
		}
	}
	// strict, and lenient: an upstream's answer is read as a client's
	// request where the strict rules hold for it too.
	both := func(name, body, want string, status int) {
		t.Helper()
		f(name, body, want, status, false)
		f(name, body, want, status, true)
	}
	both("plain", "3\r\nabc\r\n0\r\n\r\n", "abc", 0)
	both("two chunks", "1\r\na\r\n2\r\nbc\r\n0\r\n\r\n", "abc", 0)
	both("bare LF", "3\nabc\n0\n\n", "abc", 0)
	both("extension", "3;name=val ue\r\nabc\r\n0;x\r\n\r\n", "abc", 0)
	both("leading zeros, upper hex", "00A\r\n0123456789\r\n0\r\n\r\n", "0123456789", 0)
	both("trailers dropped", "3\r\nabc\r\n0\r\nX-Session-ID: from-trailer\r\nX-User-ID: alice\r\n\r\n", "abc", 0)
	both("no size", "\r\nabc\r\n0\r\n\r\n", "", 400)
	both("junk size", "g\r\nabc\r\n0\r\n\r\n", "", 400)
	both("negative size", "-3\r\nabc\r\n0\r\n\r\n", "", 400)
	both("overflow", "fffffffffffffffff\r\n", "", 400)
	both("data longer than size", "2\r\nabc\r\n0\r\n\r\n", "", 400)
	both("CR without LF after data", "3\r\nabc\rx0\r\n\r\n", "", 400)
	both("over the body limit", "41\r\n"+strings.Repeat("a", 65)+"\r\n0\r\n\r\n", "", 413)
	// strict only: a client's request; an upstream's answer passes.
	for _, c := range []struct{ name, body, want string }{
		{"CR without LF", "3\rabc\r\n0\r\n\r\n", ""}, // the size line ends at the LF: "3" and its data
		{"folded trailer", "0\r\nX: a\r\n b\r\n\r\n", ""},
		{"trailer without colon", "0\r\nX\r\n\r\n", ""},
		{"trailer name with space", "0\r\nX Y: a\r\n\r\n", ""},
		{"NUL in trailer", "0\r\nX: a\x00\r\n\r\n", ""},
		{"NUL in extension", "3;a\x00\r\nabc\r\n0\r\n\r\n", "abc"},
		{"long extension", "3;" + strings.Repeat("e", 40) + "\r\nabc\r\n0\r\n\r\n", "abc"},
		{"long trailer", "0\r\nX: " + strings.Repeat("t", 40) + "\r\n\r\n", ""},
	} {
		f(c.name, c.body, "", 400, false)
		if c.name != "CR without LF" {
			f(c.name, c.body, c.want, 0, true)
		}
	}
	f("CR without LF", "3\rjunk\nabc\r\n0\r\n\r\n", "abc", 0, true)

	// Reset keeps the kind; out nil skips the data.
	d := Chunked{Lenient: true}
	d.Reset()
	if !d.Lenient {
		t.Fatal("Reset forgot Lenient")
	}
	if n, done, err := d.Feed([]byte("3\r\nabc\r\n0\r\n\r\n"), nil, 0, 0); n != 13 || !done || err != nil {
		t.Fatalf("Feed without out: %d %v %v", n, done, err)
	}
}

// FuzzParse: whatever the bytes, Parse ends within the head's bounds, and
// what it accepts it writes in a canonical form that parses to the same
// form again (so the server behind the door reads what the door decided).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nAuthorization: Bearer k\r\n\r\n{}",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX: y\r\n\r\n",
		"GET / HTTP/1.0\nConnection: keep-alive, X\nX: 1\n\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		lim := Limits{MaxHead: 2048, MaxLine: 512, MaxBody: 1 << 20}
		var h Head
		err := h.Parse(b, lim)
		if err != nil {
			var fe *Error
			if err != ErrNeedMore && !errors.As(err, &fe) {
				t.Fatalf("error of another kind: %v", err)
			}
			if fe != nil && bytes.Contains([]byte(fe.Msg), b) && len(b) > 8 {
				t.Fatalf("the message quotes the request")
			}
			return
		}
		if h.Len > len(b) || h.Len > lim.MaxHead {
			t.Fatalf("head of %d bytes from %d", h.Len, len(b))
		}
		c1 := appendCanonical(nil, &h, b)
		c1 = appendLength(c1, h.Length)
		var h2 Head
		if err := h2.Parse(c1, Limits{MaxHead: 4096, MaxLine: 1024, MaxBody: 1 << 20}); err != nil {
			t.Fatalf("canonical %q refused: %v", c1, err)
		}
		c2 := appendLength(appendCanonical(nil, &h2, c1), h2.Length)
		if host, _ := h.Get(b, "Host"); bytes.IndexByte(host, '%') >= 0 {
			return // a '%' in a Host is escaped for the server behind, each time by design
		}
		if !bytes.Equal(c1, c2) || h2.Close != h.Close || h2.Minor != h.Minor {
			t.Fatalf("canonical form not stable:\n%q\n%q", c1, c2)
		}
		// The body's Chunked decoder takes what follows, whatever it is.
		if h.Framing == FrameChunked {
			var d Chunked
			var out []byte
			n, _, _ := d.Feed(b[h.Len:], &out, 1<<20, 512)
			if n > len(b)-h.Len || len(out) > len(b) {
				t.Fatalf("chunked decoder read past its input")
			}
			d = Chunked{Lenient: true} // as an upstream's answer
			out = out[:0]
			n, _, _ = d.Feed(b[h.Len:], &out, 0, 0)
			if n > len(b)-h.Len || len(out) > len(b) {
				t.Fatalf("lenient chunked decoder read past its input")
			}
		}
	})
}

// TestHopByHop: hop-by-hop names and the names a Connection value lists
// are hop-by-hop in any case and spacing; end-to-end ones are not.
func TestHopByHop(t *testing.T) {
	for _, k := range []string{"Connection", "connection", "KEEP-ALIVE", "te", "TE", "Trailer", "upgrade",
		"Proxy-Connection", "transfer-encoding", "Proxy-Authenticate", "proxy-authorization"} {
		if !HopByHop([]byte(k), nil) {
			t.Errorf("%s is not hop-by-hop", k)
		}
	}
	for _, k := range []string{"Authorization", "Content-Type", "X-Stainless-Lang", "Tee", "Upgrades", "Keep-Alivx", ""} {
		if HopByHop([]byte(k), nil) {
			t.Errorf("%s is hop-by-hop", k)
		}
	}
	conn := []byte("close,  X-Foo ,x-bar\t, ")
	for _, k := range []string{"X-Foo", "x-foo", "X-BAR", "close"} {
		if !HopByHop([]byte(k), conn) {
			t.Errorf("%s is listed in %q", k, conn)
		}
	}
	for _, k := range []string{"X-Fo", "X-Foo-2", "bar", ""} {
		if HopByHop([]byte(k), conn) {
			t.Errorf("%s is not listed in %q", k, conn)
		}
	}
}
