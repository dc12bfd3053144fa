package proxy

import (
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/memory"
)

// TestWindowCounters: the counters the console reads (package admin) add
// up the windows built and the recall latencies of the turns that
// recalled; a turn that recalled nothing is not a recall.
func TestWindowCounters(t *testing.T) {
	s, err := New(Options{Upstream: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	s.mem.prepare[0].Observe(time.Minute)           // full
	s.mem.prepare[1].Observe(10 * time.Millisecond) // reuse
	s.mem.prepare[2].Observe(time.Hour)             // none: not a recall
	s.mem.turns.Add(3)
	s.mem.windowTokens.Add(990)
	s.mem.windowLimit.Add(1000)
	turns, tokens, limit, recall := s.WindowCounters()
	if turns != 3 || tokens != 990 || limit != 1000 || recall.Count() != 2 || recall.Sum() != time.Minute+10*time.Millisecond {
		t.Fatalf("counters %d %d %d, recall %d in %s", turns, tokens, limit, recall.Count(), recall.Sum())
	}
}

// chatOnlyMemory is a Memory without a session listing.
type chatOnlyMemory struct{ chatMemory }

type chatMemory = Memory

// TestChatOnlyMemory: the proxy takes a Memory that cannot list sessions
// (the console, package admin, needs one that can); GET /v1/sessions then
// says it is not supported.
func TestChatOnlyMemory(t *testing.T) {
	st := openMemory(t, memory.Options{})
	up := newRecordingUpstream(t)
	base, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory = chatOnlyMemory{st} })
	resp, b := doReq(t, "GET", base+"/v1/sessions", nil, map[string]string{"Authorization": "Bearer key-a"})
	wantOpenAIError(t, resp, b, 404, "not_supported")
}
