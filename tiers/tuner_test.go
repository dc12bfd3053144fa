package tiers

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func tunerOpts(t *testing.T) TunerOptions {
	t.Helper()
	o := TunerOptions{Logger: slog.New(slog.DiscardHandler)}
	if err := o.EnsureDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	return o
}

// The rule book, case by case: which knob moves, which way, within bounds.
func TestTunerDecide(t *testing.T) {
	o := tunerOpts(t)
	ms := time.Millisecond
	cur := Tuning{Balance: -1, PromoteThreshold: 2, ArchiveLevel: 1}
	for _, tc := range []struct {
		name string
		obs  Observation
		cur  Tuning
		want string // "knob from→to" lines, sorted as Decide returns them
	}{
		{"quiet", Observation{Lookups: 1000, Hits: 900, FocusFill: 0.5, ArchiveFill: 0.6}, cur, ""},
		{"slow promotions, room in Focus", Observation{PromotionP95: 250 * ms, FocusFill: 0.4}, cur, "promote_threshold 2→1.6"},
		{"slow promotions, Focus full", Observation{PromotionP95: 250 * ms, FocusFill: 0.96}, cur, ""},
		{"promotion at its floor", Observation{PromotionP95: 250 * ms}, Tuning{Balance: -1, PromoteThreshold: 1, ArchiveLevel: 1}, ""},
		{"Focus churns", Observation{FocusFill: 0.97, FocusDemotions: 12}, cur, "promote_threshold 2→2.5"},
		{"Focus full, no churn", Observation{FocusFill: 0.97}, cur, ""},
		{"promotion at its ceiling", Observation{FocusFill: 0.97, FocusDemotions: 3}, Tuning{Balance: -1, PromoteThreshold: 8, ArchiveLevel: 1}, ""},
		{"archive nearly full, fast moves", Observation{ArchiveFill: 0.95, DemotionP95: 20 * ms}, cur, "archive_level 1→2"},
		{"archive nearly full, slow moves", Observation{ArchiveFill: 0.95, DemotionP95: 150 * ms}, cur, ""},
		{"archive deleting blocks", Observation{ArchiveFill: 0.8, ArchiveEvictions: 3}, cur, "archive_level 1→2"},
		{"moves over budget", Observation{ArchiveFill: 0.95, DemotionP95: 300 * ms}, Tuning{Balance: -1, PromoteThreshold: 2, ArchiveLevel: 3}, "archive_level 3→2"},
		{"level at its ceiling", Observation{ArchiveFill: 0.99}, Tuning{Balance: -1, PromoteThreshold: 2, ArchiveLevel: 4}, ""},
		{"archive has room again", Observation{ArchiveFill: 0.3}, Tuning{Balance: -1, PromoteThreshold: 2, ArchiveLevel: 3}, "archive_level 3→2"},
		{"no archive", Observation{ArchiveFill: 0.99}, Tuning{Balance: -1, PromoteThreshold: 2}, ""},
	} {
		var got []string
		for _, c := range Decide(tc.obs, tc.cur, 1, nil, o) {
			if c.Reason == "" {
				t.Errorf("%s: change without a reason: %+v", tc.name, c)
			}
			got = append(got, fmt.Sprintf("%s %g→%g", c.Knob, c.From, c.To))
		}
		if g := strings.Join(got, "; "); g != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, g, tc.want)
		}
	}
	// The balance moves only on epochs with enough lookups.
	climb := NewBalanceClimber(0.5, 0.1)
	if cs := Decide(Observation{Lookups: 10, Hits: 9}, Tuning{Balance: 0.5, PromoteThreshold: 2}, 1, climb, o); len(cs) != 0 {
		t.Fatalf("balance moved on 10 lookups: %+v", cs)
	}
	if cs := Decide(Observation{Lookups: 1000, Hits: 500}, Tuning{Balance: 0.5, PromoteThreshold: 2}, 1, climb, o); len(cs) != 1 || cs[0].Knob != KnobBalance || cs[0].To != 0.6 {
		t.Fatalf("balance: %+v", cs)
	}
}

// The climber keeps a direction that pays, turns back from one that does
// not, stays in [0,1], and finds the best balance of a hit-rate curve.
func TestBalanceClimber(t *testing.T) {
	c := NewBalanceClimber(0.5, 0.1)
	if b := c.Next(0.5); b != 0.6 {
		t.Fatalf("first step to %v", b)
	}
	if b := c.Next(0.55); b <= 0.6 {
		t.Fatalf("kept going? %v", b)
	}
	before := c.Balance()
	if b := c.Next(0.52); b >= before {
		t.Fatalf("did not turn back: %v after %v", b, before)
	}
	// A curve with its peak at 0.2: the climber ends near it.
	curve := func(b float64) float64 { return 0.8 - (b-0.2)*(b-0.2) }
	c = NewBalanceClimber(0.9, 0.1)
	b := c.Balance()
	for range 60 {
		b = c.Next(curve(b))
		if b < 0 || b > 1 {
			t.Fatalf("balance %v out of bounds", b)
		}
	}
	if b < 0.05 || b > 0.35 {
		t.Fatalf("settled at %v, want near 0.2", b)
	}
}

// A Tuner on a real store: a step applies what the rules say and counts it;
// the policy's weights move with the balance.
func TestTunerStepOnStore(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), Strategy: StrategyWeighted, Archive: Budget{MaxBytes: 4 << 10, Soft: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o := tunerOpts(t)
	o.Every = time.Hour // steps are the test's
	tu, err := NewTuner(s, o)
	if err != nil {
		t.Fatal(err)
	}
	defer tu.Close()
	if b, ok := s.Balance(); !ok || b < 0.42 || b > 0.43 { // weighted: 0.3 / (0.4 + 0.3)
		t.Fatalf("weighted balance %v %v", b, ok)
	}
	// Fill the archive past 85% of its budget: the level goes up one.
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 8 {
		b := make([]byte, 420)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if err := s.Put(fmt.Sprintf("k%d", i), Value{Data: b}, PutOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 300 {
		s.Get(fmt.Sprintf("k%d", i%9))
	}
	changes := tu.Step()
	var knobs []string
	for _, c := range changes {
		knobs = append(knobs, c.Knob)
	}
	st := tu.Stats()
	if s.ArchiveLevel() != 2 || st.Epochs != 1 || st.Changes[KnobArchiveLevel] != 1 || len(st.Last) != len(changes) {
		t.Fatalf("level %d, changes %v, stats %+v (archive %+v)", s.ArchiveLevel(), knobs, st, s.Stats().Tiers)
	}
	if tn := s.Stats().Tuning; tn.ArchiveLevel != 2 || tn.PromoteThreshold != 2 || tn.Balance < 0 {
		t.Fatalf("tuning %+v", tn)
	}
	if !s.SetBalance(0.9) {
		t.Fatal("weighted is not tunable")
	}
	if b, _ := s.Balance(); b < 0.899 || b > 0.901 {
		t.Fatalf("balance %v after SetBalance(0.9)", b)
	}
	if err := s.SetPromoteThreshold(0); err == nil || s.SetArchiveLevel(5) == nil {
		t.Fatal("out-of-range settings accepted")
	}
	// w-tinylfu: the balance is its window's share (1% of 80% at first);
	// lru has none.
	s2, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if b, ok := s2.Balance(); !ok || math.Abs(b-0.01/0.8) > 1e-9 || !s2.SetBalance(0.5) || math.Abs(s2.Tuning().Balance-0.5) > 1e-9 || s2.Tuning().ArchiveLevel != 0 {
		t.Fatalf("w-tinylfu store: %+v", s2.Tuning())
	}
	s3, err := Open(Options{Strategy: StrategyLRU})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if s3.SetBalance(0.5) || s3.Tuning().Balance != -1 {
		t.Fatalf("lru store: %+v", s3.Tuning())
	}
}
