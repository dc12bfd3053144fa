package index

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
)

// fakeEmbeddings serves /v1/embeddings with deterministic vectors of dim
// dimensions (a text's vector depends on the text and seed) and records
// the batches it saw.
type fakeEmbeddings struct {
	mu      sync.Mutex
	batches [][]string
	auth    []string
	models  []string // "model" of each request ("" when left out)
	dim     int      // 0: 4
	seed    int      // changes every vector, as another model would
	model   string   // the answer's "model" (empty: the request's)
	status  int      // non-zero: answer this status with an OpenAI error
	failN   int      // answer the next failN requests with status
	mangle  string   // "count", "dim", "index": return a broken answer
	maxLen  int      // > 0: refuse inputs longer than this, as llama.cpp does
	gate    chan struct{}
}

func (f *fakeEmbeddings) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/embeddings" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var req embeddingsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad request", 400)
		return
	}
	f.mu.Lock()
	f.batches = append(f.batches, req.Input)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	f.models = append(f.models, req.Model)
	status, mangle, dim, seed, model, maxLen, gate := f.status, f.mangle, f.dim, f.seed, f.model, f.maxLen, f.gate
	if f.failN > 0 {
		f.failN--
		if f.failN == 0 {
			f.status = 0
		}
	}
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	if status != 0 {
		w.WriteHeader(status)
		fmt.Fprint(w, `{"error":{"message":"quota exceeded","type":"rate_limit"}}`)
		return
	}
	for _, s := range req.Input {
		if maxLen > 0 && len(s) > maxLen {
			w.WriteHeader(500)
			fmt.Fprintf(w, `{"error":{"code":500,"message":"input (%d tokens) is too large to process. increase the physical batch size (current batch size: %d)","type":"server_error"}}`, len(s)+1, maxLen)
			return
		}
	}
	if dim == 0 {
		dim = 4
	}
	if model == "" {
		model = req.Model
	}
	type item struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	resp := struct {
		Model string `json:"model"`
		Data  []item `json:"data"`
	}{Model: model}
	for i, s := range req.Input {
		v := make([]float32, dim)
		v[0] = float32(len(s))
		v[1] = 1 + float32(seed)
		v[2] = float32(i % 2)
		if dim > 3 {
			v[3] = 0.5
		}
		if mangle == "dim" && i == 1 {
			v = v[:dim-1]
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

func (f *fakeEmbeddings) update(fn func(f *fakeEmbeddings)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeEmbeddings) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.batches)
}

func (f *fakeEmbeddings) sent() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.batches)
}

// newFake starts a fake embeddings server that the test's cleanup stops.
func newFake(t *testing.T) (*fakeEmbeddings, *httptest.Server) {
	t.Helper()
	fake := &fakeEmbeddings{}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	return fake, srv
}

func newEmbedder(t *testing.T, o OpenAIOptions) *OpenAIEmbedder {
	t.Helper()
	e, err := NewOpenAIEmbedder(o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestOpenAIEmbedderBatchesAndCaches(t *testing.T) {
	fake, srv := newFake(t)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, APIKey: "sk-test", Model: "m", MaxBatch: 2})
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
	auth, model := fake.auth[0], fake.models[0]
	fake.mu.Unlock()
	if auth != "Bearer sk-test" || model != "m" {
		t.Errorf("auth %q model %q", auth, model)
	}
	if e.Dim() != 4 || e.Name() != "openai:m" || e.Space() != "m/d4" {
		t.Errorf("dim %d name %s space %s", e.Dim(), e.Name(), e.Space())
	}
	// All cached now.
	if _, err := e.Embed(context.Background(), []string{"ddddd", "a"}); err != nil || fake.requests() != 2 {
		t.Fatalf("cache missed: %v, %d requests", err, fake.requests())
	}
	st := e.Stats()
	if st.Calls != 2 || st.Texts != 7 || st.CacheHits != 2 || st.Embedded != 4 || st.Requests != 2 || st.CacheEntries != 4 {
		t.Errorf("stats %+v", st)
	}
	// Through an Index, BaseURL with /v1.
	e2 := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL + "/v1/", Model: "m"})
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
	if s := x.Stats(); s.Space != "m/d4" || s.Dim != 4 {
		t.Errorf("index stats %+v", s)
	}
}

func TestOpenAIEmbedderBatchBytes(t *testing.T) {
	fake, srv := newFake(t)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, MaxBatchBytes: 10})
	texts := []string{"aaaa", "bbbb", "cccc", strings.Repeat("d", 30), "e"}
	if _, err := e.Embed(context.Background(), texts); err != nil {
		t.Fatal(err)
	}
	// 4+4 | 4 | the long one alone | 1
	want := [][]string{{"aaaa", "bbbb"}, {"cccc"}, {texts[3]}, {"e"}}
	if got := fake.sent(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("batches %q, want %q", got, want)
	}
	// Without a model name the field is left out: the server's own.
	if fake.models[0] != "" || e.Name() != "openai:upstream" {
		t.Errorf("model sent %q, name %s", fake.models[0], e.Name())
	}
}

func TestOpenAIEmbedderCacheIsBounded(t *testing.T) {
	fake, srv := newFake(t)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Model: "m", CacheSize: 2})
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
	// Bytes: 4 dimensions are 16 bytes + the entry's overhead.
	eb := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Model: "m", CacheBytes: 2 * (16 + cacheItemBytes)})
	if _, err := eb.Embed(context.Background(), []string{"a", "b", "c", "d"}); err != nil {
		t.Fatal(err)
	}
	if st := eb.Stats(); st.CacheEntries != 2 || st.CacheBytes != 2*(16+cacheItemBytes) {
		t.Errorf("cache bounded by bytes holds %d entries, %d bytes", st.CacheEntries, st.CacheBytes)
	}
}

// A text that one call is fetching is waited for by another, not sent
// twice; texts of different calls never share a request.
func TestOpenAIEmbedderSharesInFlightTexts(t *testing.T) {
	fake, srv := newFake(t)
	gate := make(chan struct{})
	fake.update(func(f *fakeEmbeddings) { f.gate = gate })
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			_, err := e.Embed(context.Background(), []string{"shared", fmt.Sprintf("own %d", i)})
			errs <- err
		})
	}
	// Every call has sent its request or waits for another's.
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.Lock()
		n := len(e.flights)
		e.mu.Unlock()
		if n == 9 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	shared := 0
	for _, b := range fake.sent() {
		own := 0
		for _, s := range b {
			if s == "shared" {
				shared++
			} else {
				own++
			}
		}
		if own > 1 {
			t.Errorf("one request carries texts of %d calls: %q", own, b)
		}
	}
	if shared != 1 {
		t.Errorf("the shared text was sent %d times", shared)
	}
}

func TestOpenAIEmbedderErrors(t *testing.T) {
	fake, srv := newFake(t)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Model: "m", CacheSize: -1, Retries: -1, Cooldown: -1})

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
	fixed := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Model: "m", Dim: 8})
	if _, err := fixed.Embed(context.Background(), []string{"x"}); !errors.Is(err, ErrEmbed) {
		t.Errorf("dimension 4 accepted for Dim 8: %v", err)
	}
	srv.Close()
	if _, err := e.Embed(context.Background(), []string{"x"}); !errors.Is(err, ErrEmbed) {
		t.Errorf("closed server: %v", err)
	}
	for _, o := range []OpenAIOptions{{Model: "m"}, {BaseURL: "ftp://x", Model: "m"}, {BaseURL: srv.URL, Model: "m", Dim: -1},
		{BaseURL: srv.URL, MaxBatchBytes: -1}, {BaseURL: srv.URL, Timeout: -time.Second}} {
		if _, err := NewOpenAIEmbedder(o); !errors.Is(err, ErrInvalid) {
			t.Errorf("options %+v: %v", o, err)
		}
	}
}

func TestOpenAIEmbedderRetries(t *testing.T) {
	fake, srv := newFake(t)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Backoff: time.Millisecond})
	for _, status := range []int{503, 429, 500} {
		fake.update(func(f *fakeEmbeddings) { f.status, f.failN = status, 2 })
		if _, err := e.Embed(context.Background(), []string{fmt.Sprint("text ", status)}); err != nil {
			t.Fatalf("status %d twice, then answered: %v", status, err)
		}
	}
	if st := e.Stats(); st.Retries != 6 || st.Requests != 9 || st.Failures != 0 {
		t.Errorf("stats %+v", st)
	}
	// A 4xx other than 429 is not retried.
	fake.update(func(f *fakeEmbeddings) { f.status, f.failN = 400, 1 })
	if _, err := e.Embed(context.Background(), []string{"bad"}); !errors.Is(err, ErrEmbed) {
		t.Fatalf("400: %v", err)
	}
	if st := e.Stats(); st.Requests != 10 || st.Failures != 1 {
		t.Errorf("400 retried: %+v", st)
	}
}

// closingServer answers the first request of each connection with
// keep-alive and closes the connection, unanswered, when a second arrives
// on it: the client meets a pooled connection the server had closed, as
// with llama-server's 5 s keep-alive.
func closingServer(t *testing.T) (url string, conns func() int) {
	t.Helper()
	var n atomic.Int32
	addr := sidecartest.ServeConns(t, func(c net.Conn) {
		n.Add(1)
		br := bufio.NewReader(c)
		for i := 0; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil || i == 1 {
				return
			}
			var in embeddingsRequest
			json.NewDecoder(req.Body).Decode(&in)
			var data []string
			for j := range in.Input {
				data = append(data, fmt.Sprintf(`{"index":%d,"embedding":[1,2,3]}`, j))
			}
			body := `{"model":"m","data":[` + strings.Join(data, ",") + `]}`
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	return "http://" + addr, func() int { return int(n.Load()) }
}

func TestOpenAIEmbedderRetriesAReusedConnectionAtOnce(t *testing.T) {
	url, conns := closingServer(t)
	// No backoff would be long: a stale connection is retried at once.
	e := newEmbedder(t, OpenAIOptions{BaseURL: url, Backoff: time.Hour, Retries: 1})
	defer e.Close()
	for i := range 3 {
		if _, err := e.Embed(context.Background(), []string{fmt.Sprint("text ", i)}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if st := e.Stats(); st.Failures != 0 || st.Down || st.Retries != 2 || conns() != 3 {
		t.Errorf("stats %+v, %d connections", st, conns())
	}
}

func TestOpenAIEmbedderCoolsDown(t *testing.T) {
	fake, srv := newFake(t)
	now := time.Unix(1000, 0)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Retries: -1, Cooldown: time.Second, Now: func() time.Time { return now }})
	fake.set(503, "")
	for range 2 {
		if _, err := e.Embed(context.Background(), []string{"x"}); !errors.Is(err, ErrEmbed) {
			t.Fatalf("down: %v", err)
		}
	}
	if st := e.Stats(); st.Requests != 1 || st.FastFails != 1 || !st.Down {
		t.Fatalf("the second call reached the server: %+v", st)
	}
	// Cached texts are still answered.
	fake.set(0, "")
	now = now.Add(1001 * time.Millisecond)
	if _, err := e.Embed(context.Background(), []string{"x"}); err != nil {
		t.Fatal(err)
	}
	fake.set(503, "")
	if _, err := e.Embed(context.Background(), []string{"x"}); err != nil {
		t.Fatalf("cached text during a cooldown: %v", err)
	}
	// Failures in a row double the cooldown.
	for i := range 3 {
		now = now.Add(time.Hour)
		e.Embed(context.Background(), []string{fmt.Sprint("y", i)})
	}
	e.mu.Lock()
	left := e.downUntil.Sub(now)
	e.mu.Unlock()
	if left != 4*time.Second {
		t.Errorf("cooldown after 3 failures in a row: %v, want 4s", left)
	}
	// The caller's own deadline says nothing about the server.
	fake.set(0, "")
	now = now.Add(time.Hour)
	e.Embed(context.Background(), []string{"ok"}) // up again
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Embed(ctx, []string{"z"}); err == nil {
		t.Fatal("cancelled call succeeded")
	}
	if st := e.Stats(); st.Down {
		t.Errorf("a cancelled call started a cooldown")
	}
}

func TestOpenAIEmbedderCutsInputsTooLarge(t *testing.T) {
	fake, srv := newFake(t)
	fake.update(func(f *fakeEmbeddings) { f.maxLen = 100 })
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL})
	long := strings.Repeat("é", 300) // 600 bytes; cuts keep whole characters
	v, err := e.Embed(context.Background(), []string{"short", long})
	if err != nil {
		t.Fatal(err)
	}
	st := e.Stats()
	if st.InputCap > 100 || st.Truncated != 1 || len(v) != 2 {
		t.Fatalf("stats %+v", st)
	}
	n := fake.requests()
	// The limit is learned: the next long text is cut before it is sent.
	if _, err := e.Embed(context.Background(), []string{long + "x"}); err != nil {
		t.Fatal(err)
	}
	if fake.requests() != n+1 {
		t.Errorf("%d requests for a long text once the limit was known", fake.requests()-n)
	}
	for _, b := range fake.sent()[n:] {
		for _, s := range b {
			if len(s) > 100 || !strings.HasPrefix(long, strings.TrimSuffix(s, "x")) {
				t.Errorf("sent %d bytes: %q", len(s), s)
			}
		}
	}
	// A refusal that no cut cures is not about length: the limit is kept.
	e2 := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Retries: -1})
	fake.update(func(f *fakeEmbeddings) { f.maxLen = 1 })
	if _, err := e2.Embed(context.Background(), []string{long}); !errors.Is(err, ErrEmbed) {
		t.Fatal(err)
	}
	if c := e2.Stats().InputCap; c != 32<<10 {
		t.Errorf("input limit %d after a refusal no cut cured", c)
	}
}

func TestOpenAIEmbedderFollowsANewSpace(t *testing.T) {
	fake, srv := newFake(t)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL})
	if _, err := e.Embed(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	// The server restarts with a model of another dimension.
	fake.update(func(f *fakeEmbeddings) { f.dim, f.model = 3, "other" })
	v, space, err := e.EmbedSpace(context.Background(), []string{"a", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if space != "other/d3" || len(v[0]) != 3 || len(v[1]) != 3 || e.Dim() != 3 {
		t.Fatalf("space %s, vectors %v", space, v)
	}
	st := e.Stats()
	if st.SpaceChanges != 1 || st.CacheEntries != 2 {
		t.Errorf("stats %+v", st)
	}
	// Same dimension, another model name: another space too.
	fake.update(func(f *fakeEmbeddings) { f.model, f.seed = "third", 1 })
	if _, space, err = e.EmbedSpace(context.Background(), []string{"d"}); err != nil || space != "third/d3" {
		t.Fatalf("space %s: %v", space, err)
	}
	// With Dim set, another dimension is an error.
	fixed := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Dim: 3})
	fixed.Embed(context.Background(), []string{"a"})
	fake.update(func(f *fakeEmbeddings) { f.dim = 5 })
	if _, err := fixed.Embed(context.Background(), []string{"b"}); !errors.Is(err, ErrEmbed) {
		t.Errorf("Dim 3 took dimension 5: %v", err)
	}
}

// The server changes model under an index: the index re-embeds its
// documents on the next update, searches fail (recall falls back to words)
// until then, and never compare vectors of two models.
func TestIndexReembedsForANewSpace(t *testing.T) {
	fake, srv := newFake(t)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL, Cooldown: -1})
	x, err := New(Options{Embedder: e})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := x.Add(ctx, Doc{ID: "1", Text: "alpha"}, Doc{ID: "2", Text: "beta gamma"}); err != nil {
		t.Fatal(err)
	}
	fake.update(func(f *fakeEmbeddings) { f.dim = 6 })
	if _, err := x.Search(ctx, "alpha?", 2, ModeHybrid); !errors.Is(err, ErrEmbed) {
		t.Fatalf("search across spaces: %v", err)
	}
	if hits, err := x.Search(ctx, "alpha", 2, ModeBM25); err != nil || len(hits) != 1 {
		t.Fatalf("BM25 search: %v %v", hits, err)
	}
	// Stale tells without a request; Reembed mends an index no update
	// touches.
	z, _ := New(Options{Embedder: e})
	fake.update(func(f *fakeEmbeddings) { f.dim = 4 })
	if err := z.Add(ctx, Doc{ID: "1", Text: "alpha one"}); err != nil {
		t.Fatal(err)
	}
	fake.update(func(f *fakeEmbeddings) { f.dim = 6 })
	if _, err := e.Embed(ctx, []string{"anything new"}); err != nil {
		t.Fatal(err)
	}
	if !z.Stale() {
		t.Fatal("an index of dimension 4 beside an embedder of 6 is not stale")
	}
	if err := z.Reembed(ctx); err != nil || z.Stale() || z.Stats().Dim != 6 || z.Stats().Reembeds != 1 {
		t.Fatalf("reembed: %v, %+v", err, z.Stats())
	}
	// A document with a vector of the old space is embedded again too.
	old, _ := x.Get("1")
	if err := x.Upsert(ctx, Doc{ID: "3", Text: "delta"}, Doc{ID: "1", Text: "alpha", Vector: old.Vector}); err != nil {
		t.Fatal(err)
	}
	st := x.Stats()
	if st.Dim != 6 || st.Space != "/d6" || st.Reembeds != 1 || st.Vectors != 3 || st.Docs != 3 {
		t.Fatalf("stats %+v", st)
	}
	for _, id := range []string{"1", "2", "3"} {
		if d, _ := x.Get(id); len(d.Vector) != 6 {
			t.Errorf("document %s has dimension %d", id, len(d.Vector))
		}
	}
	if hits, err := x.Search(ctx, "alpha", 3, ModeHybrid); err != nil || len(hits) == 0 || hits[0].ID != "1" {
		t.Fatalf("search: %v %v", hits, err)
	}
	// A saved index of the old space is not loaded as is.
	path := filepath.Join(t.TempDir(), "x.idx")
	if err := x.Save(path); err != nil {
		t.Fatal(err)
	}
	fake.update(func(f *fakeEmbeddings) { f.dim = 4 })
	e2 := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL})
	if err := e2.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path, Options{Embedder: e2}); !errors.Is(err, durable.ErrCorrupt) {
		t.Errorf("index of dimension 6 loaded for an embedder of 4: %v", err)
	}
	fake.update(func(f *fakeEmbeddings) { f.dim, f.model = 6, "renamed" })
	e3 := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL})
	e3.Probe(ctx)
	if _, err := Load(path, Options{Embedder: e3}); !errors.Is(err, durable.ErrCorrupt) {
		t.Errorf("index of space /d6 loaded for renamed/d6: %v", err)
	}
	fake.update(func(f *fakeEmbeddings) { f.model = "" })
	e4 := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL})
	e4.Probe(ctx)
	y, err := Load(path, Options{Embedder: e4})
	if err != nil || y.Stats().Space != "/d6" || y.Len() != 3 {
		t.Fatalf("same space: %v", err)
	}
}

func TestSearchBoundsTheQueryEmbedding(t *testing.T) {
	fake, srv := newFake(t)
	e := newEmbedder(t, OpenAIOptions{BaseURL: srv.URL})
	x, err := New(Options{Embedder: e, QueryTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Add(context.Background(), Doc{ID: "1", Text: "alpha"}); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	defer close(gate)
	fake.update(func(f *fakeEmbeddings) { f.gate = gate })
	if _, err := x.Search(context.Background(), "slow query", 1, ModeHybrid); !errors.Is(err, ErrEmbed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("search past the query timeout: %v", err)
	}
	if e.Stats().Down {
		t.Error("a query's deadline started a cooldown")
	}
}
