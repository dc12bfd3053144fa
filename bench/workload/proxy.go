package workload

// Proxy overhead: the same loopback upstream reached directly, through the
// sidecar (pass-through and session paths) and through nginx, under the
// same closed-loop load at each concurrency, non-streamed and streamed,
// reported as added latency per path, requests/s, CPU per 10K requests of
// each process (proxy_cpu.go) and sidecar/nginx ratios.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/valyala/fasthttp"
)

// ProxyTarget is one path to the upstream.
type ProxyTarget struct {
	Name string // e.g. direct, sidecar, nginx
	Addr string // host:port
	// MetricsAddr, when set, is scraped for RSS and allocations (the
	// sidecar's /metrics).
	MetricsAddr string
	// Session sends every request with an API key and a session id (the
	// session path: a sidecar keeps memory for it); each client's session
	// changes every ProxyOptions.SessionTurns requests. Otherwise requests
	// carry no Authorization (the stateless pass-through path).
	Session bool
	// PIDs are the processes serving this path (their direct children
	// included: an nginx master's workers), whose CPU time is charged to
	// it. Two targets must not share one. Empty: no CPU figure.
	PIDs []int
}

// ProxyOptions configure RunProxy.
type ProxyOptions struct {
	// Targets to compare; the one named "direct" is the baseline, "nginx"
	// and "sidecar" are compared in the ratios.
	Targets []ProxyTarget
	// Requests per target and concurrency for the non-streaming and
	// streaming runs. Zero means 10,000 and 2,000.
	Requests, StreamRequests int
	// Concurrency lists the numbers of connections (clients in flight),
	// each measured on its own. Empty means 8 and 64.
	Concurrency []int
	// Rounds interleaves the targets this many times so drift on a shared
	// machine hits every path alike. Zero means 5.
	Rounds int
	// Warmup requests per target before measuring. Zero means 500.
	Warmup int
	// UpstreamPIDs are the upstream's processes: their CPU time is charged
	// per request over every path (all reach it). Empty: no figure.
	UpstreamPIDs []int
	// SessionTurns is how many requests a client of a Session target sends
	// in one session before it starts another. Zero means 16.
	SessionTurns int
}

// ProxyPath is the measurements of one target at one concurrency. Added
// figures are the path's minus the direct path's. Requests/s is what the
// path served with Concurrency clients in flight, each sending its next
// request as soon as it has the answer: with enough clients, the rate at
// saturation. CPU is the CPU time of the path's processes (PIDs) while
// the block of runs (non-streamed or streamed) lasted, per 10,000 requests
// it served.
type ProxyPath struct {
	Name       string  `json:"name"`
	Session    bool    `json:"session"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	RPS        float64 `json:"requests_per_s"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	AddedP50Ms float64 `json:"added_p50_ms"`
	AddedP99Ms float64 `json:"added_p99_ms"`
	CPUPer10K  float64 `json:"cpu_s_per_10k,omitempty"`
	// Streamed: time to the first event (TTFE) and to the last ([DONE],
	// TTLE).
	StreamRequests  int     `json:"stream_requests"`
	StreamErrors    int     `json:"stream_errors"`
	StreamRPS       float64 `json:"stream_requests_per_s"`
	StreamTTFEP50   float64 `json:"stream_ttfe_p50_ms"`
	StreamTTFEP99   float64 `json:"stream_ttfe_p99_ms"`
	AddedTTFEP50    float64 `json:"added_ttfe_p50_ms"`
	AddedTTFEP99    float64 `json:"added_ttfe_p99_ms"`
	StreamTTLEP50   float64 `json:"stream_ttle_p50_ms"`
	StreamTTLEP99   float64 `json:"stream_ttle_p99_ms"`
	AddedTTLEP50    float64 `json:"added_ttle_p50_ms"`
	AddedTTLEP99    float64 `json:"added_ttle_p99_ms"`
	StreamCPUPer10K float64 `json:"stream_cpu_s_per_10k,omitempty"`
	// Scraped from MetricsAddr, when set.
	AllocsPerRequest float64 `json:"allocs_per_request,omitempty"`
	RSSBeforeBytes   int64   `json:"rss_before_bytes,omitempty"`
	RSSAfterBytes    int64   `json:"rss_after_bytes,omitempty"`
}

// ProxyLevel is every target measured at one concurrency.
type ProxyLevel struct {
	Concurrency int         `json:"concurrency"`
	Paths       []ProxyPath `json:"paths"`
	// CPU seconds per 10,000 requests of the upstream (UpstreamPIDs) and of
	// this process, the load generator, over every path.
	UpstreamCPUPer10K       float64 `json:"upstream_cpu_s_per_10k,omitempty"`
	UpstreamStreamCPUPer10K float64 `json:"upstream_stream_cpu_s_per_10k,omitempty"`
	LoadCPUPer10K           float64 `json:"load_generator_cpu_s_per_10k"`
	LoadStreamCPUPer10K     float64 `json:"load_generator_stream_cpu_s_per_10k"`
	// Ratios of the sidecar's (pass-through) figures to nginx's, when both
	// ran: added latency, requests/s, CPU per request.
	RatioAddedP50     float64 `json:"ratio_sidecar_nginx_added_p50,omitempty"`
	RatioAddedP99     float64 `json:"ratio_sidecar_nginx_added_p99,omitempty"`
	RatioRPS          float64 `json:"ratio_sidecar_nginx_rps,omitempty"`
	RatioCPU          float64 `json:"ratio_sidecar_nginx_cpu,omitempty"`
	RatioAddedTTFEP50 float64 `json:"ratio_sidecar_nginx_added_ttfe_p50,omitempty"`
	RatioAddedTTFEP99 float64 `json:"ratio_sidecar_nginx_added_ttfe_p99,omitempty"`
	RatioAddedTTLEP50 float64 `json:"ratio_sidecar_nginx_added_ttle_p50,omitempty"`
	RatioStreamRPS    float64 `json:"ratio_sidecar_nginx_stream_rps,omitempty"`
}

// ProxyReport is the outcome of RunProxy: one level per concurrency.
type ProxyReport struct {
	Levels  []ProxyLevel `json:"levels"`
	Seconds float64      `json:"seconds"`
}

var (
	proxyChatBody   = []byte(`{"model":"mock","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say something short."}]}`)
	proxyStreamBody = []byte(`{"model":"mock","stream":true,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say something short."}]}`)
)

func (o *ProxyOptions) setDefaults() {
	if o.Requests == 0 {
		o.Requests = 10_000
	}
	if o.StreamRequests == 0 {
		o.StreamRequests = 2_000
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{8, 64}
	}
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	if o.Warmup == 0 {
		o.Warmup = 500
	}
	if o.SessionTurns == 0 {
		o.SessionTurns = 16
	}
}

func (o *ProxyOptions) validate() error {
	if len(o.Targets) == 0 {
		return errors.New("bench: proxy: no targets")
	}
	if o.Requests < 0 || o.StreamRequests < 0 || o.Rounds < 1 || o.Warmup < 0 || o.SessionTurns < 1 {
		return errors.New("bench: proxy: negative option")
	}
	for _, c := range o.Concurrency {
		if c < 1 {
			return fmt.Errorf("bench: proxy: concurrency %d", c)
		}
	}
	owner := map[int]string{}
	for _, t := range o.Targets {
		for _, p := range t.PIDs {
			if prev, ok := owner[p]; ok {
				return fmt.Errorf("bench: proxy: pid %d charged to both %s and %s", p, prev, t.Name)
			}
			owner[p] = t.Name
		}
	}
	return nil
}

// proxyRun is one target's state through a RunProxy: its client, what the
// current level measured, its sessions.
type proxyRun struct {
	t              ProxyTarget
	c              *fasthttp.HostClient
	sessions       *atomic.Int64 // sessions started (the Session path)
	lat, ttfe, ttl []time.Duration
	errs, sErrs    int
	wall, sWall    time.Duration
	mallocs0       float64
	rss0           int64
}

// RunProxy measures every target with the same load, at each concurrency.
func RunProxy(o ProxyOptions) (ProxyReport, error) {
	o.setDefaults()
	if err := o.validate(); err != nil {
		return ProxyReport{}, err
	}
	t0 := time.Now()
	nonce := strconv.FormatInt(t0.UnixNano()%1e9, 36)
	runs := make([]*proxyRun, len(o.Targets))
	for i, t := range o.Targets {
		runs[i] = &proxyRun{t: t, sessions: new(atomic.Int64)}
	}
	var rep ProxyReport
	for _, conc := range o.Concurrency {
		lv, err := runProxyLevel(o, runs, conc, nonce)
		if err != nil {
			return rep, err
		}
		rep.Levels = append(rep.Levels, lv)
	}
	rep.Seconds = time.Since(t0).Seconds()
	return rep, nil
}

// proxyLoadSpec is one batch of a target's load.
type proxyLoadSpec struct {
	n, conc      int
	stream       bool
	session      bool
	sessionTurns int
	nonce        string
	sessions     *atomic.Int64
}

func runProxyLevel(o ProxyOptions, runs []*proxyRun, conc int, nonce string) (ProxyLevel, error) {
	spec := func(r *proxyRun, n int, stream bool) proxyLoadSpec {
		return proxyLoadSpec{n: n, conc: conc, stream: stream, session: r.t.Session, sessionTurns: o.SessionTurns, nonce: nonce, sessions: r.sessions}
	}
	for _, r := range runs {
		r.c = &fasthttp.HostClient{Addr: r.t.Addr, MaxConns: conc * 2, StreamResponseBody: true, ReadTimeout: 30 * time.Second}
		r.lat, r.ttfe, r.ttl, r.errs, r.sErrs, r.wall, r.sWall = nil, nil, nil, 0, 0, 0, 0
		_, _, errs := proxyLoad(r.c, spec(r, o.Warmup, false))
		if o.Warmup > 0 && errs == o.Warmup {
			return ProxyLevel{}, fmt.Errorf("bench: proxy: target %s (%s) answers no request", r.t.Name, r.t.Addr)
		}
		if r.t.MetricsAddr != "" {
			m := scrapeMetrics(r.t.MetricsAddr)
			r.mallocs0, r.rss0 = m["go_memstats_mallocs_total"], int64(m["process_resident_memory_bytes"])
		}
	}
	// block runs every target Rounds times, interleaved, and returns the
	// CPU each target's processes, the upstream's and this process used.
	block := func(stream bool) (perTarget []time.Duration, up, self time.Duration, err error) {
		cpu0 := make([]time.Duration, len(runs))
		for i, r := range runs {
			if cpu0[i], err = procCPU(r.t.PIDs); err != nil {
				return
			}
		}
		up0, err := procCPU(o.UpstreamPIDs)
		if err != nil {
			return
		}
		self0, err := procCPU([]int{0})
		if err != nil {
			return
		}
		per := o.Requests / o.Rounds
		if stream {
			per = o.StreamRequests / o.Rounds
		}
		for round := 0; round < o.Rounds; round++ {
			for _, r := range runs {
				start := time.Now()
				first, last, errs := proxyLoad(r.c, spec(r, per, stream))
				if stream {
					r.sWall += time.Since(start)
					r.ttfe, r.ttl, r.sErrs = append(r.ttfe, first...), append(r.ttl, last...), r.sErrs+errs
				} else {
					r.wall += time.Since(start)
					r.lat, r.errs = append(r.lat, first...), r.errs+errs
				}
			}
		}
		perTarget = make([]time.Duration, len(runs))
		for i, r := range runs {
			c, err := procCPU(r.t.PIDs)
			if err != nil {
				return nil, 0, 0, err
			}
			perTarget[i] = c - cpu0[i]
		}
		up1, err := procCPU(o.UpstreamPIDs)
		if err != nil {
			return
		}
		self1, err := procCPU([]int{0})
		return perTarget, up1 - up0, self1 - self0, err
	}
	lv := ProxyLevel{Concurrency: conc}
	cpu, upCPU, selfCPU, err := block(false)
	if err != nil {
		return lv, err
	}
	total := 0
	for i, r := range runs {
		p := ProxyPath{Name: r.t.Name, Session: r.t.Session, Requests: len(r.lat) + r.errs, Errors: r.errs,
			RPS: perSecond(len(r.lat), r.wall), P50Ms: percentileMs(r.lat, 0.50), P99Ms: percentileMs(r.lat, 0.99)}
		if len(r.t.PIDs) > 0 {
			p.CPUPer10K = per10K(cpu[i], len(r.lat))
		}
		if r.t.MetricsAddr != "" {
			m := scrapeMetrics(r.t.MetricsAddr)
			if n := len(r.lat); n > 0 {
				// The scrape itself allocates too; this is an upper bound.
				p.AllocsPerRequest = (m["go_memstats_mallocs_total"] - r.mallocs0) / float64(n)
			}
			p.RSSBeforeBytes, p.RSSAfterBytes = r.rss0, int64(m["process_resident_memory_bytes"])
		}
		total += len(r.lat)
		lv.Paths = append(lv.Paths, p)
	}
	if len(o.UpstreamPIDs) > 0 {
		lv.UpstreamCPUPer10K = per10K(upCPU, total)
	}
	lv.LoadCPUPer10K = per10K(selfCPU, total)

	cpu, upCPU, selfCPU, err = block(true)
	if err != nil {
		return lv, err
	}
	total = 0
	for i, r := range runs {
		p := &lv.Paths[i]
		p.StreamRequests, p.StreamErrors, p.StreamRPS = len(r.ttfe)+r.sErrs, r.sErrs, perSecond(len(r.ttfe), r.sWall)
		p.StreamTTFEP50, p.StreamTTFEP99 = percentileMs(r.ttfe, 0.50), percentileMs(r.ttfe, 0.99)
		p.StreamTTLEP50, p.StreamTTLEP99 = percentileMs(r.ttl, 0.50), percentileMs(r.ttl, 0.99)
		if len(r.t.PIDs) > 0 {
			p.StreamCPUPer10K = per10K(cpu[i], len(r.ttfe))
		}
		total += len(r.ttfe)
	}
	if len(o.UpstreamPIDs) > 0 {
		lv.UpstreamStreamCPUPer10K = per10K(upCPU, total)
	}
	lv.LoadStreamCPUPer10K = per10K(selfCPU, total)

	var base, sc, ng *ProxyPath
	for i := range lv.Paths {
		switch lv.Paths[i].Name {
		case "direct":
			base = &lv.Paths[i]
		case "sidecar":
			sc = &lv.Paths[i]
		case "nginx":
			ng = &lv.Paths[i]
		}
	}
	if base != nil {
		for i := range lv.Paths {
			p := &lv.Paths[i]
			p.AddedP50Ms, p.AddedP99Ms = p.P50Ms-base.P50Ms, p.P99Ms-base.P99Ms
			p.AddedTTFEP50, p.AddedTTFEP99 = p.StreamTTFEP50-base.StreamTTFEP50, p.StreamTTFEP99-base.StreamTTFEP99
			p.AddedTTLEP50, p.AddedTTLEP99 = p.StreamTTLEP50-base.StreamTTLEP50, p.StreamTTLEP99-base.StreamTTLEP99
		}
	}
	if sc != nil && ng != nil {
		lv.RatioAddedP50 = ratio(sc.AddedP50Ms, ng.AddedP50Ms)
		lv.RatioAddedP99 = ratio(sc.AddedP99Ms, ng.AddedP99Ms)
		lv.RatioRPS = ratio(sc.RPS, ng.RPS)
		lv.RatioCPU = ratio(sc.CPUPer10K, ng.CPUPer10K)
		lv.RatioAddedTTFEP50 = ratio(sc.AddedTTFEP50, ng.AddedTTFEP50)
		lv.RatioAddedTTFEP99 = ratio(sc.AddedTTFEP99, ng.AddedTTFEP99)
		lv.RatioAddedTTLEP50 = ratio(sc.AddedTTLEP50, ng.AddedTTLEP50)
		lv.RatioStreamRPS = ratio(sc.StreamRPS, ng.StreamRPS)
	}
	return lv, nil
}

func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func per10K(cpu time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return cpu.Seconds() * 10_000 / float64(n)
}

// proxyLoad sends s.n requests from s.conc clients and returns each
// latency to the first complete event (streams) or the whole response,
// and to the end of the response.
func proxyLoad(c *fasthttp.HostClient, s proxyLoadSpec) (first, last []time.Duration, errs int) {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		next = make(chan struct{}, s.n)
		sep  = []byte("\n\n")
		body = proxyChatBody
	)
	if s.stream {
		body = proxyStreamBody
	}
	first, last = make([]time.Duration, 0, s.n), make([]time.Duration, 0, s.n)
	for i := 0; i < s.n; i++ {
		next <- struct{}{}
	}
	close(next)
	for w := 0; w < s.conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			buf := make([]byte, 32<<10)
			session, turns := "", 0
			for range next {
				req.Reset()
				req.SetRequestURI("http://" + c.Addr + "/v1/chat/completions")
				req.Header.SetMethod(fasthttp.MethodPost)
				req.Header.SetContentType("application/json")
				if s.session {
					if turns%s.sessionTurns == 0 {
						session = fmt.Sprintf("bench-proxy-%s-%d", s.nonce, s.sessions.Add(1))
					}
					turns++
					req.Header.Set("Authorization", "Bearer bench-proxy")
					req.Header.Set("X-Session-ID", session)
				}
				req.SetBody(body)
				t0 := time.Now()
				err := c.Do(req, resp)
				var d time.Duration
				if err == nil && resp.StatusCode() != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode())
				}
				if err == nil {
					// Read until the first event (streams) and the end.
					var got []byte
					r := resp.BodyStream()
					for r != nil {
						k, rerr := r.Read(buf)
						got = append(got, buf[:k]...)
						if s.stream && d == 0 && bytes.Contains(got, sep) {
							d = time.Since(t0)
						}
						if rerr == io.EOF {
							break
						}
						if rerr != nil {
							err = rerr
							break
						}
					}
					if r == nil {
						got = resp.Body()
					}
					if d == 0 {
						d = time.Since(t0)
					}
					if err == nil && s.stream && !bytes.Contains(got, []byte("[DONE]")) {
						err = errors.New("stream without [DONE]")
					}
					_ = resp.CloseBodyStream()
				}
				end := time.Since(t0)
				mu.Lock()
				if err != nil {
					errs++
				} else {
					first, last = append(first, d), append(last, end)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first, last, errs
}

// scrapeMetrics reads the numeric samples without labels from a Prometheus
// text endpoint.
func scrapeMetrics(addr string) map[string]float64 {
	out := map[string]float64{}
	code, body, err := fasthttp.Get(nil, "http://"+addr+"/metrics")
	if err != nil || code != 200 {
		return out
	}
	for _, line := range strings.Split(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || strings.HasPrefix(line, "#") || strings.Contains(f[0], "{") {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[f[0]] = v
		}
	}
	return out
}

// WriteProxyTable prints the report for humans: per concurrency, a table
// of the non-streamed and one of the streamed requests, the CPU of the
// upstream and the load generator, and the sidecar/nginx ratios.
func WriteProxyTable(w io.Writer, r ProxyReport) error {
	for li, lv := range r.Levels {
		if li > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "== %d connections ==\nnon-streamed (ms):\n", lv.Concurrency)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "path\tsession\trequests\terrors\treq/s\tp50\tp99\tadded p50\tadded p99\tCPU s/10K\tallocs/req\tRSS before\tRSS after\t\n")
		for _, p := range lv.Paths {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t\n",
				p.Name, yesNo(p.Session), p.Requests, p.Errors, p.RPS, p.P50Ms, p.P99Ms, p.AddedP50Ms, p.AddedP99Ms,
				optF2(p.CPUPer10K), optF(p.AllocsPerRequest), optMiB(p.RSSBeforeBytes), optMiB(p.RSSAfterBytes))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "streamed (ms; TTFE: time to first event, TTLE: to the last):\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "path\tsession\trequests\terrors\treq/s\tTTFE p50\tTTFE p99\tadded TTFE p50\tadded TTFE p99\tTTLE p50\tTTLE p99\tadded TTLE p50\tCPU s/10K\t\n")
		for _, p := range lv.Paths {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t\n",
				p.Name, yesNo(p.Session), p.StreamRequests, p.StreamErrors, p.StreamRPS, p.StreamTTFEP50, p.StreamTTFEP99,
				p.AddedTTFEP50, p.AddedTTFEP99, p.StreamTTLEP50, p.StreamTTLEP99, p.AddedTTLEP50, optF2(p.StreamCPUPer10K))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if lv.UpstreamCPUPer10K > 0 {
			fmt.Fprintf(w, "upstream CPU s/10K requests: %.2f non-streamed, %.2f streamed; ", lv.UpstreamCPUPer10K, lv.UpstreamStreamCPUPer10K)
		}
		fmt.Fprintf(w, "load generator: %.2f, %.2f\n", lv.LoadCPUPer10K, lv.LoadStreamCPUPer10K)
		if lv.RatioAddedP50 > 0 || lv.RatioRPS > 0 {
			fmt.Fprintf(w, "sidecar/nginx: added p50 %s, added p99 %s, req/s %s, CPU/req %s; streamed: added TTFE p50 %s, p99 %s, added TTLE p50 %s, req/s %s\n",
				ratioText(lv.RatioAddedP50), ratioText(lv.RatioAddedP99), ratioText(lv.RatioRPS), ratioText(lv.RatioCPU),
				ratioText(lv.RatioAddedTTFEP50), ratioText(lv.RatioAddedTTFEP99), ratioText(lv.RatioAddedTTLEP50), ratioText(lv.RatioStreamRPS))
		}
		var ng *ProxyPath
		for i := range lv.Paths {
			if lv.Paths[i].Name == "nginx" {
				ng = &lv.Paths[i]
			}
		}
		for _, p := range lv.Paths {
			if p.Session && ng != nil {
				fmt.Fprintf(w, "session path %s: added p50 %.3f ms (%s× nginx's), added TTFE p50 %.3f ms (%s×), %.0f req/s (%s×)\n",
					p.Name, p.AddedP50Ms, ratioText(ratio(p.AddedP50Ms, ng.AddedP50Ms)), p.AddedTTFEP50, ratioText(ratio(p.AddedTTFEP50, ng.AddedTTFEP50)),
					p.RPS, ratioText(ratio(p.RPS, ng.RPS)))
			}
		}
	}
	_, err := fmt.Fprintf(w, "(%.1f s)\n", r.Seconds)
	return err
}

// ratioText is a ratio, or n/a where it is not positive (one of the added
// figures it divides came out at or below zero: noise around direct).
func ratioText(v float64) string {
	if v <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}

func optF2(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

func optF(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func optMiB(v int64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(v)/(1<<20))
}
