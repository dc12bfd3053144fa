package proxy

import (
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory"
)

// TestWalkOneChatTurn serves the typical chat request and nothing else: a
// session's second turn, from a memory-layer client that sends only its
// newest message (docs/DESIGN.md), streamed, with memory on, after the
// first turn that made the session. scripts/walk.sh runs it alone with
// coverage and walks bench/walk over what it executed, so keep it to
// these two requests: another request here changes the walk's figures.
func TestWalkOneChatTurn(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	hdr := map[string]string{"Authorization": "Bearer k", "X-Session-ID": "walk-1"}
	turn := func(text string) {
		t.Helper()
		resp, b := post(t, base+"/v1/chat/completions",
			`{"model":"m","stream":true,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":`+jsonString(text)+`}]}`, hdr)
		if resp.StatusCode != 200 || !strings.Contains(string(b), jsonString(text)) || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("%q: %d %s", text, resp.StatusCode, b)
		}
		srv.waitIdle() // the reply recorded
	}
	turn("my boat is called Petrel")
	turn("where is it moored?")

	n := len(up.Bodies())
	if n != 2 {
		t.Fatalf("the upstream saw %d requests, want the 2 turns", n)
	}
	// The second turn's window carries the first turn, its reply, then
	// the new message.
	got := up.Last()
	first, reply, second := strings.Index(got, `"my boat is called Petrel"`), strings.Index(got, `"echo: my boat is called Petrel"`), strings.Index(got, "where is it moored?")
	if first < 0 || reply < first || second < reply {
		t.Fatalf("second turn's window lost the first turn: %s", got)
	}
}
