package tiers

import (
	"bytes"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/histogram"
)

// stepClock moves on by step at every reading, so every timed move takes
// exactly one step.
type stepClock struct {
	n    atomic.Int64
	step time.Duration
}

func (c *stepClock) Now() time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(c.n.Add(1)) * c.step)
}

func (c *stepClock) After(time.Duration) <-chan time.Time { return nil }

// TestMoveLatencyAndArchiveRawBytes: every demotion is timed under the
// tier it left, every lookup served from Working or the Archive under
// that tier, Focus hits are not; the Archive counts its blocks' bytes
// before compression beside their files'.
func TestMoveLatencyAndArchiveRawBytes(t *testing.T) {
	clk := &stepClock{step: 150 * time.Millisecond}
	s, err := open(Options{
		Dir:              t.TempDir(),
		Focus:            Budget{MaxBytes: 2048},
		Working:          Budget{MaxBytes: 4096},
		PromoteThreshold: 1e9, // nothing moves up: where each key is stays known
		Clock:            clk,
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n, size = 12, 1000
	for i := range n {
		// Compressible blocks: one byte repeated.
		if err := s.Put("k"+strconv.Itoa(i), Value{Data: bytes.Repeat([]byte{byte(i)}, size)}, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.Maintain()
	byTier := map[string]TierStats{}
	for _, ts := range s.Stats().Tiers {
		byTier[ts.Tier] = ts
	}
	focus, working, archive := byTier["focus"], byTier["working"], byTier["archive"]
	if focus.Demotions == 0 || working.Demotions == 0 || archive.Entries == 0 {
		t.Fatalf("the puts moved nothing down: %+v", byTier)
	}
	for _, ts := range []TierStats{focus, working} {
		if got := ts.DemotionLatency.Count(); got != uint64(ts.Demotions) {
			t.Fatalf("%s: %d demotions timed, %d counted", ts.Tier, got, ts.Demotions)
		}
		// At least one step each (a demotion from Focus may wait for one
		// from Working to make room: more steps).
		for i, ub := range histogram.Buckets {
			if ub < 0.15 && ts.DemotionLatency.Counts[i] != 0 {
				t.Fatalf("%s: demotions under a step: %v", ts.Tier, ts.DemotionLatency.Counts)
			}
		}
	}
	if archive.DemotionLatency.Count() != 0 || focus.PromotionLatency.Count() != 0 {
		t.Fatalf("timed moves that do not exist: %+v", byTier)
	}
	if want := int64(archive.Entries) * size; archive.RawBytes != want || archive.Bytes >= archive.RawBytes {
		t.Fatalf("archive: %d raw bytes in %d file bytes, want %d raw, compressed", archive.RawBytes, archive.Bytes, want)
	}
	if focus.RawBytes != 0 || working.RawBytes != 0 {
		t.Fatalf("memory tiers report raw bytes: %+v", byTier)
	}

	served := map[Tier]uint64{}
	for i := range n {
		_, tier, err := s.Get("k" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		served[tier]++
	}
	byTier = map[string]TierStats{}
	for _, ts := range s.Stats().Tiers {
		byTier[ts.Tier] = ts
	}
	if served[TierFocus] == 0 || served[TierWorking] == 0 || served[TierArchive] == 0 {
		t.Fatalf("gets served by %v, want every tier", served)
	}
	for _, tr := range []Tier{TierWorking, TierArchive} {
		if got := byTier[tr.String()].PromotionLatency.Count(); got != served[tr] {
			t.Fatalf("%s served %d gets, %d timed", tr, served[tr], got)
		}
	}
	if byTier["focus"].PromotionLatency.Count() != 0 {
		t.Fatal("Focus hits were timed as promotions")
	}

	// Deleting archived blocks takes their raw bytes away too.
	for i := range n {
		_ = s.Delete("k" + strconv.Itoa(i))
	}
	for _, ts := range s.Stats().Tiers {
		if ts.Tier == "archive" && (ts.RawBytes != 0 || ts.Bytes != 0) {
			t.Fatalf("empty archive: %+v", ts)
		}
	}
}
