package proxy

// The engine's real context, counted in the engine's tokens. Memory counts
// with tiktoken (cl100k by default); an engine counts with its own
// tokenizer, often more tokens for the same text (a byte-level vocabulary
// counts about five times as many), and its context may be far smaller
// than --window-tokens (a llama.cpp slot holds -c / -np tokens). ctxLimits
// learns, per model, the context the engine states and the ratio of its
// counts to ours, and gives memory the window that fits:
//
//   - stated: llama.cpp's /props (default_generation_settings.n_ctx: one
//     slot's context), /v1/models (vLLM's max_model_len, llama.cpp's
//     meta.n_ctx, context_length), Ollama's /api/ps (context_length of each
//     loaded model; 4,096 before), probed off the request path at start
//     and again when stale;
//   - the ratio: /tokenize of a calibration text (llama.cpp, vLLM), then
//     every answer's prompt tokens (usage, llama.cpp timings) over what
//     memory counted for the same window — raised at once, lowered slowly;
//   - errors: an upstream answer that says the context was exceeded
//     (llama.cpp exceed_context_size_error with n_ctx and n_prompt_tokens,
//     OpenAI/vLLM context_length_exceeded / "maximum context length is N",
//     SGLang's "longer than the model's context length") gives both, and the
//     proxy retries that turn once with a window built for it.
//
// What the window may hold is the context less the reply's room (the
// client's max_tokens, else a small reserve) and a margin, divided by the
// ratio. --window-tokens stays a ceiling (memory's own limit).

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/jsonscan"
)

const (
	// ctxMargin multiplies the learned ratio: chat templates, special
	// tokens and text the calibration did not cover cost a little more.
	ctxMargin = 1.10
	// ctxTemplateTokens are engine tokens kept for the chat template's
	// framing beyond what the ratio covers.
	ctxTemplateTokens = 32
	// ctxReserveMax bounds the reply's room when the client names no
	// max_tokens; ctxReserveShare is the share of the context it may take.
	ctxReserveMax   = 256
	ctxReserveShare = 8
	// ctxProbeEvery is how often a stated context is looked up again
	// (engines restart with other settings); ctxProbeRetry after a failed
	// probe.
	ctxProbeEvery = 5 * time.Minute
	ctxProbeRetry = 30 * time.Second
	// ollamaDefaultCtx is Ollama's context for a model it has not loaded
	// (its default on small machines; larger ones get more, learned from
	// /api/ps once the model is loaded).
	ollamaDefaultCtx = 4096
	// ctxProbeTimeout bounds one probe request.
	ctxProbeTimeout = 5 * time.Second
)

// engineCtx is what is known of one model's context; zero fields are
// unknown.
type engineCtx struct {
	nCtx  int     // engine tokens one request may hold
	ratio float64 // engine tokens per token memory counts
	cap   int     // a ceiling in memory's tokens, from an error that stated no numbers
}

// ctxLimits is the per-model view of the engine's context. Safe for
// concurrent use; probes run on goroutines it owns (close waits for them).
type ctxLimits struct {
	root   string // the upstream's root URL: scheme, host and base path, no /v1
	client *http.Client
	log    *slog.Logger
	// count is memory's token counter (model "" is its default encoding).
	count   func(ctx context.Context, model, text string) (int, error)
	stop    context.Context
	noProbe bool // Options.NoContextProbe

	wg sync.WaitGroup
	// mu protects the fields below.
	mu       sync.Mutex
	server   engineCtx             // from /props and /tokenize: the server's one model
	models   map[string]*engineCtx // by request model name
	probing  bool
	closed   bool // close began: no probe starts
	probedAt time.Time
	probeOK  bool
}

func newCtxLimits(base *url.URL, count func(ctx context.Context, model, text string) (int, error), stop context.Context, log *slog.Logger) *ctxLimits {
	root := url.URL{Scheme: base.Scheme, Host: base.Host, Path: base.Path}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: ctxProbeTimeout}).DialContext,
		MaxIdleConnsPerHost: 1,
		// Below the 5 s after which llama-server and uvicorn close idle
		// keep-alive connections.
		IdleConnTimeout: time.Second,
	}
	return &ctxLimits{root: strings.TrimRight(root.String(), "/"), client: &http.Client{Transport: tr, Timeout: ctxProbeTimeout},
		log: log, count: count, stop: stop, models: map[string]*engineCtx{}}
}

// windowFor returns the window limit, in memory's tokens, that fits the
// engine for a request of model whose reply may take maxTokens (0: not
// named); 0 when the engine's context is unknown. It never blocks: a stale
// or missing view starts a probe in the background.
func (c *ctxLimits) windowFor(model string, maxTokens int) int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	e := c.server
	if m := c.models[model]; m != nil {
		if m.nCtx > 0 {
			e.nCtx = m.nCtx
		}
		if m.ratio > 0 {
			e.ratio = max(e.ratio, m.ratio)
		}
		e.cap = m.cap
	}
	c.kickLocked()
	c.mu.Unlock()
	return e.limit(maxTokens)
}

// limit is the window for a reply of maxTokens (see windowFor).
func (e engineCtx) limit(maxTokens int) int {
	l := 0
	if e.nCtx > 0 {
		reserve := min(ctxReserveMax, e.nCtx/ctxReserveShare)
		if maxTokens > 0 {
			reserve = min(maxTokens, e.nCtx/2)
		}
		ratio := e.ratio
		if ratio <= 0 {
			ratio = 1 // unknown until the first answer or error tells
		}
		l = int(float64(e.nCtx-reserve-ctxTemplateTokens) / (ratio * ctxMargin))
		l = max(l, 1)
	}
	if e.cap > 0 && (l == 0 || e.cap < l) {
		l = e.cap
	}
	return l
}

// kickLocked starts a probe when the view is stale. Called with c.mu held.
func (c *ctxLimits) kickLocked() {
	if c.probing || c.noProbe || c.closed || c.stop.Err() != nil {
		return
	}
	every := ctxProbeEvery
	if !c.probeOK {
		every = ctxProbeRetry
	}
	if !c.probedAt.IsZero() && time.Since(c.probedAt) < every {
		return
	}
	c.probing = true
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ok := c.probe()
		c.mu.Lock()
		c.probing, c.probedAt, c.probeOK = false, time.Now(), ok
		c.mu.Unlock()
	}()
}

// start probes once in the background (at start-up).
func (c *ctxLimits) start() {
	c.mu.Lock()
	c.kickLocked()
	c.mu.Unlock()
}

// close waits for a probe in flight (it stops with the stop context); no
// probe starts after it. Marking closed under mu orders every probe
// started before (its wg.Add is under mu) before the wait: Serve may
// start the first probe while Shutdown closes.
func (c *ctxLimits) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
	c.client.CloseIdleConnections()
}

// calibrationText is prose, code and numbers, the mix a chat holds, for
// the ratio of the engine's token counts to memory's.
const calibrationText = `The meeting moved to Thursday, 14 March 2025, at 09:30 in room B-204; bring the Q3 figures (revenue up 7.4%, churn 2.1%).
She said: "I'd rather walk — it's only 2 km, and the café near the station opens at 7." He laughed, then checked the timetable again.
func (h *Hub) serve(ctx *RequestCtx) { if err := h.route(ctx); err != nil { log.Printf("route: %v", err) } }
SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY name LIMIT 20;
Remember: my sister Lena moved to Porto last spring, and her dog Comet loves the beach at Matosinhos.
Die Katze schläft auf dem Sofa. 東京は今日晴れです。 Ça va très bien, merci !`

// probe asks the upstream for its context (/props, /v1/models) and its
// tokenizer's counts (/tokenize). It reports whether anything was learned.
func (c *ctxLimits) probe() bool {
	ctx, cancel := context.WithTimeout(c.stop, 3*ctxProbeTimeout)
	defer cancel()
	var (
		server = engineCtx{}
		models = map[string]int{}
		ok     bool
	)
	if b, err := c.get(ctx, "/props"); err == nil {
		for _, path := range []string{"default_generation_settings.n_ctx", "n_ctx"} {
			if n := gjson.GetBytes(b, path).Int(); n > 0 {
				server.nCtx, ok = int(n), true
				break
			}
		}
	}
	var firstModel string
	if b, err := c.get(ctx, "/v1/models"); err == nil {
		gjson.GetBytes(b, "data").ForEach(func(_, m gjson.Result) bool {
			id := m.Get("id").String()
			if firstModel == "" {
				firstModel = id
			}
			for _, path := range []string{"max_model_len", "meta.n_ctx", "context_length", "context_window", "max_context_length"} {
				if n := m.Get(path).Int(); n > 0 {
					models[id], ok = int(n), true
					break
				}
			}
			return true
		})
	}
	// Ollama: the context it allocated to each loaded model (/api/ps
	// context_length); one not loaded yet gets its default, 4,096, until
	// it is (Ollama truncates a longer prompt silently instead of refusing
	// it, so no error would tell).
	if b, err := c.get(ctx, "/api/version"); err == nil && gjson.GetBytes(b, "version").Exists() {
		server.nCtx, ok = ollamaDefaultCtx, true
		if b, err := c.get(ctx, "/api/ps"); err == nil {
			gjson.GetBytes(b, "models").ForEach(func(_, m gjson.Result) bool {
				if n := m.Get("context_length").Int(); n > 0 {
					for _, name := range []string{m.Get("name").String(), m.Get("model").String()} {
						if name != "" {
							models[name] = int(n)
						}
					}
				}
				return true
			})
		}
	}
	if r := c.calibrate(ctx, firstModel); r > 0 {
		server.ratio, ok = r, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if server.nCtx > 0 {
		c.server.nCtx = server.nCtx
	}
	if server.ratio > 0 {
		c.server.ratio = max(c.server.ratio, server.ratio)
	}
	for id, n := range models {
		m := c.modelLocked(id)
		m.nCtx = n
	}
	if len(models) == 1 && c.server.nCtx == 0 {
		for _, n := range models {
			c.server.nCtx = n // one model served: its context is the server's
		}
	}
	return ok
}

// calibrate returns the engine's tokens per memory token on the
// calibration text, from the upstream's /tokenize; 0 when it has none.
func (c *ctxLimits) calibrate(ctx context.Context, model string) float64 {
	ours, err := c.count(ctx, "", calibrationText)
	if err != nil || ours <= 0 {
		return 0
	}
	// llama.cpp reads "content", vLLM "prompt" and "model".
	body, _ := json.Marshal(map[string]any{"content": calibrationText, "prompt": calibrationText, "model": model, "add_special_tokens": false})
	b, err := c.post(ctx, "/tokenize", body)
	if err != nil {
		return 0
	}
	n := gjson.GetBytes(b, "count").Int()
	if n <= 0 {
		n = gjson.GetBytes(b, "tokens.#").Int()
	}
	if n <= 0 {
		return 0
	}
	return float64(n) / float64(ours)
}

func (c *ctxLimits) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.root+path, nil)
	if err != nil {
		return nil, err
	}
	return c.do(req)
}

func (c *ctxLimits) post(ctx context.Context, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.root+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return c.do(req)
}

// ProbeUserAgent is the User-Agent of the sidecar's context probes, so
// an upstream's logs (and scripted upstreams in tests) can tell them apart.
const ProbeUserAgent = engine.ProbeUserAgent

func (c *ctxLimits) do(req *http.Request) ([]byte, error) {
	req.Header.Set("User-Agent", ProbeUserAgent)
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || !jsonscan.Valid(b) {
		return nil, errProbe
	}
	return b, nil
}

var errProbe = &probeError{}

type probeError struct{}

func (*probeError) Error() string { return "proxy: probe answered no usable JSON" }

func (c *ctxLimits) modelLocked(model string) *engineCtx {
	m := c.models[model]
	if m == nil {
		if len(c.models) >= maxCtxModels {
			clear(c.models) // names come from clients: bounded
		}
		m = &engineCtx{}
		c.models[model] = m
	}
	return m
}

// maxCtxModels bounds the models tracked.
const maxCtxModels = 1024

// observe learns from an answer to a window memory counted at ours tokens
// that the engine counted engine tokens (its prompt tokens).
func (c *ctxLimits) observe(model string, ours, engine int) {
	if c == nil || ours < 64 || engine <= 0 {
		return // too short a window to say much of the ratio
	}
	r := float64(engine) / float64(ours)
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.modelLocked(model)
	// Only up, and only past a step: an underestimate costs a failed
	// request, and a limit that moved with every answer would move the
	// history budget, and so evict, at random (the prompt's start, and
	// the engine's prefix cache, would move with it).
	if r > m.ratio*1.02 {
		m.ratio = r
	}
}

// ctxError is what an upstream answer says of an exceeded context.
type ctxError struct {
	nCtx    int // the context it states; 0 when it does not say
	nPrompt int // the prompt tokens it counted; 0 when it does not say
}

var (
	reLlamaCtx = regexp.MustCompile(`request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)`)
	reMaxCtx   = regexp.MustCompile(`maximum context length is (\d+) tokens`)
	// The prompt's tokens, best first (vLLM's "requested" counts the reply).
	reMsgTokens = []*regexp.Regexp{regexp.MustCompile(`(\d+) in the messages`), regexp.MustCompile(`messages resulted in (\d+) tokens`),
		regexp.MustCompile(`you requested (\d+) tokens`)}
	reSGLangCtx  = regexp.MustCompile(`input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)`)
	ctxErrorKeys = []string{"exceed_context_size_error", "context_length_exceeded", "maximum context length", "context length", "context size", "too many tokens", "prompt is too long"}
)

// parseContextError reports whether an upstream error answer (status,
// body) says the request exceeded the model's context, and what it states.
func parseContextError(status int, body []byte) (ctxError, bool) {
	if status != http.StatusBadRequest && status != http.StatusRequestEntityTooLarge && status != http.StatusUnprocessableEntity {
		return ctxError{}, false
	}
	if len(body) > 64<<10 {
		body = body[:64<<10]
	}
	lower := strings.ToLower(string(body))
	hit := false
	for _, k := range ctxErrorKeys {
		if strings.Contains(lower, k) {
			hit = true
			break
		}
	}
	if !hit {
		return ctxError{}, false
	}
	var e ctxError
	e.nCtx = int(gjson.GetBytes(body, "error.n_ctx").Int())
	e.nPrompt = int(gjson.GetBytes(body, "error.n_prompt_tokens").Int())
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	if m := reLlamaCtx.FindStringSubmatch(lower); m != nil {
		e.nPrompt, e.nCtx = atoi(m[1]), atoi(m[2])
	}
	if m := reSGLangCtx.FindStringSubmatch(lower); m != nil {
		e.nPrompt, e.nCtx = atoi(m[1]), atoi(m[2])
	}
	if m := reMaxCtx.FindStringSubmatch(lower); m != nil && e.nCtx == 0 {
		e.nCtx = atoi(m[1])
	}
	for _, re := range reMsgTokens {
		if m := re.FindStringSubmatch(lower); m != nil && e.nPrompt == 0 {
			e.nPrompt = atoi(m[1])
		}
	}
	return e, true
}

// learnError takes what a context error said about a window memory counted
// at ours tokens: the context, the ratio, or (when it stated neither) a
// ceiling three quarters of that window. A probe follows: the engine may
// have restarted with another context.
func (c *ctxLimits) learnError(model string, e ctxError, ours int) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.modelLocked(model)
	if e.nCtx > 0 {
		m.nCtx = e.nCtx
	}
	if e.nPrompt > 0 && ours > 0 {
		m.ratio = max(m.ratio, float64(e.nPrompt)/float64(ours))
	}
	if e.nCtx == 0 || e.nPrompt == 0 {
		m.cap = max(1, ours*3/4)
	}
	c.probedAt = time.Time{}
	c.kickLocked()
}

// view returns the merged view of model, for logs and tests.
func (c *ctxLimits) view(model string) engineCtx {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.server
	if m := c.models[model]; m != nil {
		if m.nCtx > 0 {
			e.nCtx = m.nCtx
		}
		e.ratio = max(e.ratio, m.ratio)
		e.cap = m.cap
	}
	return e
}
