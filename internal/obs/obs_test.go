package obs

import (
	"bytes"
	"strings"
	"testing"
)

// TestWritePrometheus: each family is written once with its help and type,
// series keep their labels in the order given, mirrored values are set by
// the collectors before the scrape, and a help text is escaped.
func TestWritePrometheus(t *testing.T) {
	r := New()
	r.Counter(`a_total{route="chat",code="200"}`, "Requests.").Add(2)
	r.Counter(`a_total{route="chat",code="502"}`, "ignored: the first help wins").Inc()
	r.Gauge("b", "In flight.", func() float64 { return 3 })
	var n int64
	r.OnScrape(func() {
		n++
		r.SetCounter("c_total", "Mirrored.", n*10)
		r.SetFloatCounter("d_seconds_total", "Seconds.", 1.5)
		r.SetGauge("e", "Line one\nand a \\.", 0.25)
	})
	r.Histogram(`f_seconds{tier="x"}`, "Latency.", []float64{0.1, 1}).Update(0.5)

	var buf bytes.Buffer
	r.WritePrometheus(&buf)
	r.WritePrometheus(&buf) // the second scrape's collectors see n == 2
	out := buf.String()
	out = out[len(out)/2:]
	for _, want := range []string{
		"# HELP a_total Requests.\n# TYPE a_total counter\na_total{route=\"chat\",code=\"200\"} 2\na_total{route=\"chat\",code=\"502\"} 1\n",
		"# HELP b In flight.\n# TYPE b gauge\nb 3\n",
		"# HELP c_total Mirrored.\n# TYPE c_total counter\nc_total 20\n",
		"# HELP d_seconds_total Seconds.\n# TYPE d_seconds_total counter\nd_seconds_total 1.5\n",
		"# HELP e Line one\\nand a \\\\.\n# TYPE e gauge\ne 0.25\n",
		"# TYPE f_seconds histogram\nf_seconds_bucket{tier=\"x\",le=\"0.1\"} 0\nf_seconds_bucket{tier=\"x\",le=\"1\"} 1\nf_seconds_bucket{tier=\"x\",le=\"+Inf\"} 1\nf_seconds_sum{tier=\"x\"} 0.5\nf_seconds_count{tier=\"x\"} 1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Count(out, "# HELP a_total") != 1 {
		t.Errorf("a family written twice:\n%s", out)
	}
	for f, ok := range r.Families() {
		if !ok {
			t.Errorf("family %s has no help", f)
		}
	}
}
