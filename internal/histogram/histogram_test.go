package histogram

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/obs"
)

func TestObserveAndQuantile(t *testing.T) {
	var h Histogram
	if _, ok := h.Snapshot().Quantile(0.95); ok {
		t.Fatal("an empty histogram has a quantile")
	}
	// 90 fast (into the 1 ms bucket), 10 in the 0.2–0.25 s bucket.
	for range 90 {
		h.Observe(800 * time.Microsecond)
	}
	for range 10 {
		h.Observe(220 * time.Millisecond)
	}
	h.Observe(-time.Second) // counts as 0
	s := h.Snapshot()
	if s.Count() != 101 {
		t.Fatalf("count %d, want 101", s.Count())
	}
	if want := 90*800*time.Microsecond + 10*220*time.Millisecond; s.Sum() != want {
		t.Fatalf("sum %v, want %v", s.Sum(), want)
	}
	f := func(q, want float64) {
		t.Helper()
		got, ok := s.Quantile(q)
		if !ok || math.Abs(got-want) > 1e-9 {
			t.Fatalf("q%.2f = %g (%v), want %g", q, got, ok, want)
		}
	}
	f(0.5, 0.0005+0.0005*(50.5-1)/90)  // within (0.0005, 0.001]
	f(0.95, 0.2+0.05*(95.95-91)/10)    // within (0.2, 0.25]: above the 0.2 threshold
	f(0.90, 0.0005+0.0005*(90.9-1)/90) // still the fast bucket
	f(1, 0.25)                         // the top of the last bucket used
	h.Observe(time.Hour)               // above every bound
	if got, _ := h.Snapshot().Quantile(1); got != 300 {
		t.Fatalf("q1 with an observation above every bound = %g, want 300", got)
	}
}

// TestThresholdBoundaries: the design's thresholds are bucket bounds, so
// p95 is above a threshold exactly when more than 5% of observations are.
func TestThresholdBoundaries(t *testing.T) {
	for _, th := range []float64{0.1, 0.2, 0.5} {
		for _, slow := range []int{4, 5, 6} {
			var h Histogram
			for range 100 - slow {
				h.Observe(time.Millisecond)
			}
			for range slow {
				h.Observe(time.Duration(th*1.01*float64(time.Second)) + time.Millisecond)
			}
			p95, _ := h.Snapshot().Quantile(0.95)
			if got, want := p95 > th, slow > 5; got != want {
				t.Fatalf("threshold %g with %d%% slower: p95 %g > threshold is %v, want %v", th, slow, p95, got, want)
			}
		}
	}
}

func TestSubAndAdd(t *testing.T) {
	var a, b Histogram
	a.Observe(time.Millisecond)
	old := a.Snapshot()
	a.Observe(300 * time.Millisecond)
	b.Observe(300 * time.Millisecond)
	d := a.Snapshot().Sub(old)
	if d != b.Snapshot() {
		t.Fatalf("a later snapshot less an earlier one: %+v, want %+v", d, b.Snapshot())
	}
	if got := d.Add(old); got != a.Snapshot() {
		t.Fatalf("added back: %+v, want %+v", got, a.Snapshot())
	}
	if got := old.Sub(a.Snapshot()); got.Count() != 0 {
		t.Fatalf("an earlier snapshot less a later one holds %d", got.Count())
	}
}

// TestExportTo: an exported histogram's series count what the histogram
// counts, in the same buckets (a duration equal to a bound in that bound's
// bucket), with its labels before le.
func TestExportTo(t *testing.T) {
	r := obs.New()
	var h Histogram
	h.ExportTo(r.Histogram(`x_seconds{tier="working"}`, "X.", Bounds()))
	h.Observe(150 * time.Millisecond)
	h.Observe(200 * time.Millisecond)
	h.Observe(time.Hour)
	var buf bytes.Buffer
	r.WritePrometheus(&buf)
	out := buf.String()
	for _, want := range []string{
		"# HELP x_seconds X.\n# TYPE x_seconds histogram\n",
		"x_seconds_bucket{tier=\"working\",le=\"0.1\"} 0\n",
		"x_seconds_bucket{tier=\"working\",le=\"0.2\"} 2\n",
		"x_seconds_bucket{tier=\"working\",le=\"300\"} 2\n",
		"x_seconds_bucket{tier=\"working\",le=\"+Inf\"} 3\n",
		"x_seconds_sum{tier=\"working\"} 3600.35\n",
		"x_seconds_count{tier=\"working\"} 3\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in\n%s", want, out)
		}
	}
	if s := h.Snapshot(); s.Count() != 3 || s.Counts[8] != 2 {
		t.Fatalf("the histogram's own counts: %+v", s)
	}
}
