package llamacpp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// The llama.cpp API's calls are replayable: a POST that meets a kept-alive
// connection the server closed without reading it is sent again on a
// fresh one by net/http, and the caller never sees the failure.
func TestLlamaAPIReplaysOnAClosedConnection(t *testing.T) {
	var mu sync.Mutex
	n := 0
	fake, _ := newFakeLlama(t, 1)
	srv := newServerFunc(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		drop := n == 2 // the second request comes on the first's connection
		mu.Unlock()
		if drop {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		fake.ServeHTTP(w, r)
	})
	api := &llamaAPI{base: srv.URL, client: &http.Client{Transport: &http.Transport{}}}
	ctx := context.Background()
	if _, err := api.slots(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := api.slotAction(ctx, 0, "save", "kvsidecar-x-0.slot"); err != nil {
		t.Fatalf("slot save on a connection the server dropped: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n != 3 {
		t.Fatalf("server saw %d requests, want 3 (one dropped, resent)", n)
	}
}

func newServerFunc(t *testing.T, f http.HandlerFunc) *httptest.Server {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}
