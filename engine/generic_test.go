package engine

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"
)

// TestGenericBackgroundGate: on an engine with one slot, a client request
// takes the slot from a background call (cancelled with ErrPreempted), and
// a background call waits while a client is in flight and for the quiet
// period after it, or gives up with ErrBusy when its context ends.
func TestGenericBackgroundGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGeneric(GenericOptions{Slots: 1, BackgroundQuiet: 500 * time.Millisecond})
		ctx := context.Background()
		bctx, cancel := context.WithCancelCause(ctx)
		bg := &Request{Background: true, Cancel: cancel}
		if _, err := g.Before(ctx, bg); err != nil {
			t.Fatal(err)
		}
		client := &Request{SessionID: "s"}
		if _, err := g.Before(ctx, client); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(context.Cause(bctx), ErrPreempted) {
			t.Fatalf("the background call was not preempted: %v", context.Cause(bctx))
		}
		g.After(ctx, bg, &Response{})
		if st := g.Stats(); st.BackgroundCancelled != 1 || st.ClientWaits != 0 {
			t.Fatalf("stats %+v", st)
		}

		// While the client is in flight, a background call waits.
		started := make(chan time.Time, 1)
		go func() {
			if _, err := g.Before(ctx, &Request{Background: true}); err != nil {
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
		g.After(ctx, client, &Response{})
		at := <-started
		if d := at.Sub(done); d < 500*time.Millisecond {
			t.Fatalf("a background call started %v after the client, before the quiet period", d)
		}

		// A background call whose context ends first is not sent.
		g2 := NewGeneric(GenericOptions{Slots: 1})
		c2 := &Request{}
		g2.Before(ctx, c2)
		sctx, stop := context.WithTimeout(ctx, time.Second)
		defer stop()
		if _, err := g2.Before(sctx, &Request{Background: true}); !errors.Is(err, ErrBusy) {
			t.Fatalf("background call on a busy engine: %v", err)
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
			if r.Header.Get("User-Agent") != ProbeUserAgent {
				t.Errorf("probe User-Agent %q", r.Header.Get("User-Agent"))
			}
			w.Write([]byte(c.props))
		}))
		g := NewGeneric(GenericOptions{BaseURL: srv.URL + "/v1"})
		// A client in flight on every slot the engine may have.
		for range 4 {
			g.Before(context.Background(), &Request{})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := g.Before(ctx, &Request{Background: true})
		cancel()
		if got := g.Stats().Slots; got != c.want {
			t.Errorf("props %q: slots %d, want %d", c.props, got, c.want)
		}
		if c.want > 0 && !errors.Is(err, ErrBusy) || c.want == 0 && err != nil {
			t.Errorf("props %q: background call: %v", c.props, err)
		}
		srv.Close()
	}
}
