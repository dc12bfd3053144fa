package proxy

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvsidecar/kvsidecar/internal/histogram"
	"github.com/kvsidecar/kvsidecar/internal/obs"
)

// route names a family of endpoints in metrics and logs.
type route uint8

const (
	routeChat route = iota
	routeCompletions
	routeEmbeddings
	routeModels
	routePassthrough
	routeHealthz
	routeReadyz
	routeMetrics
	routeSessions
	routeKV
	routePool
	routeConsole
	routeAdmin
	routeMCP
	routeNotFound
	numRoutes
)

var routeNames = [numRoutes]string{
	"chat_completions", "completions", "embeddings", "models", "passthrough",
	"healthz", "readyz", "metrics", "sessions", "kv", "pool", "console", "admin", "mcp", "not_found",
}

func (r route) String() string { return routeNames[r] }

// Upstream error kinds counted in metrics.
const (
	upErrUnreachable = "unreachable"
	upErrTimeout     = "timeout"
	upErrBroken      = "broken"
	upErrTooLarge    = "too_large"
	upErrGarbage     = "garbage"
	// upErrBadResponse: a response head that is not HTTP/1.1 (status
	// line, headers, conflicting framing).
	upErrBadResponse = "bad_response"
	// upErrIncomplete: an event stream that ended without its terminator
	// ([DONE]) before every choice had a finish_reason.
	upErrIncomplete = "incomplete"
)

// latency is a request-time histogram of the registry (package
// histogram's buckets); the zero value counts nothing.
type latency struct{ h *metrics.PrometheusHistogram }

func (l latency) observe(d time.Duration) {
	if l.h != nil {
		l.h.Update(max(d, 0).Seconds())
	}
}

// counter is a counter of the registry with atomic.Uint64's methods.
type counter struct{ c *metrics.Counter }

func (c counter) Add(n uint64) { c.c.AddInt64(int64(n)) }
func (c counter) Load() uint64 { return c.c.Get() }

type routeCode struct {
	route route
	code  int
}

// Metrics holds the proxy's counters in its registry (package obs), which
// writes /metrics; the subsystems the Server was given (memory, the KV
// cache, the engine connector, MCP) are mirrored into it by collectors at
// each scrape. The zero value is not usable; the Server makes one.
type Metrics struct {
	reg         *obs.Registry
	requests    sync.Map // routeCode -> *metrics.Counter
	duration    [numRoutes]latency
	ttfb        [numRoutes]latency
	upErrors    sync.Map // string -> counter, once counted
	bytesIn     counter
	bytesOut    counter
	inFlight    atomic.Int64
	disconnects counter
	anonymous   counter // session requests without a tenant, served statelessly
	fleetBusy   counter // turns refused: the session's lease stayed with another replica
	start       time.Time
}

// upErrorKinds are the kinds of sidecar_upstream_errors_total, each
// written from the start.
var upErrorKinds = [...]string{upErrUnreachable, upErrTimeout, upErrBroken, upErrTooLarge, upErrGarbage, upErrBadResponse, upErrIncomplete}

// newMetrics registers the proxy's own families in reg (a new registry
// when nil).
func newMetrics(reg *obs.Registry) *Metrics {
	if reg == nil {
		reg = obs.New()
	}
	m := &Metrics{reg: reg, start: time.Now()}
	for r := route(0); r < numRoutes; r++ {
		m.duration[r] = latency{reg.Histogram(fmt.Sprintf("sidecar_http_request_duration_seconds{route=%q}", r.String()),
			"Time from request received to response finished, by route.", histogram.Bounds())}
	}
	for _, r := range []route{routeChat, routeCompletions, routeEmbeddings, routeModels, routePassthrough} {
		m.ttfb[r] = latency{reg.Histogram(fmt.Sprintf("sidecar_http_ttfb_seconds{route=%q}", r.String()),
			"Time from request received to the first response byte (streams: the first event), by route.", histogram.Bounds())}
	}
	for _, kind := range upErrorKinds {
		m.upErrorCounter(kind)
	}
	m.disconnects = counter{reg.Counter("sidecar_client_disconnects_total", "Requests whose client went away before the response ended.")}
	m.anonymous = counter{reg.Counter("sidecar_anonymous_stateless_requests_total", "Requests that named a session without an API key and went through without session state.")}
	m.fleetBusy = counter{reg.Counter("sidecar_fleet_session_busy_total", "Turns answered 503 because another replica kept the session's lease past the wait.")}
	m.bytesIn = counter{reg.Counter("sidecar_http_request_bytes_total", "Request body bytes received from clients.")}
	m.bytesOut = counter{reg.Counter("sidecar_http_response_bytes_total", "Response body bytes sent to clients.")}
	reg.Gauge("sidecar_http_in_flight_requests", "Requests being served now.", func() float64 { return float64(m.inFlight.Load()) })

	reg.Gauge("process_resident_memory_bytes", "Resident memory size in bytes.", func() float64 { return float64(residentBytes()) })
	if _, ok := openFDs(); ok {
		reg.Gauge("process_open_fds", "Number of open file descriptors.", func() float64 { n, _ := openFDs(); return float64(n) })
	}
	reg.Gauge("process_start_time_seconds", "Start time of the process since the Unix epoch in seconds.", func() float64 { return float64(m.start.Unix()) })
	reg.Gauge("go_goroutines", "Number of goroutines that currently exist.", func() float64 { return float64(runtime.NumGoroutine()) })
	reg.Gauge("go_sched_gomaxprocs_threads", "The current runtime.GOMAXPROCS setting (the sidecar sizes it to its load unless GOMAXPROCS is set).",
		func() float64 { return float64(runtime.GOMAXPROCS(0)) })
	reg.OnScrape(func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		reg.SetGauge("go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use.", float64(ms.HeapInuse))
		reg.SetCounter("go_memstats_mallocs_total", "Total number of heap objects allocated.", int64(ms.Mallocs))
	})
	return m
}

// Registry returns the registry /metrics writes: a subsystem the Server
// was not given registers its families there (OnScrape for mirrored ones).
func (m *Metrics) Registry() *obs.Registry { return m.reg }

func (m *Metrics) countRequest(r route, code int, total time.Duration) {
	k := routeCode{r, code}
	v, ok := m.requests.Load(k)
	if !ok {
		v, _ = m.requests.LoadOrStore(k, m.reg.Counter(fmt.Sprintf("sidecar_http_requests_total{route=%q,code=\"%d\"}", r.String(), code),
			"Requests served, by route and status code."))
	}
	v.(*metrics.Counter).Inc()
	m.duration[r].observe(total)
}

func (m *Metrics) upErrorCounter(kind string) *metrics.Counter {
	return m.reg.Counter(fmt.Sprintf("sidecar_upstream_errors_total{kind=%q}", kind), "Upstream failures, by kind.")
}

func (m *Metrics) countUpstreamError(kind string) {
	v, ok := m.upErrors.Load(kind)
	if !ok {
		v, _ = m.upErrors.LoadOrStore(kind, counter{m.upErrorCounter(kind)})
	}
	v.(counter).Add(1)
}

// requestCount returns how many requests of route name ended with code; for
// tests and reports.
func (m *Metrics) requestCount(routeName string, code int) uint64 {
	for r := route(0); r < numRoutes; r++ {
		if r.String() == routeName {
			if v, ok := m.requests.Load(routeCode{r, code}); ok {
				return v.(*metrics.Counter).Get()
			}
		}
	}
	return 0
}

// WritePrometheus writes every metric in the Prometheus text format.
func (m *Metrics) WritePrometheus(w io.Writer) { m.reg.WritePrometheus(w) }

// openFDs counts the process's open file descriptors from /proc; ok is false
// where there is none.
func openFDs() (int, bool) {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, false
	}
	return len(names) - 1, true // less the one reading the folder
}

// residentBytes reads the process RSS from /proc; 0 where there is none.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, rss int64
	if _, err := fmt.Sscanf(string(b), "%d %d", &size, &rss); err != nil {
		return 0
	}
	return rss * int64(os.Getpagesize())
}
