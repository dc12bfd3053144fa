package memory

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// scriptedExtractor answers fact prompts with the next scripted reply and
// episode prompts with a fixed summary; it records the prompts.
type scriptedExtractor struct {
	mu      sync.Mutex
	replies []string
	prompts []string
	reqs    []ExtractRequest
}

func (e *scriptedExtractor) Extract(_ context.Context, req ExtractRequest) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	prompt := req.Prompt
	e.prompts = append(e.prompts, prompt)
	e.reqs = append(e.reqs, req)
	if strings.HasPrefix(prompt, "Summarize") {
		return "The user and the assistant talked about \x00gardening\n and tomatoes.", nil
	}
	if len(e.replies) == 0 {
		return "[SKIP]", nil
	}
	r := e.replies[0]
	e.replies = e.replies[1:]
	return r, nil
}

func (e *scriptedExtractor) lastPrompt() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.prompts[len(e.prompts)-1]
}

func factsOf(t *testing.T, s *Store) map[string]Unit {
	t.Helper()
	mem, err := s.Memory("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Unit{}
	for _, u := range mem.Units {
		if u.Category != "" {
			out[u.ID] = u
		}
	}
	return out
}

// TestExtractionAppliesValidOpsOnly: facts come from the Extractor in the
// background; malformed, hostile and unknown-id operations are rejected and
// counted and change nothing; an episode is made after 30 messages.
func TestExtractionAppliesValidOpsOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := &scriptedExtractor{}
		dir := t.TempDir()
		s := openBubbleStore(t, dir, func(o *Options) { o.Extraction.Extractor = ex; o.Extraction.Every = 2 })
		turn := func(u, a string) {
			prepare(t, s, "t", "s", ModeAppend, text("user", u)).Complete(text("assistant", a))
			synctest.Wait() // the worker and the extractor are done
		}
		ex.replies = []string{"[ADD] The user grows tomatoes.\n[ADD] The user has a dog named Rex."}
		turn("I grow tomatoes and my dog Rex digs them up", "Fence the beds.")
		facts := factsOf(t, s)
		if len(facts) != 2 {
			t.Fatalf("facts %v", facts)
		}
		var tomato, rex string
		for id, u := range facts {
			if strings.Contains(u.Content, "tomatoes") {
				tomato = id
			} else {
				rex = id
			}
		}
		if !strings.Contains(ex.lastPrompt(), "user: I grow tomatoes") {
			t.Fatalf("prompt lacks the messages:\n%s", ex.lastPrompt())
		}

		before := s.Stats().FactOpsRejected
		ex.replies = []string{strings.Join([]string{
			"[UPDATE:" + rex + "] The user's dog is named Rex and is a terrier.",
			"[DELETE:" + tomato + "]",
			"[DELETE:fact-999999999999-00]",            // unknown id
			"[BOOST:msg-000000000001]",                 // not shown to the model
			"[ADD] evil \x1b[2J",                       // control characters
			"[ADD] fine [DELETE:" + rex + "] smuggled", // a second op inside a text
			"I think the user likes dogs.",             // prose
		}, "\n")}
		turn("Rex is a terrier by the way", "Terriers love digging.")
		facts = factsOf(t, s)
		if _, ok := facts[tomato]; ok || len(facts) != 1 || !strings.Contains(facts[rex].Content, "terrier") {
			t.Fatalf("after ops: %v", facts)
		}
		if got := s.Stats().FactOpsRejected - before; got != 5 {
			t.Fatalf("rejected %d, want 5", got)
		}
		if !strings.Contains(ex.lastPrompt(), "["+tomato+"] The user grows tomatoes.") || !strings.Contains(ex.lastPrompt(), "["+rex+"]") {
			t.Fatalf("prompt does not list the known facts:\n%s", ex.lastPrompt())
		}

		for i := 0; len(ex.prompts) < 40 && i < 14; i++ {
			turn(fmt.Sprintf("garden question %d", i), "answer")
		}
		var episodes []Unit
		for _, u := range factsOf(t, s) {
			if u.Category == CategoryEpisode {
				episodes = append(episodes, u)
			}
		}
		if len(episodes) != 1 || strings.ContainsAny(episodes[0].Content, "\x00\n") || episodes[0].ToSeq-episodes[0].FromSeq != 29 {
			t.Fatalf("episodes %+v", episodes)
		}
		st := s.Stats()
		if st.Episodes != 1 || st.ExtractJobs == 0 || st.FactOps < 4 {
			t.Fatalf("stats %+v", st)
		}
		// Everything survives a restart, and extraction does not redo old turns.
		s.Close()
		n := len(ex.prompts)
		s = openBubbleStore(t, dir, func(o *Options) { o.Extraction.Extractor = ex; o.Extraction.Every = 2 })
		if got := factsOf(t, s); len(got) != 2 {
			t.Fatalf("after restart: %v", got)
		}
		turn("one more", "sure")
		if len(ex.prompts) != n+1 || strings.Contains(ex.lastPrompt(), "garden question 3") {
			t.Fatalf("extraction after restart redid old turns: %d prompts\n%s", len(ex.prompts)-n, ex.lastPrompt())
		}
	})
}

// TestExtractionQueueDropsUnderOverload: with a blocked Extractor and a
// queue of one, further jobs are dropped and counted, never blocking a
// request.
func TestExtractionQueueDropsUnderOverload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		ex := ExtractorFunc(func(ctx context.Context, _ ExtractRequest) (string, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return "[SKIP]", nil
		})
		s := openBubbleStore(t, t.TempDir(), func(o *Options) { o.Extraction.Extractor = ex; o.Extraction.Every = 2; o.Extraction.Queue = 1 })
		for i := range 5 {
			id := fmt.Sprint("s", i)
			prepare(t, s, "t", id, ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
			synctest.Wait()
		}
		st := s.Stats()
		if st.ExtractDropped != 3 { // one running, one queued
			t.Fatalf("dropped %d, want 3 (%+v)", st.ExtractDropped, st)
		}
		close(release)
	})
}

// TestExtractionCoalescedPerTurn reproduces issue 12 row 13: one request
// of 2,000 messages caused 67 upstream calls, three of 1k, 5k and 20k
// messages 868 (20k is left out here for time). Extraction is coalesced per session: a turn starts at most
// one job, which covers every message that waited (the newest that fit
// one prompt); the calls carry the session's model.
func TestExtractionCoalescedPerTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := &scriptedExtractor{}
		s := openBubbleStore(t, t.TempDir(), func(o *Options) { o.Extraction.Extractor = ex })
		history := func(n int) []Message {
			msgs := make([]Message, 0, n+1)
			for i := 0; i < n; i++ {
				role := "user"
				if i%2 == 1 {
					role = "assistant"
				}
				msgs = append(msgs, text(role, fmt.Sprintf("message %d about topic %d", i, i%17)))
			}
			return append(msgs, text("user", "and now?"))
		}
		calls := func() int {
			ex.mu.Lock()
			defer ex.mu.Unlock()
			return len(ex.reqs)
		}
		for i, n := range []int{2000, 1000, 5000} {
			before := calls()
			tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: fmt.Sprint("big", i), Model: "llama-3-70b", Messages: history(n)})
			if err != nil {
				t.Fatal(err)
			}
			tr.Complete(text("assistant", "ok"))
			synctest.Wait()
			if got := calls() - before; got != 1 {
				t.Fatalf("a request of %d messages made %d extraction calls, want 1", n, got)
			}
			ex.mu.Lock()
			req := ex.reqs[len(ex.reqs)-1]
			ex.mu.Unlock()
			if req.Model != "llama-3-70b" || req.SessionID != fmt.Sprint("big", i) || len(req.Prompt) > 40<<10 {
				t.Fatalf("call %+v (prompt %d bytes)", req.Model, len(req.Prompt))
			}
		}
		// Nothing runs between turns; the next turn of a session starts at
		// most one more job.
		before := calls()
		time.Sleep(time.Hour)
		synctest.Wait()
		if got := calls() - before; got != 0 {
			t.Fatalf("%d calls without a client turn", got)
		}
		tr := prepare(t, s, "t", "big0", ModeAppend, text("user", "one more"))
		tr.Complete(text("assistant", "sure"))
		synctest.Wait()
		if got := calls() - before; got > 1 {
			t.Fatalf("one turn made %d calls", got)
		}
		st := s.Stats()
		if st.FactCalls+st.EpisodeCalls != int64(calls()) || st.Completes != 4 {
			t.Fatalf("stats %+v, %d calls", st, calls())
		}
	})
}
