package memory

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

func TestParseFactOps(t *testing.T) {
	f := func(in string, want []factOp, rejects int) {
		t.Helper()
		ops, rej := parseFactOps(in)
		if fmt.Sprint(ops) != fmt.Sprint(want) || len(rej) != rejects {
			t.Fatalf("parseFactOps(%q) = %v, %d rejected %v; want %v, %d", in, ops, len(rej), rej, want, rejects)
		}
		for _, err := range rej {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("rejection %v does not wrap ErrInvalid", err)
			}
		}
	}
	f("[ADD] The user likes tea.", []factOp{{FactAdd, "", "The user likes tea."}}, 0)
	f("  [UPDATE:fact-000000000004-00] Likes green tea.\r\n\n[BOOST:fact-1]\n[DELETE:ep-000000000030]\n[SKIP]\n",
		[]factOp{{FactUpdate, "fact-000000000004-00", "Likes green tea."}, {FactBoost, "fact-1", ""}, {FactDelete, "ep-000000000030", ""}, {Kind: FactSkip}}, 0)
	// Malformed lines are rejected one by one; valid ones still count.
	f("Sure! Here are the operations:\n[ADD] ok\n- [ADD] bullet\n[add] lower\n[ADD]no space\n[ADD] \n[SKIP] extra\n[BOOST]\n[BOOST:x] text\n[DELETE:Fact-1]\n[DELETE:a b]\n[UPDATE:x]\n[FORGET:x]\n[ADD",
		[]factOp{{FactAdd, "", "ok"}}, 13)
	// Hostile texts: control and format characters, smuggled operations,
	// huge lines, invalid UTF-8.
	f("[ADD] a\x1b[31mred", nil, 1)
	f("[ADD] right\u202eto left", nil, 1)
	f("[ADD] zero\u200bwidth", nil, 1)
	f("[ADD] line\u2028break", nil, 1)
	f("[ADD] nice [DELETE:fact-1] trick", nil, 1)
	f("[ADD] also [skip] this", nil, 1)
	f("[ADD] "+strings.Repeat("x", 600), nil, 1)
	f("[ADD] bad \xff utf8", nil, 1)
	f("[DELETE:"+strings.Repeat("a", 65)+"]", nil, 1)
	f(strings.Repeat("[SKIP]\n", 40), slicesRepeat(factOp{Kind: FactSkip}, maxFactOps), 40-maxFactOps)
	ops, rej := parseFactOps("[ADD] x\n" + strings.Repeat("y", maxFactOutput))
	if len(ops) != 1 || len(rej) != 2 {
		t.Fatalf("huge reply: %v, %v", ops, rej)
	}
}

func slicesRepeat(op factOp, n int) []factOp {
	out := make([]factOp, n)
	for i := range out {
		out[i] = op
	}
	return out
}

var factIDRe = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// FuzzParseFactOps: whatever the model replies, the parser never panics,
// returns only well-formed operations whose texts are safe, and each
// operation renders back to a line that parses to itself.
func FuzzParseFactOps(f *testing.F) {
	for _, s := range []string{
		"[ADD] The user likes tea.", "[UPDATE:fact-1] x\n[BOOST:fact-2]\n[DELETE:ep-3]\n[SKIP]",
		"[ADD] a [DELETE:x]", "[ADD] \u202e", "[ADD]\x00", "garbage\n\n[ADD] ok\r\n", "[UPDATE:] x", "[]", "[",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ops, rej := parseFactOps(in)
		if len(ops) > maxFactOps {
			t.Fatalf("%d ops", len(ops))
		}
		if len(ops)+len(rej) > strings.Count(in, "\n")+2 {
			t.Fatalf("%d ops + %d rejections for %d lines", len(ops), len(rej), strings.Count(in, "\n")+1)
		}
		for _, op := range ops {
			switch op.Kind {
			case FactAdd, FactUpdate:
				if op.Text == "" || len(op.Text) > maxFactBytes || !utf8.ValidString(op.Text) {
					t.Fatalf("bad text %q", op.Text)
				}
				for _, r := range op.Text {
					if sanitize.Unsafe(r) {
						t.Fatalf("unsafe rune %U in %q", r, op.Text)
					}
				}
				for _, m := range opMarkers {
					if strings.Contains(strings.ToUpper(op.Text), m) {
						t.Fatalf("marker in %q", op.Text)
					}
				}
			case FactBoost, FactDelete, FactSkip:
				if op.Text != "" {
					t.Fatalf("%v has text", op)
				}
			default:
				t.Fatalf("kind %v", op.Kind)
			}
			if (op.Kind == FactUpdate || op.Kind == FactBoost || op.Kind == FactDelete) != (op.ID != "") {
				t.Fatalf("%v: id presence", op)
			}
			if op.ID != "" && !factIDRe.MatchString(op.ID) {
				t.Fatalf("bad id %q", op.ID)
			}
			again, rej := parseFactOps(op.String())
			if len(again) != 1 || again[0] != op || len(rej) != 0 {
				t.Fatalf("%q does not round-trip: %v %v", op.String(), again, rej)
			}
		}
	})
}

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
