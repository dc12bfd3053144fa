package llamacpp

import (
	"testing"
	"time"
)

// The scheduler's choices, step by step, without a server.
func TestSchedulerPlacement(t *testing.T) {
	s := newScheduler(3)
	ch := chain{hashes: []uint64{1}, bytes: []int64{10}}
	finish := func(p placement, sess string, saved bool) {
		if dirty := s.done(p.slot, sess, sess == "", true, ch, 100, time.Time{}); dirty && saved {
			p.slot.dirty = false // as the saver does
		}
	}
	// Free slots first, in order of last use.
	a := s.place("A", ch)
	b := s.place("B", ch)
	if a.resident || b.resident || a.slot == b.slot {
		t.Fatalf("A %+v B %+v", a, b)
	}
	finish(a, "A", true)  // A: stored
	finish(b, "B", false) // B: unsaved
	if p := s.place("A", ch); !p.resident || p.slot != a.slot {
		t.Fatalf("A's second request: %+v", p)
	} else {
		finish(p, "A", true)
	}
	// C takes the third, free slot; then D must evict: A's slot is stored,
	// B's is not, so A's goes although B's was used earlier.
	c := s.place("C", ch)
	finish(c, "C", false)
	d := s.place("D", ch)
	if d.slot != a.slot || d.prevSess != "A" || d.prevDirty {
		t.Fatalf("D: %+v", d)
	}
	// E: every idle slot holds unsaved KV: the least recently used, B's,
	// with its KV to be saved first.
	finish(d, "D", false)
	e := s.place("E", ch)
	if e.slot != b.slot || !e.prevDirty || e.prevSess != "B" || e.prevChain.last() != 1 {
		t.Fatalf("E: %+v", e)
	}
	// All busy: the least recently used slot, its in-flight KV saved too.
	f := s.place("F", ch)
	g := s.place("G", ch)
	h := s.place("H", ch)
	if f.slot == g.slot || g.slot == h.slot || !h.prevDirty {
		t.Fatalf("F %+v G %+v H %+v", f, g, h)
	}
	// A background call leaves scratch behind: a free slot afterwards.
	for _, p := range []placement{e, f, g, h} {
		s.done(p.slot, p.slot.sess, false, true, ch, 100, time.Time{})
	}
	for _, sl := range s.slots {
		sl.dirty = false
	}
	bg, _, ok := s.placeBackground(ch, time.Time{}, func(*slotInfo) time.Duration { return 0 }, nil)
	if !ok {
		t.Fatal("no slot for a background call while every slot is idle")
	}
	if !s.done(bg.slot, "", true, true, ch, 50, time.Time{}) && bg.slot.holds() {
		t.Fatalf("background call left %+v", bg.slot)
	}
	if next := s.place("I", ch); next.slot != bg.slot || next.prevSess != "" {
		t.Fatalf("I did not take the scratch slot: %+v", next)
	}
}

func TestSchedulerDoneAndForget(t *testing.T) {
	s := newScheduler(2)
	ch := chain{hashes: []uint64{1}, bytes: []int64{10}}
	a := s.place("A", ch)
	b := s.place("B", ch)
	// Both slots busy: C shares the least recently used, A's; A's response
	// then changes nothing there.
	c := s.place("C", ch)
	if c.slot != a.slot || !c.prevDirty || c.prevSess != "A" {
		t.Fatalf("C %+v", c)
	}
	if s.done(a.slot, "A", false, true, ch, 10, time.Time{}) {
		t.Fatal("a response for a slot another session took marked it dirty")
	}
	// A failed request leaves the slot's content unknown, not dirty.
	if s.done(c.slot, "C", false, false, ch, 10, time.Time{}) || c.slot.chain.len() != 0 || c.slot.sess != "C" {
		t.Fatalf("failed request: %+v", c.slot)
	}
	if ids := s.forget("C"); len(ids) != 1 || c.slot.sess != "" {
		t.Fatalf("forget: %v %+v", ids, c.slot)
	}
	if !s.done(b.slot, "B", false, true, ch, 10, time.Time{}) || s.pending() != 1 || s.saveCandidate() != b.slot {
		t.Fatalf("pending %d", s.pending())
	}
	b.slot.inflight++
	if s.saveCandidate() != nil {
		t.Fatal("a busy slot is a save candidate")
	}
	b.slot.inflight--
	s.reset()
	if s.pending() != 0 || s.saveCandidate() != nil {
		t.Fatal("reset kept unsaved KV")
	}
}

// Background calls take only idle, quiet slots; a client takes a slot
// from background calls before it queues behind another client.
func TestSchedulerBackground(t *testing.T) {
	s := newScheduler(2)
	ch := chain{hashes: []uint64{1}, bytes: []int64{10}}
	t0 := time.Unix(1000, 0)
	quiet := time.Second
	a := s.place("A", ch)
	s.done(a.slot, "A", false, true, ch, 10, t0)
	a.slot.dirty = false // saved
	// The other slot was never used by a client: free and quiet.
	bg, _, ok := s.placeBackground(ch, t0, func(*slotInfo) time.Duration { return quiet }, nil)
	if !ok || bg.slot == a.slot || bg.preempt {
		t.Fatalf("background call: %+v, %v", bg, ok)
	}
	// A's slot is idle but a client used it 400 ms ago: a second call waits
	// 600 ms for quiet; none waits forever for a slot in flight.
	if _, wait, ok := s.placeBackground(ch, t0.Add(400*time.Millisecond), func(*slotInfo) time.Duration { return quiet }, nil); ok || wait != 600*time.Millisecond {
		t.Fatalf("second background call: %v, wait %v", ok, wait)
	}
	b := s.place("B", ch) // takes A's clean, idle slot
	if b.slot != a.slot || b.preempt {
		t.Fatalf("B: %+v", b)
	}
	if _, wait, ok := s.placeBackground(ch, t0.Add(time.Hour), func(*slotInfo) time.Duration { return quiet }, nil); ok || wait != 0 {
		t.Fatalf("background call with every slot in flight: %v, wait %v", ok, wait)
	}
	// C: both slots busy, one with a background call only: C takes it.
	c := s.place("C", ch)
	if c.slot != bg.slot || !c.preempt || c.prevDirty {
		t.Fatalf("C: %+v", c)
	}
	// The background call ends on a slot C holds: C's KV is untouched.
	if s.done(bg.slot, "", true, false, ch, 0, t0) || bg.slot.sess != "C" || bg.slot.bg != 0 || bg.slot.inflight != 1 {
		t.Fatalf("slot after the preempted call: %+v", bg.slot)
	}
	// D: both slots serve clients: the least recently used, no preemption.
	if d := s.place("D", ch); d.preempt {
		t.Fatalf("D: %+v", d)
	}
}

// Slots a preload is filling are taken last; a preloaded state dropped by
// another session's placement, a forget or a restart counts as wasted.
func TestSchedulerPreloadStates(t *testing.T) {
	s := newScheduler(2)
	ch := chain{hashes: []uint64{1}, bytes: []int64{10}}
	a := s.place("A", ch)
	s.done(a.slot, "A", false, true, ch, 100, time.Time{})
	a.slot.dirty = false
	a.slot.preload = preloadReserved
	// B: the free slot, not the reserved one, though that is older.
	if b := s.place("B", ch); b.slot == a.slot {
		t.Fatal("B took the slot being preloaded")
	} else {
		s.done(b.slot, "B", false, true, ch, 100, time.Time{})
		b.slot.dirty = false
	}
	// C: B's slot is idle and clean: it goes before the reserved one.
	c := s.place("C", ch)
	if c.slot == a.slot {
		t.Fatal("C took the slot being preloaded over an idle one")
	}
	// D: every other slot is busy: the reserved slot, last resort; the
	// reservation ends (the preload sees the version change).
	ver := a.slot.version
	d := s.place("D", ch)
	if d.slot != a.slot || a.slot.preload != preloadNone || a.slot.version == ver || s.wasted != 0 {
		t.Fatalf("D: %+v, wasted %d", d, s.wasted)
	}
	// A loaded preload dropped: wasted, once each way.
	d.slot.preload = preloadLoaded
	s.done(d.slot, "D", false, true, ch, 100, time.Time{})
	s.place("E", ch) // D's slot, the only idle one: its preloaded state is dropped
	s.forget("E")
	for _, sl := range s.slots {
		sl.preload = preloadLoaded
	}
	s.reset()
	if s.wasted != 1+2 {
		t.Fatalf("wasted %d, want 3", s.wasted)
	}
}
