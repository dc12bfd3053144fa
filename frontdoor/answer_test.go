package frontdoor

import "testing"

// TestReadAnswerHead: an answer's status and framing as the forward path's
// client reads them; a head it refuses is refused (RepairFraming may then
// mend it).
func TestReadAnswerHead(t *testing.T) {
	for _, c := range []struct {
		head    string
		ok      bool
		status  int
		framing uint8
		length  int64
		close   bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", true, 200, frLength, 3, false},
		{"HTTP/1.1 200 OK\nTransfer-Encoding: Chunked\n\n", true, 200, frChunked, 0, false},
		{"HTTP/1.1 200 OK\r\n\r\n", true, 200, frClose, 0, false},
		{"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", true, 200, frLength, 2, true},
		{"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n", true, 200, frLength, 0, true},
		{"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n", true, 204, frLength, 0, false},
		{"HTTP/1.1 100 Continue\r\n\r\n", true, 100, frLength, 0, false},
		{"HTTP/1.1 299\r\nContent-Length: 1\r\n\r\n", true, 299, frLength, 1, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", false, 0, 0, 0, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n", false, 0, 0, 0, false},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false, 0, 0, 0, false},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n", false, 0, 0, 0, false},
		{"HTTP/1.1 200 OK\r\nX Y: 1\r\n\r\n", false, 0, 0, 0, false},
		{"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n", false, 0, 0, 0, false},
		{"HTTP/1.1 2x0 OK\r\n\r\n", false, 0, 0, 0, false},
		{"HTTP/2.0 200 OK\r\n\r\n", false, 0, 0, 0, false},
	} {
		a, ok := readAnswerHead([]byte(c.head))
		if ok != c.ok || ok && (a.status != c.status || a.framing != c.framing || a.length != c.length || a.close != c.close) {
			t.Errorf("readAnswerHead(%q) = %+v, %v", c.head, a, ok)
		}
		if end := answerHeadEnd([]byte(c.head + "body")); end != len(c.head) {
			t.Errorf("answerHeadEnd(%q) = %d, want %d", c.head, end, len(c.head))
		}
	}
	if end := answerHeadEnd([]byte("HTTP/1.1 200 OK\r\nA: b\r\n")); end != -1 {
		t.Errorf("a head without its end ends at %d", end)
	}
}

// TestAppendAnswerFields: the client gets the answer's end-to-end fields,
// with fasthttp's name normalisation; hop-by-hop ones, those Connection
// lists, Content-Length and Date stay behind.
func TestAppendAnswerFields(t *testing.T) {
	head := "HTTP/1.1 201 Whatever\r\nx-lower: a\r\nX-Multi: 1\r\nX-Multi: 2\r\nConnection: keep-alive, X-Drop\r\nX-Drop: yes\r\n" +
		"Keep-Alive: timeout=5\r\nContent-Length: 3\r\nDate: then\r\nTransfer-Encoding: chunked\r\nCONTENT-TYPE:  text/plain \r\n\r\n"
	want := "X-Lower: a\r\nX-Multi: 1\r\nX-Multi: 2\r\nContent-Type: text/plain\r\n"
	if got := string(appendAnswerFields(nil, []byte(head))); got != want {
		t.Errorf("appendAnswerFields:\n%q\nwant\n%q", got, want)
	}
}

// TestRepairFraming: a head fasthttp refuses for its framing is read as
// lenient clients read it; every other line is kept.
func TestRepairFraming(t *testing.T) {
	for in, want := range map[string]string{
		"HTTP/1.1 200 OK\r\nA: b\r\n\r\n":                                                  "HTTP/1.1 200 OK\r\nA: b\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: string\r\nContent-Length: 3\r\n\r\n":        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n":                                  "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n":                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
	} {
		if got := string(RepairFraming([]byte(in))); got != want {
			t.Errorf("RepairFraming(%q) = %q, want %q", in, got, want)
		}
		if a, ok := readAnswerHead(RepairFraming([]byte(in))); ok && a.status != 200 {
			t.Errorf("the repaired %q reads as %+v", in, a)
		}
	}
}
