package llamacpp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
)

// bgBody is the body of one of the sidecar's own calls.
func bgBody(i int) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"extract facts ` + strconv.Itoa(i) + `"}]}`)
}

// bgCall is a background call in flight, as cmd/sidecar/internal/llm makes one: its
// context's cancel is on the request, Before places it, the body is
// posted under that context, After hears the outcome.
type bgCall struct {
	req    *engine.Request
	ctx    context.Context
	placed chan error // Before's error (nil: placed), once
	done   chan error // the post's error, once After ran
}

// startBackground runs a background call in a goroutine; ctx bounds it.
func (h *harness) startBackground(ctx context.Context, i int) *bgCall {
	h.t.Helper()
	ctx, cancel := context.WithCancelCause(ctx)
	b := &bgCall{req: &engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Background: true, Body: bgBody(i), Cancel: cancel},
		ctx: ctx, placed: make(chan error, 1), done: make(chan error, 1)}
	go func() {
		defer cancel(nil)
		body, err := h.c.Before(ctx, b.req)
		b.placed <- err
		if err != nil {
			h.c.After(context.WithoutCancel(ctx), b.req, &engine.Response{})
			b.done <- err
			return
		}
		hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", bytes.NewReader(body))
		res, err := http.DefaultClient.Do(hr)
		resp := &engine.Response{}
		if err == nil {
			out, _ := io.ReadAll(res.Body)
			res.Body.Close()
			resp.Status, resp.Body = res.StatusCode, out
		}
		h.c.After(context.WithoutCancel(ctx), b.req, resp)
		b.done <- err
	}()
	return b
}

// waitFor polls cond until it holds; a guard against a hang, not a timing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after 10 s", what)
		}
	}
}

func (h *harness) bgWaiting() int {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.c.bgWaiting
}

// recv returns what ch delivers, failing the test if nothing comes
// within 10 s (a hang guard).
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s after 10 s", what)
		panic("unreachable")
	}
}

// Issue 20: with one slot, a client request that arrives while a
// background call generates there takes the slot at once: the call's
// context is cancelled (the server sees its client go away), the client's
// request is answered, and the counters say so.
func TestLlamaCPPClientPreemptsBackgroundCall(t *testing.T) {
	h := newHarness(t, 1, func(o *Options) { o.BackgroundQuiet = time.Millisecond })
	h.fake.hold = func(prompt string) bool { return strings.HasPrefix(prompt, "extract facts") }
	h.do("A", 1)
	bg := h.startBackground(context.Background(), 0)
	if err := recv(t, "placement of the background call", bg.placed); err != nil {
		t.Fatalf("background call not placed: %v", err)
	}
	if slot := recv(t, "background generation", h.fake.held); slot != 0 {
		t.Fatalf("background call on slot %d", slot)
	}
	mark := h.fake.logLen()
	// The client's turn: the fake serves one request per slot at a time,
	// so it is answered only once the background call let go.
	res := make(chan engine.Timings, 1)
	go func() {
		tm, _ := h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 2)})
		res <- tm
	}()
	tm := recv(t, "the client's answer", res)
	if err := recv(t, "the background call's end", bg.done); err == nil || !errors.Is(context.Cause(bg.ctx), engine.ErrPreempted) {
		t.Fatalf("background call ended with %v (cause %v), want cancelled by engine.ErrPreempted", err, context.Cause(bg.ctx))
	}
	if got := h.fake.logOf("cancelled", mark); len(got) != 1 {
		t.Fatalf("the server saw %v of the background call", got)
	}
	// The client got its session's KV back (restored after the call left).
	if tm.CacheN != int64(promptLen("A", 1)) {
		t.Fatalf("client reused %d tokens, want %d", tm.CacheN, promptLen("A", 1))
	}
	if s := h.c.Stats(); s.BackgroundCancelled != 1 || s.ClientWaits != 1 || s.BackgroundCalls != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Clients pause longer than the quiet period: it doubled.
	if q := h.quiet(); q != 2*time.Millisecond {
		t.Fatalf("quiet period %v after a preemption, want 2ms", q)
	}
	// The next background call (the caller's retry) gets the slot; once it
	// completes the quiet period halves back.
	h.fake.hold = nil
	h.c.Flush()
	tm2, _ := h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Background: true, Body: bgBody(1)})
	if tm2.PredictedN != 1 {
		t.Fatalf("retried background call: %+v", tm2)
	}
	if q := h.quiet(); q != time.Millisecond {
		t.Fatalf("quiet period %v after a background call completed, want 1ms", q)
	}
}

func (h *harness) quiet() time.Duration {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.c.quiet
}

// With one slot, a background call does not start while a client request
// is in flight there: it waits for the client's After, then takes the
// slot; no client waited on it.
func TestLlamaCPPBackgroundWaitsForClient(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1)
	ctx := context.Background()
	req := &engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 2)}
	body, err := h.c.Before(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	bg := h.startBackground(ctx, 0)
	waitFor(t, "the background call to wait", func() bool { return h.bgWaiting() == 1 })
	select {
	case err := <-bg.placed:
		t.Fatalf("background call placed (%v) while a client was in flight on the only slot", err)
	default:
	}
	res, err := http.Post(h.srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(res.Body)
	res.Body.Close()
	h.c.After(ctx, req, &engine.Response{Status: res.StatusCode, Body: out})
	if err := recv(t, "placement of the background call", bg.placed); err != nil {
		t.Fatalf("background call after the client: %v", err)
	}
	if err := recv(t, "the background call's end", bg.done); err != nil {
		t.Fatal(err)
	}
	if s := h.c.Stats(); s.ClientWaits != 0 || s.BackgroundCancelled != 0 || s.BackgroundCalls != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A background call that cannot get a slot before its context ends is
// not placed (engine.ErrBusy, nothing sent) and gives its token back, so the next
// one is placed once the slot is free.
func TestLlamaCPPBackgroundBusyUntilDeadline(t *testing.T) {
	h := newHarness(t, 1, nil)
	ctx := context.Background()
	req := &engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 1)}
	if _, err := h.c.Before(ctx, req); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	bg := h.startBackground(wctx, 0)
	waitFor(t, "the background call to wait", func() bool { return h.bgWaiting() == 1 })
	cancel()
	if err := recv(t, "the background call's end", bg.placed); !errors.Is(err, engine.ErrBusy) {
		t.Fatalf("background call without a slot: %v, want engine.ErrBusy", err)
	}
	recv(t, "the background call's After", bg.done)
	h.c.After(ctx, req, &engine.Response{Status: 502})
	if chats := h.fake.logOf("chat", 0); len(chats) != 0 {
		t.Fatalf("the server saw %v", chats)
	}
	tm, _ := h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Background: true, Body: bgBody(1)})
	if tm.PredictedN != 1 {
		t.Fatalf("next background call: %+v", tm)
	}
	if s := h.c.Stats(); s.BackgroundCalls != 1 || s.ClientWaits != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A background call starts only on a slot no client used for
// BackgroundQuiet (a client sending turns back to back never meets one),
// and then at once.
func TestLlamaCPPBackgroundWaitsForQuiet(t *testing.T) {
	clk := newManualClock()
	h := newHarness(t, 1, func(o *Options) { o.Clock, o.BackgroundQuiet = clk, time.Minute })
	h.do("A", 1)
	bg := h.startBackground(context.Background(), 0)
	waitFor(t, "the background call to wait for quiet", func() bool { return h.bgWaiting() == 1 && clk.timers() == 1 })
	clk.advance(59 * time.Second)
	select {
	case err := <-bg.placed:
		t.Fatalf("background call placed (%v) 59 s after a client", err)
	default:
	}
	clk.advance(time.Second)
	if err := recv(t, "placement of the background call", bg.placed); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, "the background call's end", bg.done); err != nil {
		t.Fatal(err)
	}
}

// With several slots, a background call takes an idle slot at once while
// clients use the others; a client arriving while every slot is busy takes
// the one running background work rather than queue behind a client.
func TestLlamaCPPBackgroundAmongSeveralSlots(t *testing.T) {
	h := newHarness(t, 2, nil)
	h.fake.hold = func(prompt string) bool { return strings.HasPrefix(prompt, "extract facts") }
	ctx := context.Background()
	a := &engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 1)}
	ab, err := h.c.Before(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	bg := h.startBackground(ctx, 0)
	if err := recv(t, "placement of the background call", bg.placed); err != nil {
		t.Fatal(err)
	}
	if slot := recv(t, "background generation", h.fake.held); slot == slotOf(t, ab) {
		t.Fatalf("background call shares slot %d with a client in flight", slot)
	}
	// B arrives: A's slot is in flight, the other runs the background call.
	_, bb := h.send(&engine.Request{Tenant: "t1", SessionID: "B", Model: "m", Body: chatBody("B", 1)})
	if slotOf(t, bb) == slotOf(t, ab) {
		t.Fatal("B queued behind A instead of taking the background call's slot")
	}
	if err := recv(t, "the background call's end", bg.done); !errors.Is(context.Cause(bg.ctx), engine.ErrPreempted) {
		t.Fatalf("background call: %v", err)
	}
	h.c.After(ctx, a, &engine.Response{Status: 502})
	if s := h.c.Stats(); s.BackgroundCancelled != 1 || s.ClientWaits != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// manualClock is a clock.Clock whose timers fire only when advanced.
type manualClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []manualTimer
}

type manualTimer struct {
	at time.Time
	ch chan time.Time
}

func newManualClock() *manualClock { return &manualClock{now: time.Unix(1e9, 0)} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, manualTimer{c.now.Add(d), ch})
	return ch
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
			continue
		}
		kept = append(kept, w)
	}
	c.waiters = kept
}

// timers counts the timers not yet fired.
func (c *manualClock) timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}
