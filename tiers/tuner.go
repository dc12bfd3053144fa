package tiers

// The AdaptiveTuner (MemGPT design §6.2): from the store's live hit rate,
// promotion and demotion latency and storage pressure, it moves the
// eviction policy's recency/frequency balance, the promotion threshold and
// the Archive's zstd level, each in bounded steps, one step per knob per
// epoch, every change logged and counted.

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/internal/histogram"
)

// BalanceClimber moves a Tunable policy's balance by hill climbing on the
// hit rate of successive epochs, as Caffeine sizes its admission window:
// it steps in one direction while the hit rate does not fall, turns back
// when it falls, takes smaller steps as it settles (×0.8 per epoch, down
// to a quarter of the first) and full ones again when the hit rate jumps
// by more than 5 points (the workload changed). The balance stays in
// [0,1]. The constants and the default first step (0.2) were chosen on
// bench/simulator's shifting trace (w-tinylfu at 10, 20 and 50% of the
// items, two seeds, epochs of 1,000 and 3,000 accesses) among decays 0.8
// to 0.95, floors 0.1 to 0.5, restarts 0.02 to 0.1 and steps 0.05 to 0.3.
// Not safe for concurrent use.
type BalanceClimber struct {
	balance, step, first float64
	dir                  float64
	prev                 float64
	have                 bool
}

// Hill-climbing constants (see BalanceClimber).
const (
	climbDecay   = 0.8
	climbRestart = 0.05
	climbFloor   = 0.25 // of the first step
)

// NewBalanceClimber starts at balance start with steps of step (0 means
// 0.2), first towards recency.
func NewBalanceClimber(start, step float64) *BalanceClimber {
	if step <= 0 {
		step = 0.2
	}
	return &BalanceClimber{balance: clamp01(start), step: step, first: step, dir: 1}
}

// Balance returns the balance the current epoch runs at.
func (c *BalanceClimber) Balance() float64 { return c.balance }

// Next takes the hit rate of the epoch that ran at Balance and returns the
// balance for the next one.
func (c *BalanceClimber) Next(hitRate float64) float64 {
	if c.have {
		switch d := hitRate - c.prev; {
		case math.Abs(d) > climbRestart:
			c.step = c.first
			if d < 0 {
				c.dir = -c.dir
			}
		case d < 0:
			c.dir = -c.dir
			c.step = max(c.first*climbFloor, c.step*climbDecay)
		default:
			c.step = max(c.first*climbFloor, c.step*climbDecay)
		}
	}
	c.have, c.prev = true, hitRate
	next := clamp01(c.balance + c.dir*c.step)
	if next == c.balance { // at a bound: turn around
		c.dir = -c.dir
		next = clamp01(c.balance + c.dir*c.step)
	}
	c.balance = next
	return next
}

// TunerOptions configure a Tuner. Every zero value is a documented default
// (NewTuner applies EnsureDefaults and Validate).
type TunerOptions struct {
	// Every is the epoch: how often the tuner looks. Zero means 30 s.
	Every time.Duration
	// MinLookups is the lookups an epoch needs before its hit rate moves
	// the balance. Zero means 256.
	MinLookups int64
	// BalanceStep is the climber's first step. Zero means 0.2.
	BalanceStep float64
	// PromoteMin and PromoteMax bound the promotion threshold; PromoteStep
	// is the factor of one step. Zero means 1, 8 and 1.25.
	PromoteMin, PromoteMax, PromoteStep float64
	// PromotionBudget is the p95 of a lookup served from below Focus above
	// which hot blocks should move up sooner; DemotionBudget the p95 of a
	// move down above which the Archive should compress faster. Zero
	// means the design's alert thresholds, 100 ms and 200 ms.
	PromotionBudget, DemotionBudget time.Duration
	// ArchiveHigh and ArchiveLow are shares of the Archive's byte budget:
	// above High, or when the Archive had to delete blocks for room, the
	// level rises (smaller blocks); below Low it returns towards the
	// store's configured level. Zero means 0.85 (the Archive trims itself
	// to 90% by default) and 0.5.
	ArchiveHigh, ArchiveLow float64
	// Logger receives one line per change. Nil means slog.Default().
	Logger *slog.Logger
	// Clock tells time. Nil means the system clock.
	Clock clock.Clock
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. NewTuner calls it; calling it twice changes nothing.
func (o *TunerOptions) EnsureDefaults() *TunerOptions {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.BalanceStep, 0.2)
	def(&o.PromoteMin, 1)
	def(&o.PromoteMax, 8)
	def(&o.PromoteStep, 1.25)
	def(&o.ArchiveHigh, 0.85)
	def(&o.ArchiveLow, 0.5)
	if o.Every == 0 {
		o.Every = 30 * time.Second
	}
	if o.MinLookups == 0 {
		o.MinLookups = 256
	}
	if o.PromotionBudget == 0 {
		o.PromotionBudget = 100 * time.Millisecond
	}
	if o.DemotionBudget == 0 {
		o.DemotionBudget = 200 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *TunerOptions) Validate() error {
	switch {
	case o.Every < 0 || o.MinLookups < 0 || o.PromotionBudget < 0 || o.DemotionBudget < 0:
		return fmt.Errorf("tiers: tuner: negative option")
	case o.BalanceStep <= 0 || o.BalanceStep > 0.5:
		return fmt.Errorf("tiers: tuner: balance step %g (0 to 0.5)", o.BalanceStep)
	case o.PromoteMin <= 0 || o.PromoteMax < o.PromoteMin || o.PromoteStep <= 1:
		return fmt.Errorf("tiers: tuner: promotion bounds %g..%g, step %g", o.PromoteMin, o.PromoteMax, o.PromoteStep)
	case o.ArchiveLow <= 0 || o.ArchiveHigh <= o.ArchiveLow || o.ArchiveHigh > 1:
		return fmt.Errorf("tiers: tuner: archive pressure bounds %g..%g", o.ArchiveLow, o.ArchiveHigh)
	}
	return nil
}

// Knobs a Tuner moves (TuneChange.Knob).
const (
	KnobBalance      = "balance"
	KnobPromote      = "promote_threshold"
	KnobArchiveLevel = "archive_level"
)

// TuneChange is one step a Tuner took.
type TuneChange struct {
	At     time.Time `json:"at"`
	Knob   string    `json:"knob"`
	From   float64   `json:"from"`
	To     float64   `json:"to"`
	Reason string    `json:"reason"`
}

// Observation is what one epoch showed the tuner.
type Observation struct {
	// Lookups reached the memory tiers; Hits were served by them.
	Lookups, Hits int64
	// PromotionP95 is the p95 of lookups served from below Focus (zero:
	// none), DemotionP95 of the moves down from Working to the Archive.
	PromotionP95, DemotionP95 time.Duration
	// FocusFill and ArchiveFill are bytes over budget (zero without the
	// tier); FocusDemotions the blocks Focus pushed down, ArchiveEvictions
	// the blocks the Archive deleted for room.
	FocusFill, ArchiveFill           float64
	FocusDemotions, ArchiveEvictions int64
}

// HitRate is Hits/Lookups (0 without lookups).
func (o Observation) HitRate() float64 {
	if o.Lookups == 0 {
		return 0
	}
	return float64(o.Hits) / float64(o.Lookups)
}

// TunerStats is what a Tuner did.
type TunerStats struct {
	Epochs  int64            `json:"epochs"`
	Changes map[string]int64 `json:"changes"`
	// Last is the newest changes, oldest first (at most 16).
	Last []TuneChange `json:"last,omitempty"`
	// HitRate is the last epoch's.
	HitRate float64 `json:"hit_rate"`
}

// Tuner is the AdaptiveTuner of a Store. Create it with NewTuner, which
// starts its goroutine (one Step per Every); Close stops it. Safe for
// concurrent use.
type Tuner struct {
	s    *Store
	o    TunerOptions
	base int // the store's configured archive level

	epochs  atomic.Int64
	changes [3]atomic.Int64

	// mu protects the fields below (one Step at a time).
	mu    sync.Mutex
	climb *BalanceClimber
	prev  Stats
	last  []TuneChange
	rate  float64

	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// NewTuner returns a tuner of s and starts it.
func NewTuner(s *Store, o TunerOptions) (*Tuner, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	t := &Tuner{s: s, o: o, base: s.ArchiveLevel(), prev: s.Stats(), done: make(chan struct{})}
	if b, ok := s.Balance(); ok {
		t.climb = NewBalanceClimber(b, o.BalanceStep)
	}
	t.wg.Add(1)
	go t.loop()
	return t, nil
}

func (t *Tuner) loop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.done:
			return
		case <-t.o.Clock.After(t.o.Every):
			t.Step()
		}
	}
}

// Close stops the tuner and waits for it; the store keeps the parameters
// it set. Idempotent.
func (t *Tuner) Close() {
	t.once.Do(func() { close(t.done) })
	t.wg.Wait()
}

// Step ends an epoch now: it observes the store since the last step and
// applies what Decide says. It returns the changes.
func (t *Tuner) Step() []TuneChange {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.s.Stats()
	obs := observe(t.prev, cur)
	t.prev = cur
	t.epochs.Add(1)
	t.rate = obs.HitRate()
	changes := Decide(obs, cur.Tuning, t.base, t.climb, t.o)
	now := t.o.Clock.Now()
	var applied []TuneChange
	for _, c := range changes {
		var err error
		switch c.Knob {
		case KnobBalance:
			t.s.SetBalance(c.To)
		case KnobPromote:
			err = t.s.SetPromoteThreshold(c.To)
		case KnobArchiveLevel:
			err = t.s.SetArchiveLevel(int(c.To))
		}
		if err != nil {
			t.o.Logger.Warn("kv tuner: change refused", "knob", c.Knob, "to", c.To, "err", err)
			continue
		}
		c.At = now
		applied = append(applied, c)
		t.changes[knobIndex(c.Knob)].Add(1)
		t.o.Logger.Info("kv tuner", "knob", c.Knob, "from", c.From, "to", c.To, "reason", c.Reason)
	}
	t.last = append(t.last, applied...)
	if n := len(t.last); n > 16 {
		t.last = append([]TuneChange(nil), t.last[n-16:]...)
	}
	return applied
}

func knobIndex(k string) int {
	switch k {
	case KnobBalance:
		return 0
	case KnobPromote:
		return 1
	default:
		return 2
	}
}

// Stats returns what the tuner did.
func (t *Tuner) Stats() TunerStats {
	st := TunerStats{Epochs: t.epochs.Load(), Changes: map[string]int64{}}
	for _, k := range []string{KnobBalance, KnobPromote, KnobArchiveLevel} {
		st.Changes[k] = t.changes[knobIndex(k)].Load()
	}
	t.mu.Lock()
	st.Last = append([]TuneChange(nil), t.last...)
	st.HitRate = t.rate
	t.mu.Unlock()
	return st
}

// observe turns two snapshots of the store into an epoch's observation.
func observe(prev, cur Stats) Observation {
	find := func(st Stats, name string) (TierStats, bool) {
		for _, t := range st.Tiers {
			if t.Tier == name {
				return t, true
			}
		}
		return TierStats{}, false
	}
	var o Observation
	f0, _ := find(prev, "focus")
	f1, hasFocus := find(cur, "focus")
	w0, _ := find(prev, "working")
	w1, _ := find(cur, "working")
	a0, _ := find(prev, "archive")
	a1, hasArchive := find(cur, "archive")
	if hasFocus {
		o.Lookups = (f1.Hits + f1.Misses) - (f0.Hits + f0.Misses)
		o.Hits = (f1.Hits - f0.Hits) + (w1.Hits - w0.Hits)
		o.FocusDemotions = f1.Demotions - f0.Demotions
		if f1.MaxBytes > 0 {
			o.FocusFill = float64(f1.Bytes) / float64(f1.MaxBytes)
		}
	} else {
		o.Lookups = (w1.Hits + w1.Misses) - (w0.Hits + w0.Misses)
		o.Hits = w1.Hits - w0.Hits
	}
	if hasArchive && a1.MaxBytes > 0 {
		o.ArchiveFill = float64(a1.Bytes) / float64(a1.MaxBytes)
		o.ArchiveEvictions = a1.Evictions - a0.Evictions
	}
	p95 := func(h histogram.Snapshot) time.Duration {
		if q, ok := h.Quantile(0.95); ok && h.Count() > 0 {
			return time.Duration(q * float64(time.Second))
		}
		return 0
	}
	promo := w1.PromotionLatency.Sub(w0.PromotionLatency).Add(a1.PromotionLatency.Sub(a0.PromotionLatency))
	o.PromotionP95 = p95(promo)
	o.DemotionP95 = p95(w1.DemotionLatency.Sub(w0.DemotionLatency))
	return o
}

// Decide is the tuner's rule book: a function of one epoch's observation
// and the parameters as they are (base: the configured archive level;
// climb, whose state it advances: nil when the policy has no balance):
//
//   - balance: the climber's next step on the epoch's hit rate, when the
//     epoch saw at least MinLookups lookups;
//   - promotion threshold: a step down (hot blocks move up sooner) when
//     lookups served from below Focus take longer than PromotionBudget at
//     p95 and Focus is under 90% full; a step up (only the hottest move
//     up) when Focus is over 95% full and pushed blocks down this epoch;
//   - archive level: one down when moves into the Archive take longer than
//     DemotionBudget at p95; one up when the Archive is over ArchiveHigh of
//     its budget or deleted blocks for room, and moves take under half the
//     budget; one back towards base when it is under ArchiveLow.
//
// Every step stays within its bounds.
func Decide(obs Observation, cur Tuning, base int, climb *BalanceClimber, o TunerOptions) []TuneChange {
	var out []TuneChange
	if climb != nil && cur.Balance >= 0 && obs.Lookups >= o.MinLookups && obs.Lookups > 0 {
		next := climb.Next(obs.HitRate())
		if next != cur.Balance {
			out = append(out, TuneChange{Knob: KnobBalance, From: cur.Balance, To: next,
				Reason: fmt.Sprintf("hit rate %.1f%% over %d lookups", 100*obs.HitRate(), obs.Lookups)})
		}
	}
	if p := cur.PromoteThreshold; p > 0 {
		switch {
		case obs.PromotionP95 > o.PromotionBudget && obs.FocusFill < 0.9 && p > o.PromoteMin:
			out = append(out, TuneChange{Knob: KnobPromote, From: p, To: max(o.PromoteMin, p/o.PromoteStep),
				Reason: fmt.Sprintf("lookups from below Focus took %v at p95 (budget %v) and Focus is %.0f%% full", obs.PromotionP95, o.PromotionBudget, 100*obs.FocusFill)})
		case obs.FocusFill > 0.95 && obs.FocusDemotions > 0 && p < o.PromoteMax:
			out = append(out, TuneChange{Knob: KnobPromote, From: p, To: min(o.PromoteMax, p*o.PromoteStep),
				Reason: fmt.Sprintf("Focus is %.0f%% full and pushed %d blocks down", 100*obs.FocusFill, obs.FocusDemotions)})
		}
	}
	if l := cur.ArchiveLevel; l > 0 {
		switch {
		case obs.DemotionP95 > o.DemotionBudget && l > 1:
			out = append(out, TuneChange{Knob: KnobArchiveLevel, From: float64(l), To: float64(l - 1),
				Reason: fmt.Sprintf("moves into the Archive took %v at p95 (budget %v)", obs.DemotionP95, o.DemotionBudget)})
		case (obs.ArchiveFill > o.ArchiveHigh || obs.ArchiveEvictions > 0) && obs.DemotionP95 < o.DemotionBudget/2 && l < 4:
			out = append(out, TuneChange{Knob: KnobArchiveLevel, From: float64(l), To: float64(l + 1),
				Reason: fmt.Sprintf("the Archive is at %.0f%% of its budget (%d blocks deleted for room) and moves take %v at p95", 100*obs.ArchiveFill, obs.ArchiveEvictions, obs.DemotionP95)})
		case obs.ArchiveFill < o.ArchiveLow && l > base:
			out = append(out, TuneChange{Knob: KnobArchiveLevel, From: float64(l), To: float64(l - 1),
				Reason: fmt.Sprintf("the Archive is at %.0f%% of its budget", 100*obs.ArchiveFill)})
		}
	}
	return out
}
