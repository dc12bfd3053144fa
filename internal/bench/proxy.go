package bench

// Proxy overhead: the same loopback upstream reached directly, through the
// sidecar and through nginx, under the same bounded load, reported as added
// latency per path and as the sidecar/nginx ratio.

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// MockUpstreamOptions shape the scripted OpenAI-compatible upstream.
type MockUpstreamOptions struct {
	// StreamEvents is how many content chunks a streamed answer has.
	// Zero means 16.
	StreamEvents int
	// EventGap is the pause between two streamed chunks. Zero means none.
	EventGap time.Duration
	// KeepPrompts keeps the last "messages" of each session's chat request
	// (by X-Session-ID) for LastPrompt, and counts the requests without a
	// session (the sidecar's own calls) by model.
	KeepPrompts bool
	// BackgroundReply, when set, answers chat requests without a session
	// (the sidecar's own summary and extraction calls), e.g. "[SKIP]".
	BackgroundReply string
	// Background, when set, answers chat requests without a session with
	// what it returns for their last message (BackgroundReply unused).
	Background func(prompt string) string
}

// ReplyHeader, on a chat request, names the answer the mock gives: its
// value is the reply text, base64url-encoded (the memory benchmark replays
// a recorded conversation this way). Without it the answer is canned.
const ReplyHeader = "X-Bench-Reply"

// MockUpstream is a scripted OpenAI-compatible server for benchmarks and
// demos: /v1/chat/completions (streamed or not), /v1/completions,
// /v1/embeddings and /v1/models, with canned answers.
type MockUpstream struct {
	srv  *fasthttp.Server
	opts MockUpstreamOptions

	// mu protects the fields below.
	mu      sync.Mutex
	prompts map[string][]byte // session → last "messages"
	bgCalls map[string]int    // the model of requests without a session → count
}

// LastPrompt returns the "messages" of the session's last chat request
// (KeepPrompts), nil when none.
func (m *MockUpstream) LastPrompt(session string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.prompts[session]
}

// BackgroundCalls returns the chat requests without a session seen so far
// (KeepPrompts), by model ("" when the request named none).
func (m *MockUpstream) BackgroundCalls() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.bgCalls)
}

// keep records a chat request (KeepPrompts).
func (m *MockUpstream) keep(ctx *fasthttp.RequestCtx) {
	body := ctx.Request.Body()
	session := string(ctx.Request.Header.Peek("X-Session-ID"))
	m.mu.Lock()
	defer m.mu.Unlock()
	if session == "" {
		m.bgCalls[gjson.GetBytes(body, "model").String()]++
		return
	}
	m.prompts[session] = []byte(gjson.GetBytes(body, "messages").Raw)
}

// NewMockUpstream returns a mock; serve it with Serve.
func NewMockUpstream(o MockUpstreamOptions) *MockUpstream {
	if o.StreamEvents == 0 {
		o.StreamEvents = 16
	}
	m := &MockUpstream{opts: o, prompts: map[string][]byte{}, bgCalls: map[string]int{}}
	m.srv = &fasthttp.Server{Handler: m.handle, Name: "mock-upstream"}
	return m
}

// Serve answers on ln until Close.
func (m *MockUpstream) Serve(ln net.Listener) error { return m.srv.Serve(ln) }

// Close stops the mock.
func (m *MockUpstream) Close() error { return m.srv.Shutdown() }

const mockChat = `{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":"This is a canned answer from the kvsidecar mock upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":11,"total_tokens":23}}`

func (m *MockUpstream) handle(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	switch string(ctx.Path()) {
	case "/v1/models", "/models":
		ctx.SetBodyString(`{"object":"list","data":[{"id":"mock","object":"model","created":1700000000,"owned_by":"kvsidecar"}]}`)
	case "/v1/embeddings":
		// One deterministic 8-dim vector per input, from the input's bytes.
		in := gjson.GetBytes(ctx.Request.Body(), "input")
		var texts []string
		if in.IsArray() {
			for _, v := range in.Array() {
				texts = append(texts, v.Raw)
			}
		} else {
			texts = []string{in.Raw}
		}
		var b bytes.Buffer
		b.WriteString(`{"object":"list","model":"mock","data":[`)
		for i, t := range texts {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"object":"embedding","index":%d,"embedding":[`, i)
			h := fnv.New64a()
			for d := 0; d < 8; d++ {
				h.Write([]byte(t))
				if d > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, "%.4f", float64(h.Sum64()%2000)/1000-1)
			}
			b.WriteString(`]}`)
		}
		fmt.Fprintf(&b, `],"usage":{"prompt_tokens":%d,"total_tokens":%d}}`, len(texts), len(texts))
		ctx.SetBody(b.Bytes())
	case "/v1/completions":
		ctx.SetBodyString(`{"id":"cmpl-mock","object":"text_completion","created":1700000000,"model":"mock","choices":[{"index":0,"text":"canned","finish_reason":"stop"}]}`)
	case "/v1/chat/completions":
		if m.opts.KeepPrompts {
			m.keep(ctx)
		}
		if (m.opts.BackgroundReply != "" || m.opts.Background != nil) && len(ctx.Request.Header.Peek("X-Session-ID")) == 0 {
			reply := m.opts.BackgroundReply
			if m.opts.Background != nil {
				msgs := gjson.GetBytes(ctx.Request.Body(), "messages").Array()
				prompt := ""
				if len(msgs) > 0 {
					prompt = msgs[len(msgs)-1].Get("content").String()
				}
				reply = m.opts.Background(prompt)
			}
			content, _ := json.Marshal(reply)
			ctx.SetBodyString(`{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":` +
				string(content) + `},"finish_reason":"stop"}]}`)
			return
		}
		if h := ctx.Request.Header.Peek(ReplyHeader); len(h) > 0 {
			reply, err := base64.RawURLEncoding.DecodeString(string(h))
			if err != nil {
				ctx.SetStatusCode(fasthttp.StatusBadRequest)
				ctx.SetBodyString(`{"error":{"message":"bad X-Bench-Reply","type":"invalid_request_error","code":"bad_reply"}}`)
				return
			}
			content, _ := json.Marshal(string(reply))
			ctx.SetBodyString(`{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":` +
				string(content) + `},"finish_reason":"stop"}]}`)
			return
		}
		if !bytes.Contains(ctx.Request.Body(), []byte(`"stream":true`)) {
			ctx.SetBodyString(mockChat)
			return
		}
		ctx.SetContentType("text/event-stream")
		n, gap := m.opts.StreamEvents, m.opts.EventGap
		// With stream_options.include_usage, a last chunk carries the usage
		// (no choices), as OpenAI's API and vLLM send it; prompt tokens are
		// the body's bytes / 4.
		usage := gjson.GetBytes(ctx.Request.Body(), "stream_options.include_usage").Bool()
		promptTokens := len(ctx.Request.Body()) / 4
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 0; i < n; i++ {
				if i > 0 && gap > 0 {
					time.Sleep(gap)
				}
				fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"mock\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
				if w.Flush() != nil {
					return
				}
			}
			if usage {
				fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"mock\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
					promptTokens, n, promptTokens+n)
			}
			w.WriteString("data: [DONE]\n\n")
			_ = w.Flush()
		})
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetBodyString(`{"error":{"message":"not found","type":"not_found_error","code":"not_found"}}`)
	}
}

// ProxyTarget is one path to the upstream.
type ProxyTarget struct {
	Name string // e.g. direct, sidecar, nginx
	Addr string // host:port
	// MetricsAddr, when set, is scraped for RSS and allocations (the
	// sidecar's /metrics).
	MetricsAddr string
}

// ProxyOptions configure RunProxy.
type ProxyOptions struct {
	// Targets to compare; the one named "direct" is the baseline.
	Targets []ProxyTarget
	// Requests per target for the non-streaming and streaming runs.
	// Zero means 10,000 and 2,000.
	Requests, StreamRequests int
	// Concurrency is the number of clients in flight per run. Zero means 8.
	Concurrency int
	// Rounds interleaves the targets this many times so drift on a shared
	// machine hits every path alike. Zero means 5.
	Rounds int
	// Warmup requests per target before measuring. Zero means 500.
	Warmup int
}

// ProxyPath is the measurements of one target.
type ProxyPath struct {
	Name          string  `json:"name"`
	Requests      int     `json:"requests"`
	Errors        int     `json:"errors"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	AddedP50Ms    float64 `json:"added_p50_ms"`
	AddedP99Ms    float64 `json:"added_p99_ms"`
	StreamTTFEP50 float64 `json:"stream_ttfe_p50_ms"`
	StreamTTFEP99 float64 `json:"stream_ttfe_p99_ms"`
	AddedTTFEP50  float64 `json:"added_ttfe_p50_ms"`
	AddedTTFEP99  float64 `json:"added_ttfe_p99_ms"`
	// Scraped from MetricsAddr, when set.
	AllocsPerRequest float64 `json:"allocs_per_request,omitempty"`
	RSSBeforeBytes   int64   `json:"rss_before_bytes,omitempty"`
	RSSAfterBytes    int64   `json:"rss_after_bytes,omitempty"`
}

// ProxyReport is the outcome of RunProxy.
type ProxyReport struct {
	Concurrency int         `json:"concurrency"`
	Paths       []ProxyPath `json:"paths"`
	// Ratios of the sidecar's added latency to nginx's (when both ran).
	RatioAddedP50     float64 `json:"ratio_sidecar_nginx_added_p50,omitempty"`
	RatioAddedP99     float64 `json:"ratio_sidecar_nginx_added_p99,omitempty"`
	RatioAddedTTFEP50 float64 `json:"ratio_sidecar_nginx_added_ttfe_p50,omitempty"`
	RatioAddedTTFEP99 float64 `json:"ratio_sidecar_nginx_added_ttfe_p99,omitempty"`
}

var (
	proxyChatBody   = []byte(`{"model":"mock","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say something short."}]}`)
	proxyStreamBody = []byte(`{"model":"mock","stream":true,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say something short."}]}`)
)

// RunProxy measures every target with the same load.
func RunProxy(o ProxyOptions) (ProxyReport, error) {
	if o.Requests == 0 {
		o.Requests = 10_000
	}
	if o.StreamRequests == 0 {
		o.StreamRequests = 2_000
	}
	if o.Concurrency == 0 {
		o.Concurrency = 8
	}
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	if o.Warmup == 0 {
		o.Warmup = 500
	}
	if len(o.Targets) == 0 {
		return ProxyReport{}, errors.New("bench: proxy: no targets")
	}
	type acc struct {
		lat, ttfe []time.Duration
		errs      int
		mallocs0  float64
		rss0      int64
	}
	accs := make([]acc, len(o.Targets))
	clients := make([]*fasthttp.HostClient, len(o.Targets))
	for i, t := range o.Targets {
		clients[i] = &fasthttp.HostClient{Addr: t.Addr, MaxConns: o.Concurrency * 2, StreamResponseBody: true, ReadTimeout: 30 * time.Second}
		_, errs := proxyLoad(clients[i], proxyChatBody, o.Warmup, o.Concurrency, false)
		if errs == o.Warmup {
			return ProxyReport{}, fmt.Errorf("bench: proxy: target %s (%s) answers no request", t.Name, t.Addr)
		}
		if t.MetricsAddr != "" {
			m := scrapeMetrics(t.MetricsAddr)
			accs[i].mallocs0, accs[i].rss0 = m["go_memstats_mallocs_total"], int64(m["process_resident_memory_bytes"])
		}
	}
	for r := 0; r < o.Rounds; r++ {
		for i := range o.Targets {
			lat, errs := proxyLoad(clients[i], proxyChatBody, o.Requests/o.Rounds, o.Concurrency, false)
			accs[i].lat = append(accs[i].lat, lat...)
			accs[i].errs += errs
		}
	}
	rep := ProxyReport{Concurrency: o.Concurrency}
	for i, t := range o.Targets {
		p := ProxyPath{Name: t.Name, Requests: len(accs[i].lat) + accs[i].errs, Errors: accs[i].errs}
		if t.MetricsAddr != "" {
			m := scrapeMetrics(t.MetricsAddr)
			if n := len(accs[i].lat); n > 0 {
				// The scrape itself allocates too; this is an upper bound.
				p.AllocsPerRequest = (m["go_memstats_mallocs_total"] - accs[i].mallocs0) / float64(n)
			}
			p.RSSBeforeBytes, p.RSSAfterBytes = accs[i].rss0, int64(m["process_resident_memory_bytes"])
		}
		rep.Paths = append(rep.Paths, p)
	}
	for r := 0; r < o.Rounds; r++ {
		for i := range o.Targets {
			lat, errs := proxyLoad(clients[i], proxyStreamBody, o.StreamRequests/o.Rounds, o.Concurrency, true)
			accs[i].ttfe = append(accs[i].ttfe, lat...)
			accs[i].errs += errs
		}
	}
	base := -1
	for i, t := range o.Targets {
		p := &rep.Paths[i]
		p.Errors = accs[i].errs
		p.P50Ms, p.P99Ms = percentileMs(accs[i].lat, 0.50), percentileMs(accs[i].lat, 0.99)
		p.StreamTTFEP50, p.StreamTTFEP99 = percentileMs(accs[i].ttfe, 0.50), percentileMs(accs[i].ttfe, 0.99)
		if t.Name == "direct" {
			base = i
		}
	}
	if base >= 0 {
		b := rep.Paths[base]
		for i := range rep.Paths {
			p := &rep.Paths[i]
			p.AddedP50Ms, p.AddedP99Ms = p.P50Ms-b.P50Ms, p.P99Ms-b.P99Ms
			p.AddedTTFEP50, p.AddedTTFEP99 = p.StreamTTFEP50-b.StreamTTFEP50, p.StreamTTFEP99-b.StreamTTFEP99
		}
	}
	var sc, ng *ProxyPath
	for i := range rep.Paths {
		switch rep.Paths[i].Name {
		case "sidecar":
			sc = &rep.Paths[i]
		case "nginx":
			ng = &rep.Paths[i]
		}
	}
	if sc != nil && ng != nil {
		rep.RatioAddedP50 = ratio(sc.AddedP50Ms, ng.AddedP50Ms)
		rep.RatioAddedP99 = ratio(sc.AddedP99Ms, ng.AddedP99Ms)
		rep.RatioAddedTTFEP50 = ratio(sc.AddedTTFEP50, ng.AddedTTFEP50)
		rep.RatioAddedTTFEP99 = ratio(sc.AddedTTFEP99, ng.AddedTTFEP99)
	}
	return rep, nil
}

// proxyLoad sends n requests from conc clients and returns each latency:
// to the whole response, or for streams to the first complete event.
func proxyLoad(c *fasthttp.HostClient, body []byte, n, conc int, stream bool) ([]time.Duration, int) {
	var (
		mu    sync.Mutex
		lat   = make([]time.Duration, 0, n)
		errs  int
		wg    sync.WaitGroup
		next  = make(chan struct{}, n)
		first = []byte("\n\n")
	)
	for i := 0; i < n; i++ {
		next <- struct{}{}
	}
	close(next)
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			buf := make([]byte, 32<<10)
			for range next {
				req.Reset()
				req.SetRequestURI("http://" + c.Addr + "/v1/chat/completions")
				req.Header.SetMethod(fasthttp.MethodPost)
				req.Header.SetContentType("application/json")
				req.Header.Set("Authorization", "Bearer bench")
				req.SetBody(body)
				t0 := time.Now()
				err := c.Do(req, resp)
				var d time.Duration
				if err == nil && resp.StatusCode() != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode())
				}
				if err == nil {
					// Read until the first event (streams) or the end.
					var got []byte
					r := resp.BodyStream()
					for r != nil {
						k, rerr := r.Read(buf)
						got = append(got, buf[:k]...)
						if stream && d == 0 && bytes.Contains(got, first) {
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
					if err == nil && stream && !bytes.Contains(got, []byte("[DONE]")) {
						err = errors.New("stream without [DONE]")
					}
					_ = resp.CloseBodyStream()
				}
				mu.Lock()
				if err != nil {
					errs++
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lat, errs
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

// WriteProxyTable prints the report for humans.
func WriteProxyTable(w io.Writer, r ProxyReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "path\trequests\terrors\tp50 ms\tp99 ms\tadded p50\tadded p99\tTTFE p50\tTTFE p99\tadded TTFE p50\tadded TTFE p99\tallocs/req\tRSS before\tRSS after\t\n")
	for _, p := range r.Paths {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s\t%s\t\n",
			p.Name, p.Requests, p.Errors, p.P50Ms, p.P99Ms, p.AddedP50Ms, p.AddedP99Ms,
			p.StreamTTFEP50, p.StreamTTFEP99, p.AddedTTFEP50, p.AddedTTFEP99,
			optF(p.AllocsPerRequest), optMiB(p.RSSBeforeBytes), optMiB(p.RSSAfterBytes))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.RatioAddedP50 > 0 || r.RatioAddedP99 > 0 {
		_, err := fmt.Fprintf(w, "\nsidecar/nginx added latency: p50 %.2f, p99 %.2f; streaming time to first event: p50 %.2f, p99 %.2f (concurrency %d)\n",
			r.RatioAddedP50, r.RatioAddedP99, r.RatioAddedTTFEP50, r.RatioAddedTTFEP99, r.Concurrency)
		return err
	}
	return nil
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
