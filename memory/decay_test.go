package memory

import (
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"
)

const day = 24 * time.Hour

func unitByID(t *testing.T, s *Store, id string) (Unit, bool) {
	t.Helper()
	mem, err := s.Memory("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range mem.Units {
		if u.ID == id {
			return u, true
		}
	}
	return Unit{}, false
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// newMemorySession creates session "s" with a fact, an episode and a core
// memory of importance 1.
func newMemorySession(t *testing.T, s *Store) (fact, episode, core string) {
	t.Helper()
	prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
	add := func(c Category, txt string) string {
		u, err := s.AddMemory("t", "s", c, txt, 1)
		if err != nil {
			t.Fatal(err)
		}
		return u.ID
	}
	return add(CategoryFact, "The user lives in Lisbon."), add(CategoryEpisode, "They planned a trip."),
		add(CategoryCore, "The user is called Ada.")
}

// TestDecayByCategory: facts lose 15% per 5 untouched days, episodes 40%
// per 3 days and go after 7; system and core never decay.
func TestDecayByCategory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openBubbleStore(t, t.TempDir(), nil)
		fact, ep, core := newMemorySession(t, s)
		poke := func() { // a turn that recalls nothing
			prepare(t, s, "t", "s", ModeAppend, text("user", "zzz")).Complete(text("assistant", "ok"))
		}
		time.Sleep(6 * day)
		poke()
		f, _ := unitByID(t, s, fact)
		e, _ := unitByID(t, s, ep)
		c, _ := unitByID(t, s, core)
		if !near(f.Importance, 0.85) || !near(e.Importance, 0.36) || c.Importance != 1 {
			t.Fatalf("after 6 days: fact %v (want 0.85), episode %v (want 0.36), core %v (want 1)", f.Importance, e.Importance, c.Importance)
		}
		if e.Review != "decay" || f.Review != "" {
			t.Fatalf("reviews: episode %q, fact %q", e.Review, f.Review)
		}
		time.Sleep(2 * day)
		poke()
		if _, ok := unitByID(t, s, ep); ok {
			t.Fatal("episode untouched for 8 days not deleted")
		}
		if s.Stats().Expired != 1 {
			t.Fatalf("Expired %d", s.Stats().Expired)
		}
		// Fact: 5 periods after creation is 0.85^5 ≈ 0.44 → decay review;
		// 10 periods: 0.197 < 0.2 → expire review.
		time.Sleep(17 * day) // day 25
		poke()
		f, _ = unitByID(t, s, fact)
		if !near(f.Importance, math.Pow(0.85, 5)) || f.Review != "decay" {
			t.Fatalf("day 25: fact %v %q", f.Importance, f.Review)
		}
		time.Sleep(25 * day)
		poke()
		f, _ = unitByID(t, s, fact)
		if !near(f.Importance, math.Pow(0.85, 10)) || f.Review != "expire" {
			t.Fatalf("day 50: fact %v %q", f.Importance, f.Review)
		}
		if c, _ := unitByID(t, s, core); c.Importance != 1 {
			t.Fatalf("core decayed to %v", c.Importance)
		}
	})
}

// TestDecayCatchesUpOnRestart: a store reopened more than a day after the
// last decay pass applies every period missed; one reopened within the day
// waits for the next pass. The result survives another restart.
func TestDecayCatchesUpOnRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		s := openBubbleStore(t, dir, nil)
		fact, ep, _ := newMemorySession(t, s)
		time.Sleep(4*day + 20*time.Hour)
		prepare(t, s, "t", "s", ModeAppend, text("user", "zzz")).Complete(text("assistant", "ok")) // decay pass at 4d20h
		s.Close()

		time.Sleep(6 * time.Hour) // 5d2h: a period boundary passed, the last pass is 6h old
		s = openBubbleStore(t, dir, nil)
		if f, _ := unitByID(t, s, fact); f.Importance != 1 {
			t.Fatalf("decayed %v less than a day after the last pass", f.Importance)
		}
		s.Close()

		time.Sleep(6 * day) // 11d2h: two fact periods
		s = openBubbleStore(t, dir, nil)
		f, _ := unitByID(t, s, fact)
		if !near(f.Importance, 0.85*0.85) {
			t.Fatalf("after restart: fact %v, want %v", f.Importance, 0.85*0.85)
		}
		if _, ok := unitByID(t, s, ep); ok {
			t.Fatal("expired episode survived the restart")
		}
		s.Close()
		s = openBubbleStore(t, dir, nil)
		if f, _ := unitByID(t, s, fact); !near(f.Importance, 0.85*0.85) {
			t.Fatalf("after second restart: fact %v", f.Importance)
		}
	})
}

// TestBoostLimits: one boost per 2 h, at most +1.0 per 24 h, and a review
// flag at importance 2.5.
func TestBoostLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openBubbleStore(t, t.TempDir(), nil)
		fact, _, _ := newMemorySession(t, s)
		boost := func(want float64, wantErr bool) {
			t.Helper()
			imp, err := s.Boost("t", "s", fact)
			if wantErr != errors.Is(err, ErrBoostLimited) || (err == nil && !near(imp, want)) {
				t.Fatalf("boost: %v, %v; want %v, limited %v", imp, err, want, wantErr)
			}
		}
		boost(1.5, false)
		time.Sleep(time.Hour)
		boost(0, true) // cooldown
		time.Sleep(time.Hour)
		boost(2.0, false)
		time.Sleep(2 * time.Hour)
		boost(0, true) // +1.0 reached for this day
		time.Sleep(20 * time.Hour)
		boost(2.5, false) // a new 24 h window
		if u, _ := unitByID(t, s, fact); u.Review != "promote" {
			t.Fatalf("review %q at 2.5, want promote", u.Review)
		}
		if st := s.Stats(); st.Boosts != 3 || st.BoostsLimited != 2 {
			t.Fatalf("boosts %d, limited %d", st.Boosts, st.BoostsLimited)
		}
		if _, err := s.Boost("t", "s", "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown id: %v", err)
		}
	})
}
