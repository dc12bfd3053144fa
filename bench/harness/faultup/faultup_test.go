package faultup

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// Each fault does what its name says, seen from a plain HTTP client.
func TestFaults(t *testing.T) {
	s := New(Options{StallFor: 300 * time.Millisecond, HugeBytes: 1 << 20, SlowGap: time.Millisecond, LongWordBytes: 10 << 10})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	defer s.Close()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, ResponseHeaderTimeout: 2 * time.Second}} // the hang faults wait it out; 200 ms was too short for a long word on busy cores
	for _, f := range append(All[:len(All):len(All)], LongWord) {
		for _, stream := range []bool{false, true} {
			req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat/completions",
				bytes.NewReader([]byte(fmt.Sprintf(`{"stream":%v,"messages":[{"role":"user","content":"x"}]}`, stream))))
			req.Header.Set("X-Fault", string(f))
			resp, err := client.Do(req)
			var body []byte
			var readErr error
			if err == nil {
				body, readErr = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			whole := err == nil && readErr == nil && resp.StatusCode == 200 &&
				(stream && bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) || !stream && json.Valid(body))
			switch want := Expect(f, stream); {
			case f == Garbage && stream:
				if err != nil || !bytes.Contains(body, []byte("data: <html>")) {
					t.Errorf("%s stream: %v %q", f, err, body)
				}
			case f == Huge && !stream:
				if err != nil || len(body) < 1<<20 {
					t.Errorf("%s: %v, %d bytes", f, err, len(body))
				}
			case f == FinishNoDone && stream:
				if err != nil || readErr != nil || bytes.Contains(body, []byte("[DONE]")) || !bytes.Contains(body, []byte(`"finish_reason":"stop"`)) {
					t.Errorf("%s stream: %v %v %q", f, err, readErr, body)
				}
			case want == Clean && !whole:
				t.Errorf("%s stream=%v: want a whole answer, got %v %v %.100q", f, stream, err, readErr, body)
			case want == Broken && whole:
				t.Errorf("%s stream=%v: a whole answer", f, stream)
			case want == Passed && (err != nil || resp.StatusCode == 200 && json.Valid(body)):
				t.Errorf("%s stream=%v: want the upstream's own answer, got %v %.100q", f, stream, err, body)
			}
		}
	}
	if c := s.Counts(); c[OK] != 2 || c[Stall] != 2 {
		t.Fatalf("counts %v", c)
	}
}
