package index

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// fakeEmbeddings serves /v1/embeddings with deterministic 4-dimension
// vectors and records the batches it saw.
type fakeEmbeddings struct {
	mu      sync.Mutex
	batches [][]string
	auth    []string
	status  int    // non-zero: answer this status with an OpenAI error
	mangle  string // "count", "dim", "index": return a broken answer
}

func (f *fakeEmbeddings) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/embeddings" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var req embeddingsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "m" {
		http.Error(w, "bad request", 400)
		return
	}
	f.mu.Lock()
	f.batches = append(f.batches, req.Input)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	status, mangle := f.status, f.mangle
	f.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
		fmt.Fprint(w, `{"error":{"message":"quota exceeded","type":"rate_limit"}}`)
		return
	}
	type item struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	var resp struct {
		Data []item `json:"data"`
	}
	for i, s := range req.Input {
		v := []float32{float32(len(s)), 1, float32(i % 2), 0.5}
		if mangle == "dim" && i == 1 {
			v = v[:3]
		}
		idx := i
		if mangle == "index" {
			idx = 0
		}
		// answer in reverse order: the client must use "index"
		resp.Data = append([]item{{Index: idx, Embedding: v}}, resp.Data...)
	}
	if mangle == "count" {
		resp.Data = resp.Data[1:]
	}
	json.NewEncoder(w).Encode(resp)
}

func (f *fakeEmbeddings) set(status int, mangle string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status, f.mangle = status, mangle
}

func (f *fakeEmbeddings) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.batches)
}

func TestOpenAIEmbedderBatchesAndCaches(t *testing.T) {
	fake := &fakeEmbeddings{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	e, err := NewOpenAIEmbedder(OpenAIOptions{BaseURL: srv.URL, APIKey: "sk-test", Model: "m", MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"a", "bb", "ccc", "bb", "ddddd"}
	v, err := e.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range texts {
		if len(v[i]) != 4 || v[i][0] != float32(len(s)) {
			t.Errorf("text %q: vector %v", s, v[i])
		}
	}
	// 4 distinct texts in batches of 2.
	if n := fake.requests(); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
	fake.mu.Lock()
	auth := fake.auth[0]
	fake.mu.Unlock()
	if auth != "Bearer sk-test" {
		t.Errorf("auth %q", auth)
	}
	if e.Dim() != 4 || e.Name() != "openai:m" {
		t.Errorf("dim %d name %s", e.Dim(), e.Name())
	}
	// All cached now.
	if _, err := e.Embed(context.Background(), []string{"ddddd", "a"}); err != nil || fake.requests() != 2 {
		t.Fatalf("cache missed: %v, %d requests", err, fake.requests())
	}
	// Through an Index, BaseURL with /v1.
	e2, _ := NewOpenAIEmbedder(OpenAIOptions{BaseURL: srv.URL + "/v1/", Model: "m"})
	x, err := New(Options{Embedder: e2})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Add(context.Background(), Doc{ID: "1", Text: "hello"}, Doc{ID: "2", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	hits, err := x.Search(context.Background(), "hello", 2, ModeVector)
	if err != nil || len(hits) != 2 {
		t.Fatalf("search: %v %v", hits, err)
	}
}

func TestOpenAIEmbedderCacheIsBounded(t *testing.T) {
	fake := &fakeEmbeddings{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	e, _ := NewOpenAIEmbedder(OpenAIOptions{BaseURL: srv.URL, Model: "m", CacheSize: 2})
	for _, s := range []string{"a", "b", "c"} {
		if _, err := e.Embed(context.Background(), []string{s}); err != nil {
			t.Fatal(err)
		}
	}
	if len(e.items) != 2 || e.lru.Len() != 2 {
		t.Fatalf("cache holds %d", len(e.items))
	}
	e.Embed(context.Background(), []string{"c"}) // cached
	e.Embed(context.Background(), []string{"a"}) // evicted: fetched again
	if n := fake.requests(); n != 4 {
		t.Fatalf("%d requests, want 4", n)
	}
}

func TestOpenAIEmbedderErrors(t *testing.T) {
	fake := &fakeEmbeddings{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	e, _ := NewOpenAIEmbedder(OpenAIOptions{BaseURL: srv.URL, Model: "m", CacheSize: -1})

	fake.set(http.StatusTooManyRequests, "")
	_, err := e.Embed(context.Background(), []string{"x"})
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != 429 || he.Message != "quota exceeded" || !errors.Is(err, ErrEmbed) {
		t.Fatalf("status error: %v", err)
	}
	for _, m := range []string{"count", "dim", "index"} {
		fake.set(0, m)
		if _, err := e.Embed(context.Background(), []string{"x", "yy"}); !errors.Is(err, ErrEmbed) {
			t.Errorf("mangle %s: %v", m, err)
		}
	}
	fake.set(0, "")
	fixed, _ := NewOpenAIEmbedder(OpenAIOptions{BaseURL: srv.URL, Model: "m", Dim: 8})
	if _, err := fixed.Embed(context.Background(), []string{"x"}); !errors.Is(err, ErrEmbed) {
		t.Errorf("dimension 4 accepted for Dim 8: %v", err)
	}
	srv.Close()
	if _, err := e.Embed(context.Background(), []string{"x"}); !errors.Is(err, ErrEmbed) {
		t.Errorf("closed server: %v", err)
	}
	for _, o := range []OpenAIOptions{{Model: "m"}, {BaseURL: srv.URL}, {BaseURL: "ftp://x", Model: "m"}, {BaseURL: srv.URL, Model: "m", Dim: -1}} {
		if _, err := NewOpenAIEmbedder(o); !errors.Is(err, ErrInvalid) {
			t.Errorf("options %+v: %v", o, err)
		}
	}
}
