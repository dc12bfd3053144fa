package proxy

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/histogram"
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

// latency is a request-time histogram (package histogram's buckets).
type latency struct{ histogram.Histogram }

func (l *latency) observe(d time.Duration) { l.Observe(d) }

type routeCode struct {
	route route
	code  int
}

// Metrics holds the proxy's counters. The zero value is not usable; the
// Server makes one. Collectors added with AddCollector write extra families.
type Metrics struct {
	requests    sync.Map // routeCode -> *atomic.Uint64
	duration    [numRoutes]latency
	ttfb        [numRoutes]latency
	upErrors    sync.Map // string -> *atomic.Uint64
	bytesIn     atomic.Uint64
	bytesOut    atomic.Uint64
	inFlight    atomic.Int64
	disconnects atomic.Uint64
	anonymous   atomic.Uint64 // session requests without a tenant, served statelessly
	fleetBusy   atomic.Uint64 // turns refused: the session's lease stayed with another replica
	start       time.Time

	// mu protects the fields below.
	mu         sync.Mutex
	collectors []func(io.Writer)
}

func newMetrics() *Metrics { return &Metrics{start: time.Now()} }

// AddCollector registers f to write more metric families (Prometheus text
// format) at the end of every scrape. f must be safe for concurrent use.
func (m *Metrics) AddCollector(f func(io.Writer)) {
	m.mu.Lock()
	m.collectors = append(m.collectors, f)
	m.mu.Unlock()
}

func (m *Metrics) countRequest(r route, code int, total time.Duration) {
	k := routeCode{r, code}
	v, ok := m.requests.Load(k)
	if !ok {
		v, _ = m.requests.LoadOrStore(k, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
	m.duration[r].observe(total)
}

func (m *Metrics) countUpstreamError(kind string) {
	v, ok := m.upErrors.Load(kind)
	if !ok {
		v, _ = m.upErrors.LoadOrStore(kind, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
}

// requestCount returns how many requests of route name ended with code; for
// tests and reports.
func (m *Metrics) requestCount(routeName string, code int) uint64 {
	for r := route(0); r < numRoutes; r++ {
		if r.String() == routeName {
			if v, ok := m.requests.Load(routeCode{r, code}); ok {
				return v.(*atomic.Uint64).Load()
			}
		}
	}
	return 0
}

// WritePrometheus writes every metric in the Prometheus text format.
func (m *Metrics) WritePrometheus(out io.Writer) {
	w := bufio.NewWriter(out)
	defer w.Flush()

	type row struct {
		k routeCode
		v uint64
	}
	var rows []row
	m.requests.Range(func(k, v any) bool {
		rows = append(rows, row{k.(routeCode), v.(*atomic.Uint64).Load()})
		return true
	})
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].k.route != rows[j].k.route {
			return rows[i].k.route < rows[j].k.route
		}
		return rows[i].k.code < rows[j].k.code
	})
	fmt.Fprintln(w, "# HELP sidecar_http_requests_total Requests served, by route and status code.")
	fmt.Fprintln(w, "# TYPE sidecar_http_requests_total counter")
	for _, r := range rows {
		fmt.Fprintf(w, "sidecar_http_requests_total{route=%q,code=\"%d\"} %d\n", r.k.route.String(), r.k.code, r.v)
	}

	fmt.Fprintln(w, "# HELP sidecar_http_request_duration_seconds Time from request received to response finished, by route.")
	fmt.Fprintln(w, "# TYPE sidecar_http_request_duration_seconds histogram")
	for r := route(0); r < numRoutes; r++ {
		m.duration[r].Snapshot().WritePrometheus(w, "sidecar_http_request_duration_seconds", fmt.Sprintf("route=%q,", r.String()))
	}
	fmt.Fprintln(w, "# HELP sidecar_http_ttfb_seconds Time from request received to the first response byte (streams: the first event), by route.")
	fmt.Fprintln(w, "# TYPE sidecar_http_ttfb_seconds histogram")
	for _, r := range []route{routeChat, routeCompletions, routeEmbeddings, routeModels, routePassthrough} {
		m.ttfb[r].Snapshot().WritePrometheus(w, "sidecar_http_ttfb_seconds", fmt.Sprintf("route=%q,", r.String()))
	}

	fmt.Fprintln(w, "# HELP sidecar_upstream_errors_total Upstream failures, by kind.")
	fmt.Fprintln(w, "# TYPE sidecar_upstream_errors_total counter")
	for _, kind := range []string{upErrUnreachable, upErrTimeout, upErrBroken, upErrTooLarge, upErrGarbage, upErrBadResponse, upErrIncomplete} {
		var n uint64
		if v, ok := m.upErrors.Load(kind); ok {
			n = v.(*atomic.Uint64).Load()
		}
		fmt.Fprintf(w, "sidecar_upstream_errors_total{kind=%q} %d\n", kind, n)
	}
	fmt.Fprintln(w, "# HELP sidecar_client_disconnects_total Requests whose client went away before the response ended.")
	fmt.Fprintln(w, "# TYPE sidecar_client_disconnects_total counter")
	fmt.Fprintf(w, "sidecar_client_disconnects_total %d\n", m.disconnects.Load())
	fmt.Fprintln(w, "# HELP sidecar_anonymous_stateless_requests_total Requests that named a session without an API key and went through without session state.")
	fmt.Fprintln(w, "# TYPE sidecar_anonymous_stateless_requests_total counter")
	fmt.Fprintf(w, "sidecar_anonymous_stateless_requests_total %d\n", m.anonymous.Load())
	fmt.Fprintln(w, "# HELP sidecar_fleet_session_busy_total Turns answered 503 because another replica kept the session's lease past the wait.")
	fmt.Fprintln(w, "# TYPE sidecar_fleet_session_busy_total counter")
	fmt.Fprintf(w, "sidecar_fleet_session_busy_total %d\n", m.fleetBusy.Load())
	fmt.Fprintln(w, "# HELP sidecar_http_request_bytes_total Request body bytes received from clients.")
	fmt.Fprintln(w, "# TYPE sidecar_http_request_bytes_total counter")
	fmt.Fprintf(w, "sidecar_http_request_bytes_total %d\n", m.bytesIn.Load())
	fmt.Fprintln(w, "# HELP sidecar_http_response_bytes_total Response body bytes sent to clients.")
	fmt.Fprintln(w, "# TYPE sidecar_http_response_bytes_total counter")
	fmt.Fprintf(w, "sidecar_http_response_bytes_total %d\n", m.bytesOut.Load())
	fmt.Fprintln(w, "# HELP sidecar_http_in_flight_requests Requests being served now.")
	fmt.Fprintln(w, "# TYPE sidecar_http_in_flight_requests gauge")
	fmt.Fprintf(w, "sidecar_http_in_flight_requests %d\n", m.inFlight.Load())

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintln(w, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge")
	fmt.Fprintf(w, "process_resident_memory_bytes %d\n", residentBytes())
	if n, ok := openFDs(); ok {
		fmt.Fprintln(w, "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge")
		fmt.Fprintf(w, "process_open_fds %d\n", n)
	}
	fmt.Fprintln(w, "# HELP process_start_time_seconds Start time of the process since the Unix epoch in seconds.\n# TYPE process_start_time_seconds gauge")
	fmt.Fprintf(w, "process_start_time_seconds %d\n", m.start.Unix())
	fmt.Fprintln(w, "# HELP go_goroutines Number of goroutines that currently exist.\n# TYPE go_goroutines gauge")
	fmt.Fprintf(w, "go_goroutines %d\n", runtime.NumGoroutine())
	fmt.Fprintln(w, "# HELP go_memstats_heap_inuse_bytes Number of heap bytes that are in use.\n# TYPE go_memstats_heap_inuse_bytes gauge")
	fmt.Fprintf(w, "go_memstats_heap_inuse_bytes %d\n", ms.HeapInuse)
	fmt.Fprintln(w, "# HELP go_memstats_mallocs_total Total number of heap objects allocated.\n# TYPE go_memstats_mallocs_total counter")
	fmt.Fprintf(w, "go_memstats_mallocs_total %d\n", ms.Mallocs)

	m.mu.Lock()
	cs := append([]func(io.Writer){}, m.collectors...)
	m.mu.Unlock()
	for _, c := range cs {
		c(w)
	}
}

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
