package frontdoor

import "testing"

// What the proxy's upstream body asks before a read (proxy/upclient.go):
// whether the buffer holds a whole chunk, or a whole body.

func TestPeekChunk(t *testing.T) {
	peekWhole := func(p []byte) bool { _, _, ok := PeekChunk(p); return ok }
	f := func(p string, want bool) {
		t.Helper()
		if got := peekWhole([]byte(p)); got != want {
			t.Errorf("PeekChunk(%q) whole = %v, want %v", p, got, want)
		}
	}
	f("3\r\nabc\r\n", true)
	f("3\r\nabc\r\n4\r\nmore", true) // the next chunk need not be whole
	f("a\r\n0123456789\r\n", true)
	f("A;ext=1\r\n0123456789\r\n", true)
	f("3 \r\nabc\r\n", true)
	f("0\r\n\r\n", true)
	f("0;x\r\n\r\n", true)
	for _, p := range []string{
		"", "3", "3\r", "3\r\n", "3\r\nab", "3\r\nabc", "3\r\nabc\r", // cut anywhere
		"0\r\n", "0\r\n\r", "0\r\nTrailer: x\r\n\r\n", // trailers are not looked into
		"x\r\nabc\r\n", "\r\n", "3x\r\nabc\r\n", "3;ext", "3\nabc\r\n",
		"123456789\r\n", // more digits than any buffer holds
	} {
		f(p, false)
	}
}

func TestWholeChunks(t *testing.T) {
	f := func(p string, want bool) {
		t.Helper()
		if got := WholeChunks([]byte(p)); got != want {
			t.Errorf("WholeChunks(%q) = %v, want %v", p, got, want)
		}
	}
	f("0\r\n\r\n", true)
	f("3\r\nabc\r\n0\r\n\r\n", true)
	f("3\r\nabc\r\na;x\r\n0123456789\r\n0\r\n\r\nHTTP/1.1", true) // what follows is not this body's
	for _, p := range []string{
		"", "3\r\nabc\r\n", "3\r\nabc\r\n0\r\n", "3\r\nabc\r\n0\r\n\r", // not ended yet
		"3\r\nab", "3\r\nabc\r\n4\r\nab",
		"0\r\nTrailer: x\r\n\r\n", // trailers: read as a stream
		"x\r\n\r\n",
	} {
		f(p, false)
	}
}
