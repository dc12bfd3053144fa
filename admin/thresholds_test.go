package admin

import (
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/histogram"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// statsKV is a KV whose Stats are set by the test.
type statsKV struct {
	KV
	st kv.Stats
}

func (f *statsKV) Stats() kv.Stats { return f.st }

// observe adds n observations of d to a snapshot.
func observe(s histogram.Snapshot, n int, d time.Duration) histogram.Snapshot {
	var h histogram.Histogram
	for range n {
		h.Observe(d)
	}
	return s.Add(h.Snapshot())
}

// TestThresholds: each threshold is judged breached on one side of its
// limit and not on the other; rates and quantiles count only what
// happened in the last five minutes; nothing to judge is unknown.
func TestThresholds(t *testing.T) {
	f := &statsKV{}
	m := &fakeSessions{}
	s := &Server{opts: Options{KV: f, Sessions: m}, series: newKVSeries(100)}
	now := time.Unix(1_800_000_000, 0)
	judge := func() map[string]Threshold {
		out := map[string]Threshold{}
		for _, th := range s.thresholds(now) {
			out[th.Alert] = th
		}
		if len(out) != 7 {
			t.Fatalf("%d thresholds: %+v", len(out), out)
		}
		return out
	}
	for name, th := range judge() {
		if th.Known || th.Breached {
			t.Fatalf("%s judged with nothing to judge: %+v", name, th)
		}
	}

	// Ten minutes ago: a bad stretch (slow moves and recalls, Working
	// missing), which has left the window.
	f.st.Tiers = []tiers.TierStats{
		{Tier: "focus", Bytes: 50, MaxBytes: 100},
		{Tier: "working", Hits: 10, Misses: 90},
		{Tier: "archive", Bytes: 10, RawBytes: 100},
	}
	f.st.Tiers[1].PromotionLatency = observe(histogram.Snapshot{}, 50, time.Second)
	f.st.Tiers[1].DemotionLatency = observe(histogram.Snapshot{}, 50, time.Second)
	m.recall = append(m.recall, time.Minute) // a full recall
	m.windowTokens, m.limits = 990, 1000
	s.series.add(s.sample(now.Add(-10 * time.Minute)))

	// Since then: fast moves and recalls, a good hit rate, half-full
	// windows, a fuller Focus tier and a poorly compressed Archive.
	f.st.Tiers[0].Bytes = 96
	f.st.Tiers[1].Hits, f.st.Tiers[1].Misses = 10+90, 90+10
	f.st.Tiers[1].PromotionLatency = observe(f.st.Tiers[1].PromotionLatency, 100, time.Millisecond)
	f.st.Tiers[2].PromotionLatency = observe(histogram.Snapshot{}, 4, 150*time.Millisecond) // 4% slow: p95 still fast
	f.st.Tiers[0].DemotionLatency = observe(histogram.Snapshot{}, 100, 250*time.Millisecond)
	f.st.Tiers[2].Bytes = 20
	for range 10 {
		m.recall = append(m.recall, 10*time.Millisecond) // reuses
	}
	// A turn that recalled nothing is not a recall: the proxy's
	// WindowCounters leaves it out (package proxy's TestWindowCounters).
	m.windowTokens += 500
	m.limits += 1000
	s.series.add(s.sample(now.Add(-time.Minute)))

	got := judge()
	for _, c := range []struct {
		alert    string
		value    float64
		breached bool
	}{
		{"KVSidecarFocusTierFull", 0.96, true},
		{"KVSidecarContextWindowFull", 0.5, false},
		{"KVSidecarWorkingHitRateLow", 0.9, false},
		{"KVSidecarArchiveCompressionLow", 0.8, true},
		{"KVSidecarRecallSlow", -1, false},
		{"KVSidecarPromotionSlow", -1, false},
		{"KVSidecarDemotionSlow", -1, true},
	} {
		th := got[c.alert]
		if !th.Known || th.Breached != c.breached || (c.value >= 0 && (th.Value < c.value-1e-9 || th.Value > c.value+1e-9)) {
			t.Errorf("%s: %+v, want value %g breached %v", c.alert, th, c.value, c.breached)
		}
	}
	if th := got["KVSidecarDemotionSlow"]; th.Value <= 0.2 || th.Value > 0.25 {
		t.Errorf("demotion p95 %g, want within (0.2, 0.25]", th.Value)
	}

	// Without a sample from before the window, everything since the start
	// counts: the bad stretch too.
	s.series = newKVSeries(100)
	got = judge()
	if th := got["KVSidecarWorkingHitRateLow"]; !th.Breached || th.Value != 0.5 {
		t.Errorf("since the start: %+v", th)
	}
	if th := got["KVSidecarRecallSlow"]; !th.Breached {
		t.Errorf("since the start: %+v", th)
	}
}
