package memory

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
)

// reviewExtractor answers review rounds from a script, condenses tool
// context with toolReply, and skips everything else. With gate set, a
// review call waits for it.
type reviewExtractor struct {
	mu       sync.Mutex
	review   []string
	prompts  []string // review prompts
	toolReq  []string // tool-context prompts
	toolRep  string
	gate     chan struct{}
	reviewed int
}

func (e *reviewExtractor) Extract(ctx context.Context, req ExtractRequest) (string, error) {
	e.mu.Lock()
	switch req.Kind {
	case "review":
		e.prompts = append(e.prompts, req.Prompt)
		e.reviewed++
		gate := e.gate
		r := "[KEEP]"
		if len(e.review) > 0 {
			r, e.review = e.review[0], e.review[1:]
		}
		e.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		return r, nil
	case "tool_context":
		e.toolReq = append(e.toolReq, req.Prompt)
		r := e.toolRep
		e.mu.Unlock()
		return r, nil
	}
	e.mu.Unlock()
	return "[SKIP]", nil
}

func (e *reviewExtractor) script(replies ...string) {
	e.mu.Lock()
	e.review = replies
	e.mu.Unlock()
}

func openReviewStore(t *testing.T, dir string, ex Extractor) *Store {
	return openBubbleStore(t, dir, func(o *Options) {
		o.Extraction.Extractor = ex
		o.Extraction.Every, o.Extraction.EpisodeEvery = -1, -1
		o.Reviewer.Enabled = true
		o.ToolContext.Enabled = true
	})
}

func addFact(t *testing.T, s *Store, txt string, imp float64) string {
	t.Helper()
	u, err := s.AddMemory("t", "s", CategoryFact, txt, imp)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Wait() // the worker, the review and its log write are done
	return u.ID
}

func lastReview(t *testing.T, s *Store) Review {
	t.Helper()
	rs, err := s.Reviews("t", "", 1)
	if err != nil || len(rs) != 1 {
		t.Fatalf("Reviews: %v, %v", rs, err)
	}
	return rs[0]
}

// TestReviewerVerdicts: each verdict is applied as documented; a search
// shows the scope's related memories in the next round; malformed answers
// and running out of rounds change nothing; the decisions survive a
// restart, newest first.
func TestReviewerVerdicts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := &reviewExtractor{}
		dir := t.TempDir()
		s := openReviewStore(t, dir, ex)
		prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
		synctest.Wait()

		ex.script("[PROMOTE] a lasting fact about the user")
		id := addFact(t, s, "The user's name is Ada Lovelace.", 3)
		if u, _ := unitByID(t, s, id); u.Category != CategoryCore {
			t.Fatalf("PROMOTE: %+v", u)
		}
		if r := lastReview(t, s); r.FactID != id || r.Decision != ReviewPromote || r.Rounds != 1 || r.Trigger != "promote" ||
			r.Reason != "a lasting fact about the user" || r.Session != "s" {
			t.Fatalf("PROMOTE logged %+v", r)
		}

		ex.script("[KEEP] still useful")
		id = addFact(t, s, "The user prefers window seats.", 2.6)
		if u, _ := unitByID(t, s, id); u.Category != CategoryFact || u.Importance != 0.5 {
			t.Fatalf("KEEP: %+v", u)
		}

		ex.script("[DELETE] worthless")
		id = addFact(t, s, "The user said ok.", 2.5)
		if _, ok := unitByID(t, s, id); ok {
			t.Fatal("DELETE left the fact")
		}
		if r := lastReview(t, s); r.Decision != ReviewDelete {
			t.Fatalf("DELETE logged %+v", r)
		}

		// A search, then a verdict: the second round shows what it found.
		addFact(t, s, "The user's cat is called Tom.", 1)
		ex.script("[SEARCH:cat]", "[DELETE] duplicate of the cat's name")
		id = addFact(t, s, "The user has a cat.", 2.7)
		if _, ok := unitByID(t, s, id); ok {
			t.Fatal("SEARCH then DELETE left the fact")
		}
		ex.mu.Lock()
		second := ex.prompts[len(ex.prompts)-1]
		ex.mu.Unlock()
		if !strings.Contains(second, "[SEARCH:cat] found:") || !strings.Contains(second, "Tom") || strings.Contains(second, "found:\n- fact: The user has a cat.") {
			t.Fatalf("second round does not show the search:\n%s", second)
		}
		if r := lastReview(t, s); r.Decision != ReviewDelete || r.Rounds != 2 {
			t.Fatalf("SEARCH+DELETE logged %+v", r)
		}

		// Malformed answers and too many rounds change nothing, and the
		// fact is not reviewed again until it changes.
		for _, c := range []struct {
			replies  []string
			decision string
			rounds   int
		}{
			{[]string{"I would keep it. [KEEP]"}, ReviewMalformed, 1},
			{[]string{"[KEEP]\n[DELETE]"}, ReviewMalformed, 1},
			{[]string{"[SEARCH:x] [KEEP]"}, ReviewMalformed, 1},
			{[]string{"[SEARCH:a]", "[ARCHIVE]"}, ReviewMalformed, 2},
			{[]string{"[SEARCH:a]", "[SEARCH:b]", "[SEARCH:c]"}, ReviewUndecided, 3},
		} {
			ex.script(c.replies...)
			id := addFact(t, s, "Undecidable fact "+c.replies[0], 3)
			u, _ := unitByID(t, s, id)
			if r := lastReview(t, s); r.FactID != id || r.Decision != c.decision || r.Rounds != c.rounds || u.Category != CategoryFact || u.Importance != 3 {
				t.Fatalf("%q: logged %+v, fact %+v", c.replies, r, u)
			}
		}
		ex.mu.Lock()
		calls := ex.reviewed
		ex.mu.Unlock()
		prepare(t, s, "t", "s", ModeAppend, text("user", "zzz")).Complete(text("assistant", "ok"))
		synctest.Wait()
		if ex.reviewed != calls {
			t.Fatal("a fact was reviewed again without changing")
		}
		st := s.Stats()
		if st.Reviews != 9 || st.ReviewsPromoted != 1 || st.ReviewsKept != 1 || st.ReviewsDeleted != 2 || st.ReviewsMalformed != 4 ||
			st.ReviewsUndecided != 1 || st.ReviewCalls != int64(calls) {
			t.Fatalf("stats %+v", st.ReviewStats)
		}

		// The log survives a restart; another user's is empty.
		want, _ := s.Reviews("t", "", 0)
		s.Close()
		s = openReviewStore(t, dir, ex)
		got, err := s.Reviews("t", "", 0)
		if err != nil || len(got) != 9 || len(want) != 9 || got[0] != want[0] || got[8] != want[8] || got[8].Decision != ReviewPromote {
			t.Fatalf("after restart: %v %v", got, err)
		}
		if rs, err := s.Reviews("t", "bob", 0); err != nil || len(rs) != 0 {
			t.Fatalf("another user: %v %v", rs, err)
		}
		// After the restart the facts still past a threshold, unchanged
		// since their review, are not reviewed again.
		ex.mu.Lock()
		calls = ex.reviewed
		ex.mu.Unlock()
		prepare(t, s, "t", "s", ModeAppend, text("user", "back again")).Complete(text("assistant", "ok"))
		synctest.Wait()
		ex.mu.Lock()
		again := ex.reviewed - calls
		ex.mu.Unlock()
		if again != 0 {
			t.Fatalf("%d review calls after the restart for facts reviewed before it", again)
		}
		if rs, _ := s.Reviews("t", "", 2); len(rs) != 2 || rs[0] != want[0] {
			t.Fatalf("limit 2: %v", rs)
		}
	})
}

// TestReviewerDecayAndStale: a fact decaying below 0.5 is reviewed; a
// verdict about a fact edited while the review ran is not applied.
func TestReviewerDecayAndStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := &reviewExtractor{}
		s := openReviewStore(t, t.TempDir(), ex)
		prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
		id := addFact(t, s, "The user lives in Lisbon.", 0.55)
		if n := s.Stats().Reviews; n != 0 {
			t.Fatalf("%d reviews of a fact above the thresholds", n)
		}
		ex.script("[KEEP] still true")
		time.Sleep(6 * day) // 0.55 × 0.85 < 0.5
		prepare(t, s, "t", "s", ModeAppend, text("user", "zzz")).Complete(text("assistant", "ok"))
		synctest.Wait()
		r := lastReview(t, s)
		if u, _ := unitByID(t, s, id); r.Decision != ReviewKeep || r.Trigger != "demote" || u.Importance != 0.5 {
			t.Fatalf("decay review %+v, fact %+v", r, u)
		}

		// Stale: the operator edits the fact while the model thinks.
		ex.mu.Lock()
		ex.gate = make(chan struct{})
		ex.mu.Unlock()
		ex.script("[DELETE] outdated")
		id = addFact(t, s, "The user works at Acme.", 3) // the review waits at the gate
		edited := "The user works at Globex."
		if _, err := s.UpdateMemory("t", "s", id, MemoryEdit{Text: &edited}); err != nil {
			t.Fatal(err)
		}
		close(ex.gate)
		synctest.Wait()
		u, ok := unitByID(t, s, id)
		if r := lastReview(t, s); !ok || u.Content != edited || r.Decision != ReviewStale || s.Stats().ReviewsStale != 1 {
			t.Fatalf("stale verdict: fact %+v (%v), logged %+v", u, ok, r)
		}
	})
}

func toolTurn(t *testing.T) []Message {
	return []Message{
		text("system", "You are terse."),
		text("user", "What is the weather in Paris?"),
		msg(t, `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}`),
		msg(t, `{"role":"tool","tool_call_id":"call_1","content":"{\"temp_c\":21,\"sky\":\"sunny\"}"}`),
	}
}

// TestToolContextNextTurnOnly: a turn's tool calls and results are
// condensed in the background, shown in the next turn's recall block
// only, and stored nowhere.
func TestToolContextNextTurnOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const sentence = "get_weather reported 21°C and sunny skies in Paris."
		ex := &reviewExtractor{toolRep: sentence}
		dir := t.TempDir()
		s := openReviewStore(t, dir, ex)
		hist := toolTurn(t)
		turn := func(user string) *Turn {
			hist = append(hist, text("user", user))
			tn := prepare(t, s, "t", "s", ModeFull, hist...)
			reply := text("assistant", "Noted: "+user)
			tn.Complete(reply)
			hist = append(hist, reply)
			synctest.Wait()
			return tn
		}
		t1 := prepare(t, s, "t", "s", ModeFull, hist...)
		t1.Complete(text("assistant", "It is sunny and 21°C in Paris."))
		hist = append(hist, text("assistant", "It is sunny and 21°C in Paris."))
		synctest.Wait()
		ex.mu.Lock()
		prompts := append([]string(nil), ex.toolReq...)
		ex.mu.Unlock()
		if len(prompts) != 1 || !strings.Contains(prompts[0], "get_weather") || !strings.Contains(prompts[0], "sunny") {
			t.Fatalf("condensing prompts %q", prompts)
		}
		t2 := turn("Should I take an umbrella?")
		if t2.Block == nil || !strings.Contains(string(t2.Block), knowledge.ToolCtxHeader+sentence) {
			t.Fatalf("turn 2 block %s", t2.Block)
		}
		t3 := turn("Thanks.")
		// Turn 3 makes no new tool context; turn 2's block stays in the
		// transcript where it was sent (the prompt only grows).
		if strings.Contains(string(t3.Block), "get_weather reported") {
			t.Fatalf("turn 3's own block shows the tool context again: %s", t3.Block)
		}
		shown := 0
		for _, m := range t3.Messages {
			if strings.Contains(string(m), "get_weather reported") {
				shown++
			}
		}
		if shown != 1 {
			t.Fatalf("turn 3's window shows the tool context %d times, want once (turn 2's block, kept)", shown)
		}
		if st := s.Stats(); st.ToolContextCalls != 1 || st.ToolContextInjected != 1 {
			t.Fatalf("stats %+v", st.ToolContextStats)
		}
		mem, _ := s.Memory("t", "s")
		for _, u := range mem.Units {
			if strings.Contains(u.Content, "get_weather reported") {
				t.Fatalf("the tool context became a unit: %+v", u)
			}
		}
		// Kept only inside turn 2's recall block, as it was sent: after a
		// restart turn 3's window still shows it once and no memory holds it.
		s.Close()
		s = openReviewStore(t, dir, ex)
		t4 := prepare(t, s, "t", "s", ModeFull, append(slices.Clone(hist), text("user", "And tomorrow?"))...)
		shown = 0
		for _, m := range t4.Messages {
			if strings.Contains(string(m), "get_weather reported") {
				shown++
			}
		}
		t4.Abort()
		if shown != 1 {
			t.Fatalf("after a restart the window shows the tool context %d times, want once", shown)
		}
	})
}

// TestToolContextCallFromThePreviousReply: the usual flow, where the
// assistant's tool call was the previous turn's reply and the request
// brings only the result; the condensing prompt still names the call.
func TestToolContextCallFromThePreviousReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := &reviewExtractor{toolRep: "get_weather: sunny, 21°C in Paris."}
		s := openReviewStore(t, t.TempDir(), ex)
		full := toolTurn(t)
		call, result := full[2], full[3]
		hist := full[:2]
		t1 := prepare(t, s, "t", "s", ModeFull, hist...)
		t1.Complete(call) // the model asked for the tool
		synctest.Wait()
		hist = append(slices.Clone(hist), call, result)
		prepare(t, s, "t", "s", ModeFull, hist...).Complete(text("assistant", "Sunny, 21°C."))
		synctest.Wait()
		ex.mu.Lock()
		prompts := append([]string(nil), ex.toolReq...)
		ex.mu.Unlock()
		if len(prompts) != 1 || !strings.Contains(prompts[0], "get_weather") || !strings.Contains(prompts[0], "sunny") {
			t.Fatalf("condensing prompts %q", prompts)
		}
	})
}

// TestToolContextRejected: a malformed (too long) or failed condensing
// shows nothing.
func TestToolContextRejected(t *testing.T) {
	for name, ex := range map[string]Extractor{
		"too long": &reviewExtractor{toolRep: strings.Repeat("The tool said many things. ", 40)},
		"failed": ExtractorFunc(func(_ context.Context, req ExtractRequest) (string, error) {
			if req.Kind == "tool_context" {
				return "", errors.New("upstream down")
			}
			return "[SKIP]", nil
		}),
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := openReviewStore(t, t.TempDir(), ex)
				hist := toolTurn(t)
				prepare(t, s, "t", "s", ModeFull, hist...).Complete(text("assistant", "Sunny."))
				synctest.Wait()
				hist = append(hist, text("assistant", "Sunny."), text("user", "Umbrella?"))
				t2 := prepare(t, s, "t", "s", ModeFull, hist...)
				if strings.Contains(string(t2.Block), knowledge.ToolCtxHeader) {
					t.Fatalf("a rejected context was shown: %s", t2.Block)
				}
				if st := s.Stats(); st.ToolContextCalls != 1 || st.ToolContextRejected != 1 || st.ToolContextInjected != 0 {
					t.Fatalf("stats %+v", st.ToolContextStats)
				}
			})
		})
	}
}

// TestToolContextLate: a context that comes back after the next turn was
// prepared is dropped, never shown a turn later.
func TestToolContextLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		ex := ExtractorFunc(func(ctx context.Context, req ExtractRequest) (string, error) {
			if req.Kind == "tool_context" {
				<-gate
				return "get_weather reported sunny skies.", nil
			}
			return "[SKIP]", nil
		})
		s := openReviewStore(t, t.TempDir(), ex)
		hist := toolTurn(t)
		prepare(t, s, "t", "s", ModeFull, hist...).Complete(text("assistant", "Sunny."))
		synctest.Wait() // the condensing call waits at the gate
		hist = append(hist, text("assistant", "Sunny."), text("user", "Umbrella?"))
		t2 := prepare(t, s, "t", "s", ModeFull, hist...)
		close(gate)
		t2.Complete(text("assistant", "No."))
		synctest.Wait()
		hist = append(hist, text("assistant", "No."), text("user", "Thanks."))
		t3 := prepare(t, s, "t", "s", ModeFull, hist...)
		for _, b := range []string{string(t2.Block), string(t3.Block)} {
			if strings.Contains(b, knowledge.ToolCtxHeader) {
				t.Fatalf("a late context was shown: %s", b)
			}
		}
		if st := s.Stats(); st.ToolContextLate != 1 || st.ToolContextInjected != 0 {
			t.Fatalf("stats %+v", st.ToolContextStats)
		}
	})
}
