package llamacpp

import (
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
)

// The predictor's order, step by step: a session due soonest first, the
// once-seen by the mean gap of all, lapsed sessions out.
func TestPredictorOrder(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	at := func(s float64) time.Time { return t0.Add(seconds(s)) }
	p := newPredictor()
	none := func(string) bool { return false }
	keys := func(cs []candidate) string {
		out := ""
		for _, c := range cs {
			out += c.key
		}
		return out
	}
	// Round 1: A, B, C once each; nothing is predictable yet.
	p.arrive("A", at(0))
	p.arrive("B", at(1))
	p.arrive("C", at(2))
	if got := p.next(at(2), 5, none); len(got) != 0 {
		t.Fatalf("predicted %v without any gap known", got)
	}
	if _, expected, _ := p.due("B", at(2)); expected {
		t.Fatal("B expected without any gap known")
	}
	// A comes back after 3 s: A's gap and the mean gap are 3 s; B is due
	// at 4, C at 5, A at 6.
	p.arrive("A", at(3))
	if got := keys(p.next(at(3), 5, none)); got != "BCA" {
		t.Fatalf("order %q, want BCA", got)
	}
	if d, ok, lapsed := p.due("C", at(3)); !ok || lapsed || !d.Equal(at(5)) {
		t.Fatalf("C due %v %v %v", d, ok, lapsed)
	}
	// skip leaves out residents; k bounds the answer.
	if got := keys(p.next(at(3), 1, func(k string) bool { return k == "B" })); got != "C" {
		t.Fatalf("order %q, want C", got)
	}
	// A's own gaps (an exponential mean) decide its due time.
	p.arrive("A", at(5))
	p.arrive("A", at(7))
	if d, _, _ := p.due("A", at(7)); d.Sub(at(7+2.64)).Abs() > time.Microsecond {
		t.Fatalf("A due %v, want %v", d.Sub(t0), 9.64)
	}
	// Twenty seconds later B and C (once-seen, mean gap about 2.6 s) have
	// lapsed: they leave the heaps and come back when they speak.
	if got := keys(p.next(at(25), 5, none)); got != "" {
		t.Fatalf("order %q, want none: everyone lapsed", got)
	}
	if _, _, lapsed := p.due("A", at(25)); !lapsed {
		t.Fatal("A not lapsed")
	}
	p.arrive("C", at(26))
	if got := keys(p.next(at(26), 5, none)); got != "C" {
		t.Fatalf("order %q, want C", got)
	}
	p.remove("C")
	p.remove("nobody")
	if got := p.next(at(26), 5, none); len(got) != 0 || len(p.byKey) != 2 {
		t.Fatalf("after remove: %v, %d known", got, len(p.byKey))
	}
}

// settle lets the connector finish what the idle time between turns
// brings: saves, then preloads, also those its own goroutine started.
func (h *harness) settle() {
	h.t.Helper()
	for {
		h.c.Flush()
		for h.c.preloader.one() {
		}
		busy := false
		h.c.mu.Lock()
		for _, sl := range h.c.sched.slots {
			busy = busy || sl.preload == preloadReserved || sl.preload == preloadRestoring
		}
		h.c.mu.Unlock()
		if !busy && h.c.QueueDepth() == 0 {
			return
		}
		time.Sleep(time.Millisecond) // the saver goroutine's preload is finishing
	}
}

// turnAt runs one turn of session at clock time s (seconds) and lets the
// idle time after it pass.
func (h *harness) turnAt(clk *stepClock, s float64, session string, turn int) (engine.Timings, []byte, int) {
	h.t.Helper()
	clk.ns.Store(int64(s * 1e9))
	mark := h.fake.logLen()
	tm, body := h.send(&engine.Request{Tenant: "t1", SessionID: session, Model: "m", Body: chatBody(session, turn)})
	restores := len(h.fake.logBeforeChat("restore", mark))
	h.settle()
	return tm, body, restores
}

// Three sessions round-robin over one slot: from the second round on, the
// session due next is restored while the engine is idle, so each turn
// finds its KV resident: no restore on the request path, and the whole
// earlier prompt reused.
func TestLlamaCPPPreloadRoundRobin(t *testing.T) {
	clk := &stepClock{}
	h := newHarness(t, 1, func(o *Options) { o.Preload, o.Clock = true, clk })
	sessions := []string{"A", "B", "C"}
	now := 0.0
	onPath := 0
	for round := 1; round <= 4; round++ {
		for _, s := range sessions {
			now++
			tm, _, restores := h.turnAt(clk, now, s, round)
			onPath += restores
			if round >= 3 || round == 2 && s != "A" {
				// Predictable: A's return gave the first gap.
				if restores != 0 || tm.CacheN != int64(promptLen(s, round-1)) {
					t.Fatalf("round %d, %s: %d restores on the request path, cache_n %d, want 0 and %d",
						round, s, restores, tm.CacheN, promptLen(s, round-1))
				}
			}
		}
	}
	st := h.c.Stats()
	// Round 2's A restored on its path; every later turn (8) used a preload.
	if onPath != 1 || st.Restores != 1 || st.PreloadsUsed != 8 || st.PreloadsWasted != 0 || st.PreloadErrors != 0 || st.UnusedRestores != 0 {
		t.Fatalf("restores on the path %d; stats %+v", onPath, st)
	}
	// The last turn's idle time preloaded the next session again.
	if st.Preloads != 9 || st.MeanPreloadMs < 0 {
		t.Fatalf("preloads %d (mean %.2f ms), want 9", st.Preloads, st.MeanPreloadMs)
	}
	if ss, _ := h.c.SessionStats("t1", "B"); ss.Preloads != 3 || ss.Restores != 0 {
		t.Fatalf("B's stats %+v", ss)
	}
	if len(h.warns.warns) != 0 {
		t.Fatalf("warnings %v", h.warns.warns)
	}
}

// A wrong prediction costs what no preload costs: the session that comes
// instead is restored on its path as it would have been, the preloaded
// state counts as wasted, and answers are unchanged.
func TestLlamaCPPPreloadWrongPrediction(t *testing.T) {
	clk := &stepClock{}
	h := newHarness(t, 1, func(o *Options) { o.Preload, o.Clock = true, clk })
	h.turnAt(clk, 1, "A", 1)
	h.turnAt(clk, 2, "B", 1)
	h.turnAt(clk, 3, "A", 2) // gap 2 s: B is due at 4, A at 5; B is preloaded
	if s := h.c.Stats(); s.Preloads != 1 {
		t.Fatalf("preloads %d, want 1", s.Preloads)
	}
	// A again instead of B: its state is restored on its path, B's
	// preload wasted.
	tm, _, restores := h.turnAt(clk, 3.5, "A", 3)
	if restores != 1 || tm.CacheN != int64(promptLen("A", 2)) {
		t.Fatalf("A: %d restores, cache_n %d, want 1 and %d", restores, tm.CacheN, promptLen("A", 2))
	}
	s := h.c.Stats()
	if s.PreloadsWasted != 1 || s.PreloadsUsed != 0 {
		t.Fatalf("stats %+v", s)
	}
	// B still finds its state (from the tiers or preloaded again).
	tm, _, _ = h.turnAt(clk, 4, "B", 2)
	if tm.CacheN != int64(promptLen("B", 1)) {
		t.Fatalf("B: cache_n %d, want %d", tm.CacheN, promptLen("B", 1))
	}
}

// A slot is never taken from an occupant expected sooner than the session
// that would be preloaded, nor while a client request is in flight or
// arriving.
func TestLlamaCPPPreloadKeepsSoonerOccupant(t *testing.T) {
	clk := &stepClock{}
	h := newHarness(t, 1, func(o *Options) { o.Preload, o.Clock = true, clk })
	// B speaks every 10 s, A every second: A, the occupant, is due first.
	h.turnAt(clk, 0, "B", 1)
	h.turnAt(clk, 10, "B", 2)
	h.turnAt(clk, 11, "A", 1)
	h.turnAt(clk, 12, "A", 2)
	before := h.c.Stats().Preloads
	h.turnAt(clk, 13, "A", 3)
	if s := h.c.Stats(); s.Preloads != before {
		t.Fatalf("preloaded over a sooner occupant: %+v", s)
	}
	// Five seconds later A has lapsed: its slot may go to B, but not
	// while a client request is on its way.
	clk.ns.Store(18e9)
	h.c.mu.Lock()
	h.c.arriving++
	_, _, ok := h.c.preloader.planLocked(clk.Now())
	h.c.arriving--
	plan, _, ok2 := h.c.preloader.planLocked(clk.Now())
	h.c.mu.Unlock()
	if ok || !ok2 || plan.key != sessKey("t1", "B") {
		t.Fatalf("plan while a client arrives: %v; after: %v %+v", ok, ok2, plan)
	}
}

// A session arriving while the engine restores its preloaded state waits
// for that restore (cheaper than one of its own) and runs none itself.
func TestLlamaCPPPreloadWaitedFor(t *testing.T) {
	clk := &stepClock{}
	gate := make(chan struct{}, 1)
	h := newHarness(t, 1, func(o *Options) { o.Preload, o.Clock = true, clk })
	h.fake.restoreGate = gate
	h.turnAt(clk, 1, "A", 1)
	h.turnAt(clk, 2, "B", 1)
	// A's return (its restore let through) makes B due first; the
	// connector's goroutine preloads B once A's turn ended, and the
	// engine's restore is held.
	gate <- struct{}{}
	clk.ns.Store(3e9)
	h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 2)})
	waitFor(t, "the preload's restore", func() bool {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		return h.c.sched.slots[0].preload == preloadRestoring
	})
	mark := h.fake.logLen()
	clk.ns.Store(4e9)
	res := make(chan engine.Timings, 1)
	go func() {
		tm, _ := h.send(&engine.Request{Tenant: "t1", SessionID: "B", Model: "m", Body: chatBody("B", 2)})
		res <- tm
	}()
	waitFor(t, "B placed on its preloaded slot", func() bool {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		return h.c.sched.slots[0].inflight == 1
	})
	gate <- struct{}{}
	tm := recv(t, "B's answer", res)
	if got := h.fake.logOf("restore", mark); len(got) != 1 {
		t.Fatalf("restores %v, want the preload's only", got)
	}
	s := h.c.Stats()
	if tm.CacheN != int64(promptLen("B", 1)) || s.PreloadWaits != 1 || s.PreloadsUsed != 1 || s.Restores != 1 {
		// Restores: A's, on its path, in its second turn.
		t.Fatalf("B: cache_n %d (want %d); stats %+v", tm.CacheN, promptLen("B", 1), s)
	}
}

// Off by default: the same round-robin restores on the request path.
func TestLlamaCPPPreloadOff(t *testing.T) {
	clk := &stepClock{}
	h := newHarness(t, 1, func(o *Options) { o.Clock = clk })
	now := 0.0
	for round := 1; round <= 2; round++ {
		for _, s := range []string{"A", "B"} {
			now++
			clk.ns.Store(int64(now * 1e9))
			h.do(s, round)
		}
	}
	if s := h.c.Stats(); s.Preloads != 0 || s.Restores != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// A client that just spoke keeps its slot for the background quiet period
// (it may send its next turn at once); the preload waits for it to end.
func TestLlamaCPPPreloadWaitsForQuiet(t *testing.T) {
	clk := &stepClock{}
	h := newHarness(t, 1, func(o *Options) { o.Preload, o.Clock, o.BackgroundQuiet = true, clk, time.Second })
	h.turnAt(clk, 1, "A", 1)
	h.turnAt(clk, 2, "B", 1)
	h.turnAt(clk, 3, "A", 2) // B is due at 4, A at 5; A ended its turn at 3
	if ok, wait := h.c.preloader.try(); ok || wait != time.Second {
		t.Fatalf("preload within A's quiet period: %v, wait %v", ok, wait)
	}
	clk.ns.Store(4e9)
	h.settle()
	if s := h.c.Stats(); s.Preloads != 1 {
		t.Fatalf("preloads %d after the quiet period, want 1", s.Preloads)
	}
	if tm, _, restores := h.turnAt(clk, 4.2, "B", 2); restores != 0 || tm.CacheN != int64(promptLen("B", 1)) {
		t.Fatalf("B: %d restores on its path, cache_n %d", restores, tm.CacheN)
	}
}

// The rhythm of a session's visits: a follow-up sent at once is part of
// the visit, a slower or faster rhythm replaces the mean.
func TestRhythm(t *testing.T) {
	for _, tc := range []struct {
		name string
		gaps []float64
		want float64
	}{
		{"steady", []float64{10, 10, 10}, 10},
		{"mean", []float64{10, 15}, 11},
		{"follow-ups within visits", []float64{0.1, 10, 0.1, 10, 0.2, 10}, 10},
		{"slower", []float64{10, 50}, 50},
		{"faster after three", []float64{10, 1, 1}, 10},
		{"faster", []float64{10, 1, 1, 1}, 1},
		{"one pause", []float64{10, 100, 10, 10, 10}, 10},
	} {
		var r rhythm
		for _, g := range tc.gaps {
			r.add(g)
		}
		if d := r.gap.v - tc.want; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: %v → %v, want %v", tc.name, tc.gaps, r.gap.v, tc.want)
		}
	}
}

// The gaps within visits are kept apart: a slot's occupant who sends
// follow-ups keeps it for twice that gap.
func TestRhythmBursts(t *testing.T) {
	var r rhythm
	for _, g := range []float64{0.5, 10, 0.7, 10} {
		r.add(g)
	}
	if r.gap.v != 10 || r.burst.n != 2 || r.burst.v < 0.5 || r.burst.v > 0.7 {
		t.Fatalf("rhythm %+v", r)
	}
	var steady rhythm
	steady.add(10)
	steady.add(11)
	if steady.burst.n != 0 {
		t.Fatalf("bursts in a steady rhythm: %+v", steady)
	}
}
