package workload

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Metrics is one scrape of a Prometheus text endpoint: every sample, by
// metric name (labels summed over).
type Metrics map[string]float64

// ParseMetrics reads the Prometheus text exposition format. Comment lines
// are skipped; the samples of one name with different labels are summed;
// a line that does not parse is skipped.
func ParseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			j := strings.LastIndexByte(rest, '}')
			if j < 0 {
				continue
			}
			rest = rest[j+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		m[name] += v
	}
	return m, sc.Err()
}

// ScrapeMetrics GETs url (a /metrics endpoint) and parses it.
func ScrapeMetrics(ctx context.Context, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return ParseMetrics(io.LimitReader(resp.Body, 16<<20))
}

// Get returns the named metric and whether it was there.
func (m Metrics) Get(name string) (float64, bool) {
	v, ok := m[name]
	return v, ok
}

// engineCounter finds the sidecar's count of an engine operation ("restore"
// or "save") tolerantly, since engine metrics are being renamed: the exact
// sidecar_engine_<op>s_total when present, else the sum of the
// sidecar_engine_* or sidecar_kv_* counters whose name holds the operation
// and no qualifier (errors, bytes, times, misses…).
func (m Metrics) engineCounter(op string) (float64, bool) {
	if v, ok := m["sidecar_engine_"+op+"s_total"]; ok {
		return v, true
	}
	var sum float64
	found := false
	for name, v := range m {
		if !strings.HasSuffix(name, "_total") || !(strings.HasPrefix(name, "sidecar_engine_") || strings.HasPrefix(name, "sidecar_kv_")) {
			continue
		}
		base := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(name, "sidecar_engine_"), "sidecar_kv_"), "_total")
		if base != op+"s" && base != op && base != "slot_"+op+"s" && base != "state_"+op+"s" {
			continue
		}
		sum += v
		found = true
	}
	return sum, found
}

// engineSeconds returns the total seconds spent on an engine operation and
// how many there were, from a histogram or summary
// (sidecar_engine_<op>_seconds_sum/_count), or from a mean gauge
// (sidecar_engine_<op>_seconds_mean) times the operation counter.
func (m Metrics) engineSeconds(op string) (total, count float64, ok bool) {
	if s, ok1 := m["sidecar_engine_"+op+"_seconds_sum"]; ok1 {
		if c, ok2 := m["sidecar_engine_"+op+"_seconds_count"]; ok2 {
			return s, c, true
		}
	}
	mean, ok1 := m["sidecar_engine_"+op+"_seconds_mean"]
	n, ok2 := m.engineCounter(op)
	if ok1 && ok2 {
		return mean * n, n, true
	}
	return 0, 0, false
}

// queueDepth is the sidecar's background engine queue, when it exports it.
func (m Metrics) queueDepth() (float64, bool) {
	return m.Get("sidecar_engine_queue_depth")
}

// delta is after − before for a counter, or after alone when the counter
// went down (the process restarted between the scrapes).
func delta(before, after float64) float64 {
	if after < before {
		return after
	}
	return after - before
}
