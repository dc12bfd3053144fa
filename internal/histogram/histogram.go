// Package histogram is the sidecar's one latency histogram: fixed buckets,
// lock-free observations, snapshots that subtract (a rate over a window)
// and the quantile Prometheus' histogram_quantile computes, which the
// console's thresholds and the tiers' tuner read. The package that
// measures owns its histograms (tiers for promotions and demotions, proxy
// for recall); ExportTo shows one at /metrics through a
// VictoriaMetrics/metrics PrometheusHistogram with the same buckets
// (internal/obs), which writes its text.
package histogram

import (
	"math"
	"sort"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Buckets are the upper bounds in seconds, from loopback overheads to long
// generations. 0.1, 0.2 and 0.5 are the design's alert thresholds for
// promotion, demotion and recall latency (MemGPT design §6.1), so a
// quantile compared with one of them is exact at the threshold: p95 > 0.2
// exactly when more than 5% of the observations took over 0.2 s.
var Buckets = [...]float64{
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
}

// n is the number of buckets, the last one +Inf.
const n = len(Buckets) + 1

// Histogram counts durations in Buckets. The zero value is empty and ready;
// it is safe for concurrent use and must not be copied after first use.
type Histogram struct {
	counts [n]atomic.Uint64 // per bucket, not cumulative
	sumNS  atomic.Int64
	out    atomic.Pointer[metrics.PrometheusHistogram] // see ExportTo
}

// Observe counts one duration; a negative one counts as 0.
func (h *Histogram) Observe(d time.Duration) {
	d = max(d, 0)
	h.counts[sort.SearchFloat64s(Buckets[:], d.Seconds())].Add(1)
	h.sumNS.Add(int64(d))
	if p := h.out.Load(); p != nil {
		p.Update(d.Seconds())
	}
}

// Bounds returns Buckets as the upper bounds a PrometheusHistogram takes
// (obs.Registry.Histogram), so an exported histogram has h's buckets.
func Bounds() []float64 { return append([]float64(nil), Buckets[:]...) }

// ExportTo makes every later observation count in p too: the series
// /metrics shows, made with Bounds (both count a duration equal to a bound
// in that bound's bucket). Call it before the first Observe: observations
// made earlier are in h's snapshots only. Nil stops the export.
func (h *Histogram) ExportTo(p *metrics.PrometheusHistogram) { h.out.Store(p) }

// Snapshot reads the counts now. Observations that land while it reads
// may be in some buckets and not yet in others or in the sum.
func (h *Histogram) Snapshot() Snapshot {
	var s Snapshot
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
	}
	s.SumNS = h.sumNS.Load()
	return s
}

// Snapshot is a histogram's counts at one moment. The zero value is empty.
type Snapshot struct {
	// Counts are per bucket (not cumulative); the last is above every
	// bound in Buckets.
	Counts [n]uint64
	// SumNS is the sum of the observed durations in nanoseconds.
	SumNS int64
}

// Count is the number of observations.
func (s Snapshot) Count() uint64 {
	var c uint64
	for _, x := range s.Counts {
		c += x
	}
	return c
}

// Sum is the sum of the observed durations.
func (s Snapshot) Sum() time.Duration { return time.Duration(s.SumNS) }

// Add returns s with o's observations added (histograms of several tiers
// read as one).
func (s Snapshot) Add(o Snapshot) Snapshot {
	for i := range s.Counts {
		s.Counts[i] += o.Counts[i]
	}
	s.SumNS += o.SumNS
	return s
}

// Sub returns the observations s holds beyond older, an earlier snapshot
// of the same histogram: those of the interval between the two.
func (s Snapshot) Sub(older Snapshot) Snapshot {
	for i := range s.Counts {
		if s.Counts[i] >= older.Counts[i] {
			s.Counts[i] -= older.Counts[i]
		} else {
			s.Counts[i] = 0 // not the same histogram: nothing to subtract
		}
	}
	s.SumNS -= older.SumNS
	return s
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) in seconds, interpolated
// within its bucket as Prometheus' histogram_quantile does (from 0 in the
// first bucket; the largest bound when it falls above every bound). ok is
// false without observations.
func (s Snapshot) Quantile(q float64) (seconds float64, ok bool) {
	total := s.Count()
	if total == 0 || math.IsNaN(q) {
		return 0, false
	}
	q = min(max(q, 0), 1)
	rank := q * float64(total)
	var cum uint64
	for i, c := range s.Counts {
		prev := cum
		cum += c
		if float64(cum) < rank || c == 0 {
			continue
		}
		if i == len(Buckets) {
			return Buckets[len(Buckets)-1], true
		}
		lo := 0.0
		if i > 0 {
			lo = Buckets[i-1]
		}
		return lo + (Buckets[i]-lo)*(rank-float64(prev))/float64(c), true
	}
	return Buckets[len(Buckets)-1], true
}
