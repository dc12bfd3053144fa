package generic

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
)

// TestGenericBackgroundGate: on an engine with one slot, a client request
// takes the slot from a background call (cancelled with engine.ErrPreempted), and
// a background call waits while a client is in flight and for the quiet
// period after it, or gives up with engine.ErrBusy when its context ends.
func TestGenericBackgroundGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(Options{Slots: 1, BackgroundQuiet: 500 * time.Millisecond})
		ctx := context.Background()
		bctx, cancel := context.WithCancelCause(ctx)
		bg := &engine.Request{Background: true, Cancel: cancel}
		if _, err := g.Before(ctx, bg); err != nil {
			t.Fatal(err)
		}
		client := &engine.Request{SessionID: "s"}
		if _, err := g.Before(ctx, client); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(context.Cause(bctx), engine.ErrPreempted) {
			t.Fatalf("the background call was not preempted: %v", context.Cause(bctx))
		}
		g.After(ctx, bg, &engine.Response{})
		if st := g.Stats(); st.BackgroundCancelled != 1 || st.ClientWaits != 0 {
			t.Fatalf("stats %+v", st)
		}

		// While the client is in flight, a background call waits.
		started := make(chan time.Time, 1)
		go func() {
			if _, err := g.Before(ctx, &engine.Request{Background: true}); err != nil {
				t.Error(err)
			}
			started <- time.Now()
		}()
		synctest.Wait()
		select {
		case <-started:
			t.Fatal("a background call started while a client held the only slot")
		default:
		}
		done := time.Now()
		g.After(ctx, client, &engine.Response{})
		at := <-started
		// The quiet is 1s now: twice 500ms, as the first call was preempted.
		if d := at.Sub(done); d < time.Second || d > 1100*time.Millisecond {
			t.Fatalf("a background call started %v after the client, want at the end of the 1s quiet period", d)
		}

		// A background call whose context ends first is not sent.
		g2 := New(Options{Slots: 1})
		c2 := &engine.Request{}
		g2.Before(ctx, c2)
		sctx, stop := context.WithTimeout(ctx, time.Second)
		defer stop()
		if _, err := g2.Before(sctx, &engine.Request{Background: true}); !errors.Is(err, engine.ErrBusy) {
			t.Fatalf("background call on a busy engine: %v", err)
		}
	})
}

// TestGenericQuietCountsFromArrival: the quiet before a background call
// counts from when the last client request arrived (Request.Start, the
// proxy's clock reading), or from its Before when it has none, and the
// call starts when it ends (it waited a whole second before).
func TestGenericQuietCountsFromArrival(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		for _, c := range []struct {
			start time.Time
			wait  time.Duration
		}{{time.Now().Add(-10 * time.Second), 0}, {time.Now().Add(-200 * time.Millisecond), 300 * time.Millisecond}, {time.Time{}, 500 * time.Millisecond}} {
			g := New(Options{Slots: 1, BackgroundQuiet: 500 * time.Millisecond})
			client := &engine.Request{SessionID: "s", Start: c.start}
			g.Before(ctx, client)
			g.After(ctx, client, &engine.Response{})
			before := time.Now()
			if _, err := g.Before(ctx, &engine.Request{Background: true}); err != nil {
				t.Fatal(err)
			}
			if waited := time.Since(before); waited != c.wait {
				t.Errorf("start %v: the background call waited %v, want %v (to the end of the quiet)", c.start, waited, c.wait)
			}
		}
	})
}

// TestGenericLearnsSlots: the slots come from llama.cpp's /props; an
// engine that states none (vLLM, SGLang batch requests) never holds a
// background call back.
func TestGenericLearnsSlots(t *testing.T) {
	for _, c := range []struct {
		props string
		want  int
	}{{`{"total_slots":2,"default_generation_settings":{"n_ctx":2048}}`, 2}, {"", 0}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/props" || c.props == "" {
				http.NotFound(w, r)
				return
			}
			if r.Header.Get("User-Agent") != engine.ProbeUserAgent {
				t.Errorf("probe User-Agent %q", r.Header.Get("User-Agent"))
			}
			w.Write([]byte(c.props))
		}))
		g := New(Options{BaseURL: srv.URL + "/v1"})
		// A client in flight on every slot the engine may have.
		for range 4 {
			g.Before(context.Background(), &engine.Request{})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := g.Before(ctx, &engine.Request{Background: true})
		cancel()
		if got := g.Stats().Slots; got != c.want {
			t.Errorf("props %q: slots %d, want %d", c.props, got, c.want)
		}
		if c.want > 0 && !errors.Is(err, engine.ErrBusy) || c.want == 0 && err != nil {
			t.Errorf("props %q: background call: %v", c.props, err)
		}
		srv.Close()
	}
}

func TestGeneric(t *testing.T) {
	g := New(Options{})
	req := &engine.Request{Tenant: "t", SessionID: "s", Model: "m", Body: []byte(`{"model":"m"}`)}
	body, err := g.Before(context.Background(), req)
	if err != nil || string(body) != `{"model":"m"}` {
		t.Fatalf("%s %v", body, err)
	}
	g.After(context.Background(), req, &engine.Response{Status: 200, Body: []byte(`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":8}}}`)})
	g.After(context.Background(), req, &engine.Response{Status: 502})
	s := g.Stats()
	if s.Requests != 1 || s.Responses != 2 || s.TimedResponses != 1 || s.Timings.CacheN != 8 || s.CachedRatio != 0.8 || !s.Enabled {
		t.Fatalf("%+v", s)
	}
	h := engine.Wrap(g)
	if _, ok := h.SessionStats("t", "s"); ok {
		t.Fatal("generic keeps sessions")
	}
	if h.Stats() != s || h.Name() != Name {
		t.Fatalf("hooks: %+v", h.Stats())
	}
	var (
		_ engine.PreRequest   = g
		_ engine.PostResponse = g
		_ engine.Reporter     = g
	)
}

// TestGenericNeverBlocks: the generic connector's hooks may run on the
// front door's event loop.
func TestGenericNeverBlocks(t *testing.T) {
	if !engine.Wrap(New(Options{})).NeverBlocks() {
		t.Fatal("the generic connector does not say its hooks never block")
	}
}
