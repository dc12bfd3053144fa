package proxy

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

// events records, in order, what a turn did.
type events struct {
	mu sync.Mutex
	ev []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	e.ev = append(e.ev, s)
	e.mu.Unlock()
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.ev...)
}

type fakeFleet struct {
	ev   *events
	mem  *memory.Store
	busy bool
}

func (f *fakeFleet) Acquire(_ context.Context, tenant, session string) (func(), error) {
	if f.busy {
		return nil, errors.New("held by 10.0.0.2:8080")
	}
	f.ev.add("acquire " + session)
	return func() {
		// By now the turn's reply is recorded in memory.
		n := 0
		if v, err := f.mem.Session(tenant, session); err == nil {
			n = len(v.Messages)
		}
		f.ev.add("release " + session + " " + strings.Repeat("m", n))
	}, nil
}

type orderConnector struct {
	fakeConnector
	ev *events
}

func (c *orderConnector) After(ctx context.Context, r *engine.Request, resp *engine.Response) {
	c.ev.add("after")
	c.fakeConnector.After(ctx, r, resp)
}

func (c *orderConnector) Settle(context.Context, *engine.Request) { c.ev.add("settle") }

// A fleet lease covers a session's whole turn: taken before anything is
// recorded, released after the reply is recorded and the engine settled
// the turn's KV, streamed or not. Stateless requests take none.
func TestFleetLeaseCoversTheTurn(t *testing.T) {
	up := newRecordingUpstream(t)
	ev := &events{}
	st := openMemory(t, memory.Options{})
	fl := &fakeFleet{ev: ev, mem: st}
	fc := &orderConnector{ev: ev}
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Engine, o.Memory, o.Fleet = fc, st, fl })
	key := map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k"}

	post(t, base+"/v1/chat/completions", chatBody, key)
	waitFor(t, srv, func() bool { return len(ev.list()) == 4 })
	post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hey"}]}`, key)
	waitFor(t, srv, func() bool { return len(ev.list()) == 8 })
	post(t, base+"/v1/chat/completions", chatBody, nil) // stateless: no lease, no settle
	waitFor(t, srv, func() bool { return len(ev.list()) == 9 })
	// The first turn leaves 2 messages recorded (question, answer), the
	// second 4 (an append of its own question and answer).
	want := "acquire s1, after, settle, release s1 mm, acquire s1, after, settle, release s1 mmmm, after"
	if got := strings.Join(ev.list(), ", "); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
}

// A session whose lease stays with another replica gets a 503 with
// Retry-After, and nothing reaches the upstream.
func TestFleetBusySession(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	fl := &fakeFleet{ev: &events{}, mem: st, busy: true}
	base, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory, o.Fleet = st, fl })
	resp, body := post(t, base+"/v1/chat/completions", chatBody, map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k"})
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), `"session_busy"`) {
		t.Fatalf("busy session: %d %s %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	n := len(up.Bodies())
	if n != 0 {
		t.Fatalf("%d requests reached the upstream", n)
	}
	// Stateless requests are not held up.
	if resp, _ := post(t, base+"/v1/chat/completions", chatBody, nil); resp.StatusCode != 200 {
		t.Fatalf("stateless request: %d", resp.StatusCode)
	}
}
