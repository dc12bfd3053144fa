package admin

import (
	"time"

	"github.com/kvsidecar/kvsidecar/internal/histogram"
)

// The design's alert thresholds (MemGPT design §6.1) as the console shows
// them. deploy/prometheus/kvsidecar.rules.yml holds the same thresholds as
// Prometheus alerts over the same /metrics series; the console judges
// gauges as they are now and rates over thresholdWindow, from the
// sampler's ring, so it needs no Prometheus.

// thresholdWindow is the span the console's rates and quantiles cover, as
// the rules' [5m].
const thresholdWindow = 5 * time.Minute

// alertPoint is what the thresholds need of one moment: cumulative
// counters and histograms, read with a KVSample.
type alertPoint struct {
	workingHits, workingMisses int64
	windowTokens, windowLimit  uint64
	// promotion and demotion add up the tiers' histograms; recall is
	// memory.Prepare of the turns that recalled (full or reuse).
	promotion, demotion, recall histogram.Snapshot
	// Gauges: the Focus tier's bytes and budget, the Archive's file and
	// raw bytes.
	focusBytes, focusMax     int64
	archiveBytes, archiveRaw int64
	focusTier                bool
}

// readAlertPoint reads the counters now.
func (s *Server) readAlertPoint() *alertPoint {
	_, windowTokens, windowLimit, recall := s.opts.Sessions.WindowCounters()
	p := &alertPoint{windowTokens: windowTokens, windowLimit: windowLimit, recall: recall}
	if c := s.opts.KV; c != nil {
		for _, t := range c.Stats().Tiers {
			p.promotion = p.promotion.Add(t.PromotionLatency)
			p.demotion = p.demotion.Add(t.DemotionLatency)
			switch t.Tier {
			case "focus":
				p.focusTier, p.focusBytes, p.focusMax = true, t.Bytes, t.MaxBytes
			case "working":
				p.workingHits, p.workingMisses = t.Hits, t.Misses
			case "archive":
				p.archiveBytes, p.archiveRaw = t.Bytes, t.RawBytes
			}
		}
	}
	return p
}

// Threshold is one alert threshold as the console shows it.
type Threshold struct {
	// Alert is the alert's name in the Prometheus rules file.
	Alert string `json:"alert"`
	// Name says what is measured, Unit how Value and Limit read:
	// "ratio" (0–1) or "seconds".
	Name string `json:"name"`
	Unit string `json:"unit"`
	// Value is the measurement, Limit the threshold; Above: breached
	// when Value > Limit, else when Value < Limit.
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Above bool    `json:"above"`
	// Known is false when there is nothing to judge (no lookups, turns
	// or moves in the window, no Focus tier, an empty Archive).
	Known    bool `json:"known"`
	Breached bool `json:"breached"`
}

// thresholds judges every threshold now: gauges as they are, rates and
// quantiles over the thresholdWindow before now.
func (s *Server) thresholds(now time.Time) []Threshold {
	cur := s.readAlertPoint()
	// The base is the newest sample from before the window; without one
	// (the sidecar started less than a window ago), the start.
	base := &alertPoint{}
	for _, x := range s.series.snapshot() { // oldest first
		if x.At.After(now.Add(-thresholdWindow)) {
			break
		}
		if x.alert != nil {
			base = x.alert
		}
	}
	out := make([]Threshold, 0, 7)
	add := func(alert, name, unit string, v, limit float64, above, known bool) {
		th := Threshold{Alert: alert, Name: name, Unit: unit, Limit: limit, Above: above, Known: known}
		if known {
			th.Value = v
			th.Breached = (above && v > limit) || (!above && v < limit)
		}
		out = append(out, th)
	}
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	add("KVSidecarFocusTierFull", "Focus tier utilisation (KV bytes / budget, now)", "ratio",
		ratio(float64(cur.focusBytes), float64(cur.focusMax)), 0.95, true, cur.focusTier && cur.focusMax > 0)
	dTok, dLim := float64(cur.windowTokens-base.windowTokens), float64(cur.windowLimit-base.windowLimit)
	add("KVSidecarContextWindowFull", "Focus window utilisation (window tokens / limit, 5 min)", "ratio",
		ratio(dTok, dLim), 0.95, true, dLim > 0)
	dh, dm := float64(cur.workingHits-base.workingHits), float64(cur.workingMisses-base.workingMisses)
	add("KVSidecarWorkingHitRateLow", "Working tier hit rate (5 min)", "ratio", ratio(dh, dh+dm), 0.85, false, dh+dm > 0)
	add("KVSidecarArchiveCompressionLow", "Archive compression (bytes saved, now)", "ratio",
		1-ratio(float64(cur.archiveBytes), float64(cur.archiveRaw)), 0.85, false, cur.archiveRaw > 0)
	q := func(alert, name string, now, old histogram.Snapshot, limit float64) {
		v, ok := now.Sub(old).Quantile(0.95)
		add(alert, name, "seconds", v, limit, true, ok)
	}
	q("KVSidecarRecallSlow", "Recall latency p95 (memory prepare, 5 min)", cur.recall, base.recall, 0.5)
	q("KVSidecarPromotionSlow", "Promotion latency p95 (5 min)", cur.promotion, base.promotion, 0.1)
	q("KVSidecarDemotionSlow", "Demotion latency p95 (5 min)", cur.demotion, base.demotion, 0.2)
	return out
}
