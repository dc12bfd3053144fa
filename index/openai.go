package index

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"
)

// OpenAIOptions configure an OpenAIEmbedder.
type OpenAIOptions struct {
	// BaseURL of the server, with or without the "/v1" suffix:
	// "http://127.0.0.1:8000" and "https://api.openai.com/v1" both work.
	// Required.
	BaseURL string
	// APIKey is sent as a bearer token when not empty.
	APIKey string
	// Model is the embedding model name. Required.
	Model string
	// Dim is the expected dimension; responses of another dimension fail.
	// 0 accepts the dimension of the first response and holds to it.
	Dim int
	// MaxBatch is the most texts per request; 0 selects 64.
	MaxBatch int
	// CacheSize is the number of embeddings kept, keyed by a SHA-256 of
	// model and text, least recently used evicted; 0 selects 4096, negative
	// disables the cache.
	CacheSize int
	// Client sends the requests; nil selects a client with a 30 s timeout.
	Client *http.Client
	// MaxResponseBytes bounds a response body; 0 selects 64 MiB.
	MaxResponseBytes int64
}

// OpenAIEmbedder calls an OpenAI-compatible POST /v1/embeddings endpoint
// (OpenAI, vLLM, llama.cpp server, Ollama, TGI). Texts are sent in batches
// of at most MaxBatch; results are cached by content hash, so re-indexing
// unchanged text costs no request. Safe for concurrent use. Returned vectors
// may be shared with the cache: callers must not modify them (Index copies).
type OpenAIEmbedder struct {
	url    string
	o      OpenAIOptions
	client *http.Client

	mu sync.Mutex
	// mu protects the fields below.
	dim   int
	lru   *list.List // of *cacheItem, front = most recent
	items map[[32]byte]*list.Element
}

type cacheItem struct {
	key [32]byte
	vec []float32
}

// HTTPError is a non-2xx answer from the embeddings endpoint.
type HTTPError struct {
	StatusCode int
	Message    string // the OpenAI-style error message, or the start of the body
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("status %d: %s", e.StatusCode, e.Message)
}

// NewOpenAIEmbedder checks o and returns the client; it sends nothing.
func NewOpenAIEmbedder(o OpenAIOptions) (*OpenAIEmbedder, error) {
	if o.BaseURL == "" || o.Model == "" {
		return nil, fmt.Errorf("index: openai embedder: BaseURL and Model are required: %w", ErrInvalid)
	}
	if !strings.HasPrefix(o.BaseURL, "http://") && !strings.HasPrefix(o.BaseURL, "https://") {
		return nil, fmt.Errorf("index: openai embedder: BaseURL %q is not http(s): %w", o.BaseURL, ErrInvalid)
	}
	if o.Dim < 0 {
		return nil, fmt.Errorf("index: openai embedder: Dim %d: %w", o.Dim, ErrInvalid)
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = 64
	}
	if o.MaxBatch < 0 {
		return nil, fmt.Errorf("index: openai embedder: MaxBatch %d: %w", o.MaxBatch, ErrInvalid)
	}
	if o.CacheSize == 0 {
		o.CacheSize = 4096
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 64 << 20
	}
	c := o.Client
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	base := strings.TrimRight(o.BaseURL, "/")
	if !strings.HasSuffix(base, "/v1") {
		base += "/v1"
	}
	return &OpenAIEmbedder{
		url:    base + "/embeddings",
		o:      o,
		client: c,
		dim:    o.Dim,
		lru:    list.New(),
		items:  make(map[[32]byte]*list.Element),
	}, nil
}

// Name returns "openai:<model>" (with ":d<Dim>" when Dim is set).
func (e *OpenAIEmbedder) Name() string {
	if e.o.Dim > 0 {
		return fmt.Sprintf("openai:%s:d%d", e.o.Model, e.o.Dim)
	}
	return "openai:" + e.o.Model
}

// Dim returns the dimension: Options.Dim, else the one of the first
// response, else 0.
func (e *OpenAIEmbedder) Dim() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.dim
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
	out := make([][]float32, len(texts))
	keys := make([][32]byte, len(texts))
	var missing []string // distinct texts to fetch
	where := make(map[[32]byte][]int)
	e.mu.Lock()
	for i, t := range texts {
		keys[i] = e.key(t)
		if el, ok := e.items[keys[i]]; ok {
			e.lru.MoveToFront(el)
			out[i] = el.Value.(*cacheItem).vec
			continue
		}
		if _, ok := where[keys[i]]; !ok {
			missing = append(missing, t)
		}
		where[keys[i]] = append(where[keys[i]], i)
	}
	e.mu.Unlock()
	for start := 0; start < len(missing); start += e.o.MaxBatch {
		batch := missing[start:min(start+e.o.MaxBatch, len(missing))]
		vecs, err := e.fetch(ctx, batch)
		if err != nil {
			return nil, err
		}
		e.mu.Lock()
		for j, v := range vecs {
			k := e.key(batch[j])
			for _, i := range where[k] {
				out[i] = v
			}
			e.put(k, v)
		}
		e.mu.Unlock()
	}
	return out, nil
}

// put caches v; e.mu must be held.
func (e *OpenAIEmbedder) put(k [32]byte, v []float32) {
	if e.o.CacheSize < 0 {
		return
	}
	if el, ok := e.items[k]; ok {
		el.Value.(*cacheItem).vec = v
		e.lru.MoveToFront(el)
		return
	}
	e.items[k] = e.lru.PushFront(&cacheItem{key: k, vec: v})
	for e.lru.Len() > e.o.CacheSize {
		old := e.lru.Back()
		e.lru.Remove(old)
		delete(e.items, old.Value.(*cacheItem).key)
	}
}

type embeddingsRequest struct {
	Model          string   `json:"model"`
	Input          []string `json:"input"`
	EncodingFormat string   `json:"encoding_format"`
}

type embeddingsResponse struct {
	Data []struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
}

// fetch sends one batch and validates the answer.
func (e *OpenAIEmbedder) fetch(ctx context.Context, batch []string) ([][]float32, error) {
	body, err := json.Marshal(embeddingsRequest{Model: e.o.Model, Input: batch, EncodingFormat: "float"})
	if err != nil {
		return nil, fmt.Errorf("index: embeddings request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("index: embeddings request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if e.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+e.o.APIKey)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("index: embeddings POST %s: %w: %w", e.url, ErrEmbed, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, e.o.MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("index: embeddings POST %s: read: %w: %w", e.url, ErrEmbed, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("index: embeddings POST %s: %w: %w", e.url, ErrEmbed, &HTTPError{StatusCode: resp.StatusCode, Message: errorMessage(raw)})
	}
	if int64(len(raw)) > e.o.MaxResponseBytes {
		return nil, fmt.Errorf("index: embeddings POST %s: response over %d bytes: %w", e.url, e.o.MaxResponseBytes, ErrEmbed)
	}
	var r embeddingsResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("index: embeddings POST %s: decode: %w: %w", e.url, ErrEmbed, err)
	}
	if len(r.Data) != len(batch) {
		return nil, fmt.Errorf("index: embeddings POST %s: %d embeddings for %d inputs: %w", e.url, len(r.Data), len(batch), ErrEmbed)
	}
	out := make([][]float32, len(batch))
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, d := range r.Data {
		if d.Index < 0 || d.Index >= len(batch) || out[d.Index] != nil {
			return nil, fmt.Errorf("index: embeddings POST %s: bad or repeated index %d: %w", e.url, d.Index, ErrEmbed)
		}
		if len(d.Embedding) == 0 {
			return nil, fmt.Errorf("index: embeddings POST %s: empty embedding: %w", e.url, ErrEmbed)
		}
		if e.dim == 0 {
			e.dim = len(d.Embedding)
		}
		if len(d.Embedding) != e.dim {
			return nil, fmt.Errorf("index: embeddings POST %s: dimension %d, want %d: %w", e.url, len(d.Embedding), e.dim, ErrEmbed)
		}
		for _, f := range d.Embedding {
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				return nil, fmt.Errorf("index: embeddings POST %s: non-finite value: %w", e.url, ErrEmbed)
			}
		}
		out[d.Index] = d.Embedding
	}
	return out, nil
}

// errorMessage extracts an OpenAI-style error message, else the body's
// first 256 bytes.
func errorMessage(raw []byte) string {
	var r struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &r) == nil && r.Error.Message != "" {
		return r.Error.Message
	}
	if len(raw) > 256 {
		raw = raw[:256]
	}
	return strings.TrimSpace(string(raw))
}
