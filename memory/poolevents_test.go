package memory

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func poolPut(t *testing.T, s *Store, tenant, key, val string) PoolEntry {
	t.Helper()
	e, err := s.PoolPut(tenant, key, PoolWrite{Value: json.RawMessage(val)})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// stableText is the content of a turn's stable block ("" for none).
func stableText(t *testing.T, turn *Turn) string {
	t.Helper()
	if turn.Stable == nil {
		return ""
	}
	var m struct{ Content string }
	if err := json.Unmarshal(turn.Stable, &m); err != nil {
		t.Fatal(err)
	}
	return m.Content
}

// TestPoolInStableBlock: a request naming a pool prefix gets the tenant's
// entries under it in its stable block, newest first, as [SHARED:key]
// lines within the budget; the block stays byte for byte the same until
// the pool under the prefix changes (a write elsewhere in the pool moves
// nothing), and nothing of the pool reaches a request without the opt-in
// or another tenant.
func TestPoolInStableBlock(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Pool.ContextTokens = 60 })
	poolPut(t, s, "t", "team/goal", `"Ship the release by Friday."`)
	poolPut(t, s, "t", "team/owner", `{"name":"Ada","role":"lead"}`)
	poolPut(t, s, "t", "other/x", `"not for this prefix"`)
	poolPut(t, s, "u", "team/goal", `"another tenant's goal"`)
	n := 0
	turn := func(prefix string) *Turn {
		t.Helper()
		n++
		tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "test-model",
			Messages: []Message{text("user", "turn "+strings.Repeat("x", n))}, PoolPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Complete(text("assistant", "ok")); err != nil {
			t.Fatal(err)
		}
		return tr
	}
	t1 := turn("team/")
	want := "## Shared pool (newest first)\n[SHARED:team/owner] {\"name\":\"Ada\",\"role\":\"lead\"}\n[SHARED:team/goal] Ship the release by Friday.\n"
	if got := stableText(t, t1); !strings.HasSuffix(got, want) || t1.Stats.Pooled != 2 {
		t.Fatalf("stable block %q (pooled %d), want it to end with %q", got, t1.Stats.Pooled, want)
	}
	if t1.Messages[0] == nil || string(t1.Messages[0]) != string(t1.Stable) {
		t.Fatalf("the stable block is not the window's first message: %s", t1.Messages[0])
	}

	// No pool change: the same bytes, and the previous prompt is a prefix.
	t2 := turn("team/")
	if string(t2.Stable) != string(t1.Stable) || t2.Stats.Prefix.Tokens == 0 {
		t.Fatalf("stable block moved without a pool change:\n%s\n%s", t1.Stable, t2.Stable)
	}
	for i := range t1.Messages {
		if string(t1.Messages[i]) != string(t2.Messages[i]) {
			t.Fatalf("message %d moved without a pool change", i)
		}
	}
	// A write outside the prefix moves nothing.
	poolPut(t, s, "t", "other/y", `"still not"`)
	if t3 := turn("team/"); string(t3.Stable) != string(t1.Stable) {
		t.Fatalf("a write outside the prefix moved the block: %s", t3.Stable)
	}
	// A write under it does: the new entry comes first, and the budget
	// (60 tokens) drops the oldest.
	poolPut(t, s, "t", "team/status", `"Blocked on review, see PR 42 for the details of the remaining work."`)
	t4 := turn("team/")
	got := stableText(t, t4)
	if !strings.Contains(got, "[SHARED:team/status] Blocked on review") || strings.Index(got, "team/status") > strings.Index(got, "team/owner") ||
		strings.Contains(got, "team/goal") || t4.Stats.Pooled != 2 {
		t.Fatalf("after a write under the prefix: %q (pooled %d)", got, t4.Stats.Pooled)
	}
	if err := s.PoolDelete("t", "team/status", 0); err != nil {
		t.Fatal(err)
	}
	if t5 := turn("team/"); string(t5.Stable) != string(t1.Stable) {
		t.Fatalf("after deleting the new entry the block should be back to the first: %s", t5.Stable)
	}
	// The whole pool, newest first.
	if got := stableText(t, turn(PoolPrefixAll)); !strings.Contains(got, "[SHARED:other/y] still not\n[SHARED:other/x]") || strings.Contains(got, "another tenant") {
		t.Fatalf("whole pool: %q", got)
	}
	// No opt-in, no pool.
	t7 := turn("")
	if strings.Contains(stableText(t, t7), "SHARED") || t7.Stats.Pooled != 0 {
		t.Fatalf("pool without opt-in: %s", t7.Stable)
	}
	if _, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "m",
		Messages: []Message{text("user", "x")}, PoolPrefix: "bad\x00prefix"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad prefix: %v", err)
	}
	if st := s.Stats(); st.PoolContextTurns != 6 || st.PoolContextErrors != 0 {
		t.Fatalf("stats %+v", st.PoolEventStats)
	}
}

// TestPoolInStableBlockOff: a negative budget never shows the pool.
func TestPoolInStableBlockOff(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Pool.ContextTokens = -1 })
	poolPut(t, s, "t", "k", `"v"`)
	tr := prepare(t, s, "t", "s", ModeAppend, text("user", "hi"))
	tr2, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s2", Mode: ModeAppend, Model: "m",
		Messages: []Message{text("user", "hi")}, PoolPrefix: "k"})
	if err != nil || tr.Stable != nil || tr2.Stable != nil {
		t.Fatalf("%v %s %s", err, tr.Stable, tr2.Stable)
	}
}

func nextEvent(t *testing.T, sub *PoolSubscription) PoolEvent {
	t.Helper()
	select {
	case ev, ok := <-sub.C:
		if !ok {
			t.Fatal("subscription ended")
		}
		return ev
	default:
		t.Fatal("no event ready") // events are delivered before the write returns
	}
	return PoolEvent{}
}

// TestPoolEvents: writes and deletes under the prefix reach the subscriber
// in order, once written; others do not; a reconnecting subscriber is
// replayed what it missed, or told of a gap; one that falls behind is
// ended as lagged; subscribers are bounded; Close ends them.
func TestPoolEvents(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Pool.EventBuffer, o.Pool.EventHistory, o.Pool.MaxTenantSubscribers = 3, 4, 3
	})
	sub, err := s.PoolSubscribe("t", "team/", 0)
	if err != nil || sub.Rev != 0 || sub.Gap || len(sub.Replay) != 0 {
		t.Fatalf("subscribe: %+v %v", sub, err)
	}
	other, _ := s.PoolSubscribe("u", "", 0)
	a := poolPut(t, s, "t", "team/a", `{"x":1}`)
	poolPut(t, s, "t", "other/b", `2`)
	if err := s.PoolDelete("t", "team/a", 0); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, sub); ev.Type != PoolEventPut || ev.Key != "team/a" || ev.Version != a.Version || ev.Entry == nil || string(ev.Entry.Value) != `{"x":1}` {
		t.Fatalf("put event %+v", ev)
	}
	if ev := nextEvent(t, sub); ev.Type != PoolEventDelete || ev.Key != "team/a" || ev.Version != 3 || ev.Entry != nil {
		t.Fatalf("delete event %+v", ev)
	}
	select {
	case ev := <-sub.C:
		t.Fatalf("unexpected event %+v", ev)
	case ev := <-other.C:
		t.Fatalf("another tenant's subscriber got %+v", ev)
	default:
	}

	// Reconnecting after version 2: the delete (3) is replayed; the put
	// of team/c (4) with its current entry; team/d's first put (5) is
	// overwritten by 6, which is replayed alone.
	poolPut(t, s, "t", "team/c", `"c"`)
	poolPut(t, s, "t", "team/d", `"d1"`)
	poolPut(t, s, "t", "team/d", `"d2"`)
	re, err := s.PoolSubscribe("t", "team/", 2)
	if err != nil || re.Gap || re.Rev != 6 || len(re.Replay) != 3 {
		t.Fatalf("replay: %+v %v", re, err)
	}
	if r := re.Replay; r[0].Type != PoolEventDelete || r[0].Version != 3 || r[1].Key != "team/c" || r[1].Version != 4 ||
		r[2].Version != 6 || string(r[2].Entry.Value) != `"d2"` {
		t.Fatalf("replayed %+v", r)
	}
	re.Close()
	// Four events are remembered (3 to 6): after version 1, event 2 is
	// forgotten.
	if g, err := s.PoolSubscribe("t", "", 1); err != nil || !g.Gap || len(g.Replay) != 0 {
		t.Fatalf("gap: %+v %v", g, err)
	} else {
		g.Close()
	}

	// The first subscriber read two events, then missed three writes:
	// its buffer of three is full at the fourth and it is ended.
	poolPut(t, s, "t", "team/e", `"e"`)
	for range 3 {
		if _, ok := <-sub.C; !ok {
			t.Fatal("ended too early")
		}
	}
	if _, ok := <-sub.C; ok || !sub.Lagged() {
		t.Fatalf("a subscriber that fell behind is not ended as lagged (lagged %v)", sub.Lagged())
	}

	// Bounds: three per tenant.
	var subs []*PoolSubscription
	for range 3 {
		x, err := s.PoolSubscribe("t", "", 0)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, x)
	}
	if _, err := s.PoolSubscribe("t", "", 0); !errors.Is(err, ErrTooManySubscribers) {
		t.Fatalf("a fourth subscriber: %v", err)
	}
	subs[0].Close()
	subs[0].Close()
	if x, err := s.PoolSubscribe("t", "", 0); err != nil {
		t.Fatalf("after one left: %v", err)
	} else {
		subs[0] = x
	}
	if _, err := s.PoolSubscribe("t", "bad\x00", 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad prefix: %v", err)
	}
	st := s.Stats()
	if st.PoolSubscribers != 4 || st.PoolSubscribersLagged != 1 || st.PoolSubscribeRefused != 1 || st.PoolEventsPublished < 5 {
		t.Fatalf("stats %+v", st.PoolEventStats)
	}
	s.Close()
	for _, x := range append(subs, other) {
		if _, ok := <-x.C; ok || x.Lagged() {
			t.Fatal("Close did not end a subscriber cleanly")
		}
	}
	if st := s.Stats(); st.PoolSubscribers != 0 {
		t.Fatalf("%d subscribers after Close", st.PoolSubscribers)
	}
}

// TestPoolEventsAcrossAFleet: a write on one replica reaches a subscriber
// of another once that replica brings the pool up to date (any pool call,
// or a turn that shows the pool); the view in the stable block follows.
func TestPoolEventsAcrossAFleet(t *testing.T) {
	sh := newMemLog()
	with := func(o *Options) { o.SharedLog = sh }
	a, b := openStore(t, t.TempDir(), with), openStore(t, t.TempDir(), with)
	poolPut(t, a, "t", "team/x", `"first"`)
	sub, err := b.PoolSubscribe("t", "team/", 0)
	if err != nil || sub.Rev != 1 {
		t.Fatalf("subscribe on b: %+v %v", sub, err)
	}
	e := poolPut(t, a, "t", "team/y", `"from a"`)
	if _, err := b.PoolList("t", "", 0); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, sub); ev.Type != PoolEventPut || ev.Key != "team/y" || ev.Version != e.Version || string(ev.Entry.Value) != `"from a"` {
		t.Fatalf("b's subscriber got %+v", ev)
	}
	if err := a.PoolDelete("t", "team/x", 0); err != nil {
		t.Fatal(err)
	}
	tr, err := b.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "m",
		Messages: []Message{text("user", "hi")}, PoolPrefix: "team/"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, sub); ev.Type != PoolEventDelete || ev.Key != "team/x" {
		t.Fatalf("b's subscriber got %+v", ev)
	}
	if got := stableText(t, tr); !strings.Contains(got, "[SHARED:team/y] from a") || strings.Contains(got, "team/x") {
		t.Fatalf("b's stable block %q", got)
	}
	sub.Close()
}
