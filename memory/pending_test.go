package memory

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
)

// TestPrepareWaitsForPreviousTurn: in append mode the next request of a
// session waits for the open turn's reply, so the history stays in order.
func TestPrepareWaitsForPreviousTurn(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		s, err := Open(Options{Dir: dir, Fsync: FsyncNever})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		t1 := prepare(t, s, "t", "s", ModeAppend, text("user", "first"))
		done := make(chan *Turn)
		go func() {
			t2, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "m", Messages: []Message{text("user", "second")}})
			if err != nil {
				t.Error(err)
			}
			done <- t2
		}()
		synctest.Wait() // the second request is blocked on the first turn
		select {
		case <-done:
			t.Fatal("second Prepare did not wait for the first turn")
		default:
		}
		if err := t1.Complete(text("assistant", "reply to first")); err != nil {
			t.Fatal(err)
		}
		t2 := <-done
		var got []string
		for _, r := range t2.Messages {
			var m Message
			json.Unmarshal(r, &m)
			got = append(got, m.Content)
		}
		if strings.Join(got, "|") != "first|reply to first|second" {
			t.Fatalf("window %q", got)
		}
		t2.Abort()
	})
}

// TestCloseStopsWorkerAndSummaries: Close cancels a summary in flight and
// waits for it and the worker; synctest fails the test if any goroutine
// the store started outlives the bubble.
func TestCloseStopsWorkerAndSummaries(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		started := make(chan struct{}, 1)
		blocking := SummarizerFunc(func(ctx context.Context, req SummaryRequest) (Summary, error) {
			started <- struct{}{}
			<-ctx.Done()
			return Summary{}, ctx.Err()
		})
		s, err := Open(Options{Dir: dir, Fsync: FsyncNever, Window: WindowOptions{Limit: 400, SystemReserve: 50, ToolsReserve: 50,
			Strategy: StrategySummary}, Extraction: ExtractionOptions{Summarizer: blocking}})
		if err != nil {
			t.Fatal(err)
		}
		var msgs []Message
		for i := 0; i < 10; i++ {
			msgs = append(msgs, text("user", strings.Repeat("filler words here ", 10)))
			tr := prepare(t, s, "t", "s", ModeFull, msgs...)
			a := text("assistant", "ok")
			tr.Complete(a)
			msgs = append(msgs, a)
		}
		<-started // a summary is in flight
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if s.Stats().SummaryErrors != 1 {
			t.Fatalf("summary errors %d, want 1 (cancelled)", s.Stats().SummaryErrors)
		}
	})
}
