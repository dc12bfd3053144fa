// Package obs is the sidecar's one metrics registry: every family /metrics
// shows is a metric of github.com/VictoriaMetrics/metrics in one Registry,
// which writes the Prometheus text format. Nothing else writes exposition
// text.
//
// VictoriaMetrics/metrics rather than Prometheus' client_golang: it has
// two small dependencies and no protobuf (client_golang's client_model
// would bring protobuf into the serving binary), its counters are one
// atomic word, and its PrometheusHistogram writes `le` buckets, which the
// alert rules in deploy/prometheus take histogram_quantile of.
//
// Two kinds of metric live here:
//   - Owned: the package that counts updates the metric itself (Counter,
//     Histogram; a Gauge with a function read at each scrape).
//   - Mirrored: a subsystem that keeps its own counters (a Stats snapshot
//     of kv, memory, an engine connector) is read once per scrape by a
//     collector (OnScrape) that sets the registry's metrics from it with
//     SetCounter, SetFloatCounter and SetGauge.
//
// The library writes "# HELP name" without text; the Registry keeps each
// family's help, given with the metric, and fills it in, so `promtool check
// metrics` finds every family documented.
//
// Invariants: a family has one type and one help (the first given wins);
// collectors run one scrape at a time, before the set is written; a name
// is a valid Prometheus series name with its labels in the order given
// (`family{a="x",b="y"}`), which the text shows unchanged.
package obs

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"
)

func init() {
	// TYPE lines (and HELP, filled in by WritePrometheus) for every
	// family: histogram_quantile needs none, but promtool and people do.
	metrics.ExposeMetadata(true)
}

// Registry holds a set of metrics and the help of their families. The zero
// value is not usable; call New. Safe for concurrent use.
type Registry struct {
	set *metrics.Set

	// mu protects the fields below.
	mu         sync.Mutex
	help       map[string]string // by family
	collectors []func()

	scrape sync.Mutex // one scrape at a time: collectors, then the set
}

// New returns an empty registry.
func New() *Registry {
	return &Registry{set: metrics.NewSet(), help: map[string]string{}}
}

// family is a series name without its labels.
func family(name string) string {
	if i := strings.IndexByte(name, '{'); i >= 0 {
		return name[:i]
	}
	return name
}

func (r *Registry) describe(name, help string) {
	f := family(name)
	r.mu.Lock()
	if _, ok := r.help[f]; !ok {
		r.help[f] = help
	}
	r.mu.Unlock()
}

// Counter returns the counter of series name (created on first use), whose
// family help is help. Its name ends in _total.
func (r *Registry) Counter(name, help string) *metrics.Counter {
	r.describe(name, help)
	return r.set.GetOrCreateCounter(name)
}

// FloatCounter is Counter for a float (seconds, for example).
func (r *Registry) FloatCounter(name, help string) *metrics.FloatCounter {
	r.describe(name, help)
	return r.set.GetOrCreateFloatCounter(name)
}

// Gauge returns the gauge of series name (created on first use). With f,
// its value is f() at each scrape; without, what Set last stored.
func (r *Registry) Gauge(name, help string, f func() float64) *metrics.Gauge {
	r.describe(name, help)
	return r.set.GetOrCreateGauge(name, f)
}

// Histogram returns the histogram of series name (created on first use),
// with le buckets at bounds, the upper bounds in seconds.
func (r *Registry) Histogram(name, help string, bounds []float64) *metrics.PrometheusHistogram {
	r.describe(name, help)
	return r.set.GetOrCreatePrometheusHistogramExt(name, bounds)
}

// SetCounter sets a mirrored counter to v, an owner's cumulative count.
func (r *Registry) SetCounter(name, help string, v int64) {
	r.Counter(name, help).Set(uint64(max(v, 0)))
}

// SetFloatCounter sets a mirrored float counter to v.
func (r *Registry) SetFloatCounter(name, help string, v float64) {
	r.FloatCounter(name, help).Set(v)
}

// SetGauge sets a mirrored gauge to v.
func (r *Registry) SetGauge(name, help string, v float64) {
	r.Gauge(name, help, nil).Set(v)
}

// OnScrape registers f to run before each scrape writes the set: a
// collector that reads an owner's snapshot once and sets the metrics it
// mirrors. Collectors run one scrape at a time, in the order registered.
func (r *Registry) OnScrape(f func()) {
	r.mu.Lock()
	r.collectors = append(r.collectors, f)
	r.mu.Unlock()
}

// WritePrometheus runs the collectors and writes every metric in the
// Prometheus text format, families sorted by name, each with its HELP and
// TYPE.
func (r *Registry) WritePrometheus(w io.Writer) {
	r.scrape.Lock()
	r.mu.Lock()
	cs := append([]func(){}, r.collectors...)
	r.mu.Unlock()
	for _, c := range cs {
		c()
	}
	var buf bytes.Buffer
	r.set.WritePrometheus(&buf)
	r.scrape.Unlock()

	r.mu.Lock()
	defer r.mu.Unlock()
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	for line := range bytes.Lines(buf.Bytes()) {
		if f, ok := bytes.CutPrefix(line, []byte("# HELP ")); ok {
			f = bytes.TrimSuffix(f, []byte("\n"))
			if h := r.help[string(f)]; h != "" {
				bw.Write(line[:len(line)-1])
				bw.WriteByte(' ')
				bw.WriteString(escapeHelp(h))
				bw.WriteByte('\n')
				continue
			}
		}
		bw.Write(line)
	}
}

// escapeHelp escapes a help text as the text format wants: a backslash
// and a line feed.
func escapeHelp(s string) string {
	if !strings.ContainsAny(s, "\\\n") {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

// Families returns the names of the families written so far and whether
// each has a help text; for tests.
func (r *Registry) Families() map[string]bool {
	out := map[string]bool{}
	for _, n := range r.set.ListMetricNames() {
		f := family(n)
		r.mu.Lock()
		out[f] = r.help[f] != ""
		r.mu.Unlock()
	}
	return out
}
