package proxy

import (
	"fmt"
	"slices"
	"sync"
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

// recordingWindows is a Windows that records what it is told.
type recordingWindows struct {
	mu  sync.Mutex
	log []string
}

func (w *recordingWindows) Window(tenant, session string, _ time.Time, turn *memory.Turn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("window %s %s %d", tenant, session, turn.Stats.WindowMessages))
}

func (w *recordingWindows) Forget(tenant, session string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, "forget "+tenant+" "+session)
}

// TestWindowsToldOfWindowsAndDeletes: Options.Windows (the console's last
// windows, package admin) hears of each window the chat path builds for a
// session, under the caller's tenant, and of the session's delete.
func TestWindowsToldOfWindowsAndDeletes(t *testing.T) {
	st := openMemory(t, memory.Options{})
	up := newRecordingUpstream(t)
	w := &recordingWindows{}
	base, s := startSidecar(t, up.URL, func(o *Options) { o.Memory = st; o.Windows = w })
	hdr := map[string]string{"Authorization": "Bearer key-a", "X-Session-ID": "s1"}
	if resp, b := post(t, base+"/v1/chat/completions", chatBody, hdr); resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	s.waitIdle()
	resp, b := doReq(t, "DELETE", base+"/v1/sessions/s1", nil, map[string]string{"Authorization": "Bearer key-a"})
	if resp.StatusCode != 200 {
		t.Fatalf("delete: %d %s", resp.StatusCode, b)
	}
	told := func() []string {
		w.mu.Lock()
		defer w.mu.Unlock()
		return slices.Clone(w.log)
	}
	ta := tenantOf([]byte("Bearer key-a"))
	if want := []string{"window " + ta + " s1 1", "forget " + ta + " s1"}; !slices.Equal(told(), want) {
		t.Fatalf("told %q, want %q", told(), want)
	}
	// A stateless request builds no window.
	if resp, _ := post(t, base+"/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer key-a"}); resp.StatusCode != 200 {
		t.Fatal("stateless chat failed")
	}
	s.waitIdle()
	if got := told(); len(got) != 2 {
		t.Fatalf("a stateless request was told: %q", got)
	}
}
