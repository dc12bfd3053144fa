package workload

// The figures of a serving run, computed as vLLM's benchmark_serving.py
// computes them (calculate_metrics) and named as it names them in its
// result JSON, so a run here compares with a run of it:
//
//   - TTFT per request; TPOT = (E2EL − TTFT) / (output tokens − 1) for
//     requests with more than one output token; ITL pooled over every gap
//     between chunks of every request; E2EL per request;
//   - mean, median, std (population) and percentiles with numpy's default
//     (linear interpolation between closest ranks), in milliseconds;
//   - request_throughput = completed / duration, output_throughput =
//     output tokens / duration, total_token_throughput = (input + output
//     tokens) / duration, duration from the first request sent to the last
//     answer read.
//
// Input tokens are the server's usage.prompt_tokens (vLLM counts them with
// the model's tokenizer on the client side; through a sidecar the server's
// count includes the memory the sidecar added). Cached tokens, which vLLM's
// script does not report, are the server's
// usage.prompt_tokens_details.cached_tokens or llama.cpp's timings.cache_n.

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
)

// ServeDist summarises one latency, in milliseconds.
type ServeDist struct {
	Mean, Median, Std, P50, P90, P99 float64
}

// ServeResult is one (target, concurrency) run. Its JSON carries vLLM's
// keys (mean_ttft_ms, median_ttft_ms, std_ttft_ms, p50_ttft_ms,
// p90_ttft_ms, p99_ttft_ms, and the same for tpot, itl and e2el) beside
// the fields below.
type ServeResult struct {
	Target string `json:"target"`
	URL    string `json:"base_url"`
	// MaxConcurrency is the cap on requests in flight; 0: none.
	MaxConcurrency int  `json:"max_concurrency"`
	RequestRate    Rate `json:"request_rate"`
	// Duration in seconds.
	Duration  float64 `json:"duration"`
	Completed int     `json:"completed"`
	Failed    int     `json:"failed"`
	// Errors are the first distinct errors (at most 5).
	Errors               []string `json:"errors,omitempty"`
	TotalInputTokens     int64    `json:"total_input_tokens"`
	TotalOutputTokens    int64    `json:"total_output_tokens"`
	RequestThroughput    float64  `json:"request_throughput"`
	OutputThroughput     float64  `json:"output_throughput"`
	TotalTokenThroughput float64  `json:"total_token_throughput"`
	// TotalCachedTokens sums the cached prompt tokens of the requests
	// whose server reported them (CachedReported of Completed); CachedShare
	// is their share of those requests' prompt tokens (-1: none reported).
	TotalCachedTokens int64   `json:"total_cached_tokens"`
	CachedReported    int     `json:"cached_reported"`
	CachedShare       float64 `json:"cached_share"`

	TTFT ServeDist `json:"-"`
	TPOT ServeDist `json:"-"`
	ITL  ServeDist `json:"-"`
	E2EL ServeDist `json:"-"`
}

// serveMetricNames are the latencies in vLLM's order and naming.
var serveMetricNames = []string{"ttft", "tpot", "itl", "e2el"}

func (r *ServeResult) dists() []*ServeDist { return []*ServeDist{&r.TTFT, &r.TPOT, &r.ITL, &r.E2EL} }

// MarshalJSON writes the fields and the flat vLLM keys of each latency.
func (r ServeResult) MarshalJSON() ([]byte, error) {
	type plain ServeResult
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	b = b[:len(b)-1] // the closing brace
	for i, d := range r.dists() {
		n := serveMetricNames[i]
		for _, kv := range []struct {
			k string
			v float64
		}{{"mean", d.Mean}, {"median", d.Median}, {"std", d.Std}, {"p50", d.P50}, {"p90", d.P90}, {"p99", d.P99}} {
			b = fmt.Appendf(b, `,"%s_%s_ms":%s`, kv.k, n, jsonFloat(kv.v))
		}
	}
	return append(b, '}'), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *ServeResult) UnmarshalJSON(b []byte) error {
	type plain ServeResult
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	var flat map[string]json.RawMessage
	if err := json.Unmarshal(b, &flat); err != nil {
		return err
	}
	for i, d := range r.dists() {
		n := serveMetricNames[i]
		for k, p := range map[string]*float64{"mean": &d.Mean, "median": &d.Median, "std": &d.Std, "p50": &d.P50, "p90": &d.P90, "p99": &d.P99} {
			if raw, ok := flat[k+"_"+n+"_ms"]; ok {
				if err := json.Unmarshal(raw, p); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func jsonFloat(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "0"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// serveMetrics computes a run's figures from its requests' records.
func serveMetrics(recs []turnRecord, dur time.Duration) ServeResult {
	var (
		r                            ServeResult
		ttft, tpot, itl, e2el        []float64
		promptWithCache, cachedTotal int64
	)
	r.Duration = dur.Seconds()
	for _, rec := range recs {
		if rec.Err != nil {
			r.Failed++
			if len(r.Errors) < 5 && !slices.Contains(r.Errors, rec.Err.Error()) {
				r.Errors = append(r.Errors, rec.Err.Error())
			}
			continue
		}
		r.Completed++
		r.TotalOutputTokens += rec.OutputTokens
		if rec.PromptTokens > 0 {
			r.TotalInputTokens += rec.PromptTokens
		}
		if rec.CachedTokens >= 0 {
			r.CachedReported++
			cachedTotal += rec.CachedTokens
			promptWithCache += max(rec.PromptTokens, 0)
		}
		ttft = append(ttft, ms(rec.TTFT))
		e2el = append(e2el, ms(rec.E2EL))
		if rec.OutputTokens > 1 {
			tpot = append(tpot, ms(rec.E2EL-rec.TTFT)/float64(rec.OutputTokens-1))
		}
		for _, g := range rec.ITL {
			itl = append(itl, ms(g))
		}
	}
	r.TotalCachedTokens = cachedTotal
	r.CachedShare = -1
	if r.CachedReported > 0 && promptWithCache > 0 {
		r.CachedShare = float64(cachedTotal) / float64(promptWithCache)
	}
	if r.Duration > 0 {
		r.RequestThroughput = float64(r.Completed) / r.Duration
		r.OutputThroughput = float64(r.TotalOutputTokens) / r.Duration
		r.TotalTokenThroughput = float64(r.TotalInputTokens+r.TotalOutputTokens) / r.Duration
	}
	r.TTFT, r.TPOT, r.ITL, r.E2EL = distOf(ttft), distOf(tpot), distOf(itl), distOf(e2el)
	return r
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// distOf summarises v as numpy would (np.mean, np.median, np.std,
// np.percentile); all zero for no samples, as vLLM's `or 0` makes them.
func distOf(v []float64) ServeDist {
	if len(v) == 0 {
		return ServeDist{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	mean := sum / float64(len(s))
	var sq float64
	for _, x := range s {
		sq += (x - mean) * (x - mean)
	}
	return ServeDist{
		Mean: mean, Median: percentileLinear(s, 50), Std: math.Sqrt(sq / float64(len(s))),
		P50: percentileLinear(s, 50), P90: percentileLinear(s, 90), P99: percentileLinear(s, 99),
	}
}

// percentileLinear is numpy's default percentile (method "linear") of
// sorted s, p in [0, 100].
func percentileLinear(s []float64, p float64) float64 {
	if len(s) == 0 {
		return 0
	}
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[lo] + (s[lo+1]-s[lo])*(pos-float64(lo))
}
