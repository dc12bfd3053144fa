package memory

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
)

// embeddingsServer is a scripted OpenAI /v1/embeddings: it answers with the
// offline embedder's vectors (so recall has meaning) of its dimension, and
// can be made to fail.
type embeddingsServer struct {
	url      string
	mu       sync.Mutex
	emb      *index.HashEmbedder
	down     bool
	requests int
}

func newEmbeddingsServer(t *testing.T) (*embeddingsServer, *index.OpenAIEmbedder) {
	t.Helper()
	f := &embeddingsServer{emb: index.NewHashEmbedder(index.HashOptions{Dim: 64})}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f, f.embedder(t)
}

// embedder returns a client of f, as a restarted sidecar makes, probed.
func (f *embeddingsServer) embedder(t *testing.T) *index.OpenAIEmbedder {
	t.Helper()
	e, err := index.NewOpenAIEmbedder(index.OpenAIOptions{BaseURL: f.url, Retries: -1, Cooldown: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	e.Probe(context.Background())
	return e
}

func (f *embeddingsServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ Input []string }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	f.mu.Lock()
	f.requests++
	down, emb := f.down, f.emb
	f.mu.Unlock()
	if down {
		http.Error(w, `{"error":{"message":"loading model"}}`, 503)
		return
	}
	vecs, _ := emb.Embed(r.Context(), req.Input)
	type item struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	var out struct {
		Data []item `json:"data"`
	}
	for i, v := range vecs {
		out.Data = append(out.Data, item{i, v})
	}
	json.NewEncoder(w).Encode(out)
}

func (f *embeddingsServer) set(down bool, dim int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
	if dim != 0 {
		f.emb = index.NewHashEmbedder(index.HashOptions{Dim: dim})
	}
}

// waitIndexed waits until the worker indexed every unit of the session
// (with a remote embedder the worker indexes, not the request path) in
// the embedder's current vector space.
func waitIndexed(t *testing.T, s *Store, tenant, id string) index.Stats {
	t.Helper()
	sess, err := s.reg.session(tenant, id, false)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		sess.mu.Lock()
		x := sess.ix
		done := x != nil
		for _, u := range sess.units {
			done = done && u.indexed
		}
		sess.mu.Unlock()
		var st index.Stats
		if x != nil {
			st = x.Stats()
			done = done && !x.Stale()
		}
		if done {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s not indexed after 10 s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// With the embeddings endpoint down, a turn still recalls (by words),
// counted; when it answers again in another vector space (a new model),
// the session's index is embedded again and recall uses it.
func TestRemoteEmbedderOutageAndNewSpace(t *testing.T) {
	f, e := newEmbeddingsServer(t)
	dir := t.TempDir()
	open := func(e index.Embedder) *Store {
		return openStore(t, dir, func(o *Options) {
			smallWindow(o)
			o.Recall.Index.Embedder = e
		})
	}
	s := open(e)
	msgs := evictedSession(t, s)
	if st := waitIndexed(t, s, "t", "s"); st.Dim != 64 || st.Vectors == 0 {
		t.Fatalf("index %+v", st)
	}

	f.set(true, 0)
	turn := prepare(t, s, "t", "s", ModeFull, msgs...)
	if !strings.Contains(string(turn.Block), "Krakatoa") {
		t.Fatalf("endpoint down: not recalled: %s", turn.Block)
	}
	turn.Abort()
	if st := s.Stats(); st.RecallByWords != 1 {
		t.Fatalf("RecallByWords %d, want 1", st.RecallByWords)
	}

	// Back, with a model of another dimension: the turn recalls by words
	// and the worker embeds the index again, with no new unit to index.
	f.set(false, 96)
	turn = prepare(t, s, "t", "s", ModeFull, msgs...)
	if !strings.Contains(string(turn.Block), "Krakatoa") {
		t.Fatalf("new space: not recalled: %s", turn.Block)
	}
	turn.Abort()
	st := waitIndexed(t, s, "t", "s")
	if st.Dim != 96 || st.Reembeds != 1 || st.Vectors != st.Docs {
		t.Fatalf("index after the space changed: %+v", st)
	}
	turn = prepare(t, s, "t", "s", ModeFull, msgs...)
	if err := turn.Complete(text("assistant", "Krakatoa it is")); err != nil {
		t.Fatal(err)
	}
	st = waitIndexed(t, s, "t", "s")
	if st.Dim != 96 || st.Reembeds != 1 || st.Vectors != st.Docs {
		t.Fatalf("index after the space changed: %+v", st)
	}
	byWords := s.Stats().RecallByWords
	q := append(msgs, text("assistant", "Krakatoa it is"), text("user", "and which volcano again?"))
	turn = prepare(t, s, "t", "s", ModeFull, q...)
	turn.Abort()
	if got := s.Stats().RecallByWords; got != byWords {
		t.Fatalf("recall by words after the re-embedding: %d, was %d", got, byWords)
	}

	// The saved index of the new space is used after a restart; one of an
	// older space is rebuilt.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(f.embedder(t))
	prepare(t, s, "t", "s", ModeFull, q...).Abort()
	if st := s.Stats(); st.IndexRebuilds != 0 || st.RecallByWords != 0 {
		t.Fatalf("index of the same space: rebuilds %d, recalls by words %d", st.IndexRebuilds, st.RecallByWords)
	}
	s.Close()
	f.set(false, 48)
	s = open(f.embedder(t))
	turn = prepare(t, s, "t", "s", ModeFull, q...)
	if err := turn.Complete(text("assistant", "yes")); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.IndexRebuilds != 1 {
		t.Fatalf("index of another space: rebuilds %d, want 1", st.IndexRebuilds)
	}
	if st := waitIndexed(t, s, "t", "s"); st.Dim != 48 || st.Vectors != st.Docs {
		t.Fatalf("rebuilt index %+v", st)
	}
	q = append(q, text("assistant", "yes"), text("user", "my favourite volcano?"))
	turn = prepare(t, s, "t", "s", ModeFull, q...)
	turn.Abort()
	if st := s.Stats(); st.RecallByWords != 0 {
		t.Fatalf("after the rebuild: recall %q, by words %d", turn.Stats.Recall, st.RecallByWords)
	}
}

// The gate with a model's embeddings: a memory passes on its embedding
// only when its cosine stands out of the query's similarities.
func TestGateCosineWithModelEmbeddings(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Recall.Index.Embedder = index.NewHashEmbedder(index.HashOptions{}) })
	if got := s.recall.gateCosine(index.Hit{Cosine: 0.05}); got != 0.05 {
		t.Errorf("offline: %v", got)
	}
	_, e := newEmbeddingsServer(t)
	m := openStore(t, t.TempDir(), func(o *Options) { o.Recall.Index.Embedder = e })
	for _, c := range []struct {
		h    index.Hit
		want float64
	}{
		{index.Hit{Cosine: 0.8, CosineZ: 1}, 0},
		{index.Hit{Cosine: 0.8, CosineZ: 3.5}, 0.8},
		{index.Hit{Cosine: 0.1, CosineZ: 4}, 0.15},
	} {
		if got := m.recall.gateCosine(c.h); got != c.want {
			t.Errorf("%+v: %v, want %v", c.h, got, c.want)
		}
	}
}
