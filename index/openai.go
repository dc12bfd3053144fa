package index

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// OpenAIOptions configure an OpenAIEmbedder. Every zero value selects the
// documented default (NewOpenAIEmbedder applies EnsureDefaults and
// Validate); BaseURL is required.
type OpenAIOptions struct {
	// BaseURL of the server, with or without the "/v1" suffix:
	// "http://127.0.0.1:8000" and "https://api.openai.com/v1" both work.
	// Required.
	BaseURL string
	// APIKey is sent as a bearer token when not empty.
	APIKey string
	// Model is the embedding model name. Empty leaves the field out of the
	// request, so a server serving one model (llama.cpp's llama-server,
	// vLLM) uses its own; OpenAI and Ollama need it.
	Model string
	// Dim is the expected dimension; responses of another dimension fail.
	// 0 accepts the dimension of the first response and follows the
	// server when it changes (see OpenAIEmbedder).
	Dim int

	// MaxBatch is the most texts per request; 0 selects 64.
	MaxBatch int
	// MaxBatchBytes is the most text bytes per request (a longer text
	// goes alone); 0 selects 256 KiB.
	MaxBatchBytes int
	// MaxInputBytes is where each text is cut (at a character boundary)
	// before it is sent; 0 selects 32 KiB. The embedder lowers it on its
	// own when the server answers that an input is too large (llama.cpp
	// refuses inputs longer than its physical batch, -ub, 512 tokens by
	// default), down to 64 bytes; the cache still keys the whole text.
	MaxInputBytes int

	// CacheSize is the number of embeddings kept, keyed by a SHA-256 of
	// model and text, least recently used evicted; 0 selects 4096,
	// negative disables the cache.
	CacheSize int
	// CacheBytes bounds the cache's vectors (4 bytes a dimension plus about
	// 100 bytes an entry) together with CacheSize; 0 selects 64 MiB.
	CacheBytes int64

	// Timeout bounds each request; 0 selects 10 s. Callers bound the whole
	// call with their context (Index.Options.QueryTimeout for a query).
	Timeout time.Duration
	// Retries is how many more times a request is sent after a failed
	// connection, a timeout, a 429 or a 5xx (not one saying the input is
	// too large), with a backoff of Backoff, doubling; 0 selects 2,
	// negative none. A request that failed on a reused keep-alive
	// connection the server had closed is sent again at once (requests
	// are replayable: embedding changes nothing on the server).
	Retries int
	// Backoff is the first retry delay; 0 selects 100 ms.
	Backoff time.Duration
	// Cooldown: after a call failed for the server's sake, calls that need
	// the server fail at once (ErrEmbed, nothing sent) for Cooldown,
	// doubling with each failure in a row up to 32×, so a dead endpoint
	// costs a client turn nothing and the server is asked at most about
	// once per Cooldown; 0 selects 1 s, negative disables.
	Cooldown time.Duration

	// Client sends the requests; nil selects a client whose idle
	// keep-alive connections close after 2 s (llama-server, vLLM and
	// SGLang close theirs after 5 s).
	Client *http.Client
	// MaxResponseBytes bounds a response body; 0 selects 64 MiB.
	MaxResponseBytes int64
	// Logger receives one warning when the endpoint starts failing, one
	// when it answers again and one when its vector space changes; nil
	// discards them.
	Logger *slog.Logger
	// Now is the clock of the cooldown; nil selects time.Now.
	Now func() time.Time
}

// minInputBytes is the shortest MaxInputBytes the embedder lowers itself
// to: below it an input refused as "too large" is not a length problem.
const minInputBytes = 64

// EnsureDefaults fills every zero field with its documented default (and
// raises MaxInputBytes to 64) and returns o. NewOpenAIEmbedder calls it;
// calling it twice changes nothing.
func (o *OpenAIOptions) EnsureDefaults() *OpenAIOptions {
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defInt(&o.MaxBatch, 64)
	defInt(&o.MaxBatchBytes, 256<<10)
	defInt(&o.MaxInputBytes, 32<<10)
	if o.MaxInputBytes > 0 {
		o.MaxInputBytes = max(o.MaxInputBytes, minInputBytes)
	}
	defInt(&o.CacheSize, 4096)
	if o.CacheBytes == 0 {
		o.CacheBytes = 64 << 20
	}
	defDur(&o.Timeout, 10*time.Second)
	defInt(&o.Retries, 2)
	defDur(&o.Backoff, 100*time.Millisecond)
	defDur(&o.Cooldown, time.Second)
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 64 << 20
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 8,
			IdleConnTimeout:     2 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
		}}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Validate checks options after EnsureDefaults; its errors match ErrInvalid.
func (o *OpenAIOptions) Validate() error {
	if o.BaseURL == "" {
		return fmt.Errorf("index: openai embedder: BaseURL is required: %w", ErrInvalid)
	}
	if !strings.HasPrefix(o.BaseURL, "http://") && !strings.HasPrefix(o.BaseURL, "https://") {
		return fmt.Errorf("index: openai embedder: BaseURL %q is not http(s): %w", o.BaseURL, ErrInvalid)
	}
	switch {
	case o.Dim < 0:
		return fmt.Errorf("index: openai embedder: Dim %d: %w", o.Dim, ErrInvalid)
	case o.MaxBatch < 0, o.MaxBatchBytes < 0, o.MaxInputBytes < 0, o.CacheBytes < 0, o.Timeout < 0, o.Backoff < 0:
		return fmt.Errorf("index: openai embedder: negative batch, input, cache or time bound: %w", ErrInvalid)
	}
	return nil
}

// OpenAIEmbedder calls an OpenAI-compatible POST /v1/embeddings endpoint
// (OpenAI, vLLM, llama.cpp server, Ollama, TGI). Safe for concurrent use.
// Returned vectors may be shared with the cache: callers must not modify
// them (Index copies).
//
//   - Batching: the texts of one Embed call go in requests of at most
//     MaxBatch texts and MaxBatchBytes bytes. Texts of different calls are
//     never sent in one request, so a request carries one caller's texts
//     (memory embeds one session's, or one end user's, at a time).
//   - Caching: vectors are kept by a hash of model and text (bounded by
//     CacheSize and CacheBytes), and a text another call is fetching is
//     waited for, not sent again: the same text is embedded once.
//   - Failures: requests are retried (Retries), then the call fails with
//     ErrEmbed and the endpoint cools down (Cooldown): callers fall back
//     to words (memory does) and are not delayed by a dead server.
//   - The vector space: the server's model name (from the answers) and
//     the dimension. When the server starts answering in another space (it
//     was restarted with another model), the embedder follows it: the cache
//     is dropped, one warning is logged, and EmbedSpace names the new
//     space, so an Index re-embeds its documents instead of comparing
//     vectors of two models. With Options.Dim set, another dimension is an
//     error instead.
type OpenAIEmbedder struct {
	url string
	o   OpenAIOptions

	mu sync.Mutex
	// mu protects the fields below.
	dim      int
	space    string // "" until the first answer
	gen      uint64 // incremented with every change of space
	inputCap int    // texts are cut to this many bytes
	lru      *list.List
	items    map[[32]byte]*list.Element
	bytes    int64 // of the cached vectors
	flights  map[[32]byte]*flight
	// cooldown state
	down      bool
	downUntil time.Time
	failures  int // failed calls in a row
	st        EmbedderStats
}

type cacheItem struct {
	key [32]byte
	vec []float32
}

// cacheItemBytes is what an entry costs beside its vector (key, list
// element, map slot), roughly.
const cacheItemBytes = 100

// flight is a text being fetched by one call, which others wait for.
type flight struct {
	done chan struct{}
	vec  []float32
	err  error
}

// EmbedderStats are an OpenAIEmbedder's cumulative counters.
type EmbedderStats struct {
	Calls     int64 // Embed calls
	Failures  int64 // Embed calls that failed (fast failures included)
	FastFails int64 // of Failures: refused during a cooldown, nothing sent
	Requests  int64 // HTTP requests sent, retries included
	Retries   int64 // requests sent again after a failure
	Texts     int64 // texts asked for
	CacheHits int64 // texts answered from the cache or another call's request
	Embedded  int64 // texts the server embedded
	Truncated int64 // texts cut to the input limit before sending
	// SpaceChanges counts changes of the server's vector space (model or
	// dimension) after the first answer.
	SpaceChanges int64
	// RequestSeconds is the time spent in requests (retries included).
	RequestSeconds float64
	CacheEntries   int
	CacheBytes     int64
	Dim            int    // the current dimension (0: not known yet)
	Space          string // the current vector space ("" not known yet)
	InputCap       int    // the current input limit in bytes
	Down           bool   // in a cooldown now
}

// HTTPError is a non-2xx answer from the embeddings endpoint.
type HTTPError struct {
	StatusCode int
	Message    string // the OpenAI-style error message, or the start of the body
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("status %d: %s", e.StatusCode, e.Message)
}

// errSpaceMoved: the server's vector space changed during a call; the call
// starts again (EmbedSpace).
var errSpaceMoved = errors.New("index: embedding space changed during the call")

// NewOpenAIEmbedder checks o and returns the client; it sends nothing.
func NewOpenAIEmbedder(o OpenAIOptions) (*OpenAIEmbedder, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	base := strings.TrimRight(o.BaseURL, "/")
	if !strings.HasSuffix(base, "/v1") {
		base += "/v1"
	}
	return &OpenAIEmbedder{
		url:      base + "/embeddings",
		o:        o,
		dim:      o.Dim,
		inputCap: o.MaxInputBytes,
		lru:      list.New(),
		items:    make(map[[32]byte]*list.Element),
		flights:  make(map[[32]byte]*flight),
	}, nil
}

// Name returns "openai:<model>" ("openai:" + "upstream" when Model is
// empty), with ":d<Dim>" when Dim is set. It names the configuration; the
// vector space the server answers in is Space.
func (e *OpenAIEmbedder) Name() string {
	m := e.o.Model
	if m == "" {
		m = "upstream"
	}
	if e.o.Dim > 0 {
		return fmt.Sprintf("openai:%s:d%d", m, e.o.Dim)
	}
	return "openai:" + m
}

// Dim returns the dimension: Options.Dim, else the one of the latest
// answer, else 0.
func (e *OpenAIEmbedder) Dim() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.dim
}

// Space names the vector space of the latest answer ("<model>/d<dim>"),
// "" before the first.
func (e *OpenAIEmbedder) Space() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.space
}

// Stats returns the counters.
func (e *OpenAIEmbedder) Stats() EmbedderStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.st
	s.CacheEntries, s.CacheBytes = e.lru.Len(), e.bytes
	s.Dim, s.Space, s.InputCap, s.Down = e.dim, e.space, e.inputCap, e.down
	return s
}

// Probe embeds a fixed text that holds nothing of any user, bypassing the
// cache and the cooldown, so the embedder learns the server's vector space
// (Dim, Space) before the first index is loaded: Load then refuses a
// persisted index of another space.
func (e *OpenAIEmbedder) Probe(ctx context.Context) error {
	e.mu.Lock()
	gen := e.gen
	e.mu.Unlock()
	_, err := e.fetchBatch(ctx, gen, []string{"kvsidecar embeddings probe"})
	if errors.Is(err, errSpaceMoved) {
		err = nil // learned the new space
	}
	e.settle(ctx, err)
	return err
}

// Close closes the client's idle connections; the embedder stays usable.
func (e *OpenAIEmbedder) Close() error {
	e.o.Client.CloseIdleConnections()
	return nil
}

func (e *OpenAIEmbedder) key(text string) [32]byte {
	h := sha256.New()
	h.Write([]byte(e.o.Model))
	h.Write([]byte{0})
	h.Write([]byte(text))
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// Embed returns one vector per text, from the cache or the server.
func (e *OpenAIEmbedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	v, _, err := e.EmbedSpace(ctx, texts)
	return v, err
}

// EmbedSpace is Embed that also names the vector space every returned
// vector is in (see SpaceEmbedder).
func (e *OpenAIEmbedder) EmbedSpace(ctx context.Context, texts []string) ([][]float32, string, error) {
	e.mu.Lock()
	e.st.Calls++
	e.st.Texts += int64(len(texts))
	e.mu.Unlock()
	var err error
	for range 3 {
		var out [][]float32
		var space string
		out, space, err = e.embedOnce(ctx, texts)
		if err == nil {
			return out, space, nil
		}
		if !errors.Is(err, errSpaceMoved) {
			break
		}
	}
	e.mu.Lock()
	e.st.Failures++
	e.mu.Unlock()
	if errors.Is(err, errSpaceMoved) {
		err = fmt.Errorf("index: embeddings POST %s: the server's vector space keeps changing: %w", e.url, ErrEmbed)
	}
	return nil, "", err
}

// pending is a distinct text of one call that is not cached.
type pending struct {
	key  [32]byte
	text string
	idx  []int // positions in the call's texts
	f    *flight
}

// embedOnce answers texts within one generation of the vector space; it
// returns errSpaceMoved when the space changed meanwhile.
func (e *OpenAIEmbedder) embedOnce(ctx context.Context, texts []string) ([][]float32, string, error) {
	out := make([][]float32, len(texts))
	byKey := make(map[[32]byte]*pending)
	var mine, theirs []*pending
	e.mu.Lock()
	gen := e.gen
	for i, t := range texts {
		k := e.key(t)
		if p := byKey[k]; p != nil {
			p.idx = append(p.idx, i)
			continue
		}
		if el, ok := e.items[k]; ok {
			e.lru.MoveToFront(el)
			out[i] = el.Value.(*cacheItem).vec
			e.st.CacheHits++
			continue
		}
		p := &pending{key: k, text: t, idx: []int{i}}
		byKey[k] = p
		if f := e.flights[k]; f != nil {
			p.f = f
			theirs = append(theirs, p)
			e.st.CacheHits++
			continue
		}
		p.f = &flight{done: make(chan struct{})}
		e.flights[k] = p.f
		mine = append(mine, p)
	}
	var err error
	if len(mine) > 0 && e.o.Cooldown > 0 && e.down && e.o.Now().Before(e.downUntil) {
		e.st.FastFails++
		err = fmt.Errorf("index: embeddings POST %s: failing, next try in %v: %w", e.url,
			e.downUntil.Sub(e.o.Now()).Round(time.Millisecond), ErrEmbed)
	}
	e.mu.Unlock()

	if err != nil {
		e.land(mine, 0, nil, err)
	} else if len(mine) > 0 {
		err = e.fetchAll(ctx, gen, mine)
		e.settle(ctx, err)
	}
	if err != nil {
		return nil, "", err
	}
	for _, p := range theirs {
		select {
		case <-p.f.done:
		case <-ctx.Done():
			return nil, "", fmt.Errorf("index: embeddings: %w: %w", ErrEmbed, ctx.Err())
		}
		if p.f.err != nil {
			return nil, "", p.f.err
		}
	}
	for _, p := range append(mine, theirs...) {
		for _, i := range p.idx {
			out[i] = p.f.vec
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gen != gen {
		return nil, "", errSpaceMoved
	}
	return out, e.space, nil
}

// fetchAll fetches mine in batches and lands every flight, answered or
// failed.
func (e *OpenAIEmbedder) fetchAll(ctx context.Context, gen uint64, mine []*pending) error {
	e.mu.Lock()
	limit := e.inputCap
	e.mu.Unlock()
	for start := 0; start < len(mine); {
		end, bytes := start, 0
		for end < len(mine) && end-start < e.o.MaxBatch {
			n := min(len(mine[end].text), limit)
			if end > start && bytes+n > e.o.MaxBatchBytes {
				break
			}
			bytes += n
			end++
		}
		batch := mine[start:end]
		texts := make([]string, len(batch))
		for i, p := range batch {
			texts[i] = p.text
		}
		vecs, err := e.fetchBatch(ctx, gen, texts)
		if err != nil {
			e.land(mine[start:], 0, nil, err)
			return err
		}
		e.land(batch, gen, vecs, nil)
		start = end
	}
	return nil
}

// land completes the flights of ps with vecs (cached when the space is
// still generation gen) or err.
func (e *OpenAIEmbedder) land(ps []*pending, gen uint64, vecs [][]float32, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, p := range ps {
		if err != nil {
			p.f.err = err
		} else {
			p.f.vec = vecs[i]
			if e.gen == gen {
				e.put(p.key, vecs[i])
			}
		}
		if e.flights[p.key] == p.f {
			delete(e.flights, p.key)
		}
		close(p.f.done)
	}
}

// settle updates the cooldown after a call that needed the server: a
// success ends it, a failure for the server's sake (not the caller's
// context, not a change of space) starts or lengthens it.
func (e *OpenAIEmbedder) settle(ctx context.Context, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case err == nil || errors.Is(err, errSpaceMoved):
		if e.down {
			e.o.Logger.Info("embeddings endpoint answers again: recall uses its vectors", "url", e.url, "failed_calls", e.failures)
		}
		e.down, e.failures = false, 0
	case ctx.Err() != nil:
		// The caller gave up (a query's deadline, shutdown): says nothing
		// about the server.
	default:
		if !e.down {
			e.o.Logger.Warn("embeddings endpoint failing: recall falls back to words until it answers again", "url", e.url, "err", err)
		}
		e.down = true
		e.failures++
		if e.o.Cooldown > 0 {
			e.downUntil = e.o.Now().Add(e.o.Cooldown << min(e.failures-1, 5))
		}
	}
}

// put caches v; e.mu must be held.
func (e *OpenAIEmbedder) put(k [32]byte, v []float32) {
	if e.o.CacheSize < 0 {
		return
	}
	if el, ok := e.items[k]; ok {
		it := el.Value.(*cacheItem)
		e.bytes += int64(len(v)-len(it.vec)) * 4
		it.vec = v
		e.lru.MoveToFront(el)
	} else {
		e.items[k] = e.lru.PushFront(&cacheItem{key: k, vec: v})
		e.bytes += int64(len(v))*4 + cacheItemBytes
	}
	for e.lru.Len() > e.o.CacheSize || (e.bytes > e.o.CacheBytes && e.lru.Len() > 0) {
		old := e.lru.Back()
		it := old.Value.(*cacheItem)
		e.lru.Remove(old)
		delete(e.items, it.key)
		e.bytes -= int64(len(it.vec))*4 + cacheItemBytes
	}
}

// dropCache empties the cache; e.mu must be held.
func (e *OpenAIEmbedder) dropCache() {
	e.lru.Init()
	clear(e.items)
	e.bytes = 0
}
