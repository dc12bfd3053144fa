package memory

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// seedTopics makes session id of user hold every topic's facts.
func seedTopics(t *testing.T, s *Store, tenant, id, user string) {
	t.Helper()
	turn, err := s.Prepare(context.Background(), TurnRequest{Tenant: tenant, SessionID: id, UserID: user, Mode: ModeAppend, Messages: []Message{text("user", "hello")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := turn.Complete(text("assistant", "hi")); err != nil {
		t.Fatal(err)
	}
	for _, tp := range topics {
		for _, f := range tp.facts {
			if _, err := s.AddMemory(tenant, id, CategoryFact, f, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// recallPlan asks Recall each query in turn, 20 s apart (the user reads
// and types), and returns the modes.
func recallPlan(t *testing.T, s *Store, id, user string, queries []string) []string {
	t.Helper()
	var modes []string
	for _, q := range queries {
		res, err := s.Recall(context.Background(), "t", id, user, q)
		if err != nil {
			t.Fatalf("Recall(%q): %v", q, err)
		}
		if len(res.Memories) == 0 {
			t.Fatalf("Recall(%q): nothing recalled (%s)", q, res.Mode)
		}
		modes = append(modes, res.Mode)
		time.Sleep(20 * time.Second)
	}
	return modes
}

func count(modes []string, m string) int {
	n := 0
	for _, x := range modes {
		if x == m {
			n++
		}
	}
	return n
}

// TestRecallDesignPlan measures the session working memory design's own
// test plan through Store.Recall (what the MCP tool session_recall runs):
// 10 messages on one topic cost 1–2 full recalls; on a conversation that
// switches topic, a full recall at each switch (the design expects one per
// switch; the numbers are logged for docs/BENCHMARKS.md).
func TestRecallDesignPlan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openBubbleStore(t, t.TempDir(), nil)
		// Two users: each session recalls its own facts only.
		seedTopics(t, s, "t", "continuing", "u1")
		seedTopics(t, s, "t", "switching", "u2")

		// Ten messages on one topic: the six volcano questions, then four
		// of them again in other words.
		cont := append(append([]string(nil), topics[0].questions...),
			"Remind me which volcano had lava flows?", "Any volcano ash warnings for the eruption tour?",
			"What volcanic rocks like obsidian can I collect?", "Is a lava volcano tour worth the budget?")
		modes := recallPlan(t, s, "continuing", "u1", cont)
		full := count(modes, "full")
		t.Logf("continuing topic: %d full recalls per %d messages %v", full, len(cont), modes)
		if full < 1 || full > 2 {
			t.Errorf("continuing topic: %d full recalls per 10 messages, want 1–2: %v", full, modes)
		}

		// Four topics, five messages each: three switches. Each switch
		// must cost a full recall (the probe sees the new topic); the
		// messages after it are reused while the probe's lexical hits stay
		// within the new active set, so a topic whose questions share few
		// words with each other (finance here: invoice, tax return,
		// budget) takes more than one.
		var sw []string
		for _, tp := range topics {
			sw = append(sw, tp.questions[:5]...)
		}
		modes = recallPlan(t, s, "switching", "u2", sw)
		for b := range len(topics) {
			block := modes[5*b : 5*b+5]
			t.Logf("topic %-10s %d full of 5 %v", topics[b].name, count(block, "full"), block)
			if block[0] != "full" {
				t.Errorf("topic %s: modes %v, want a full recall at the switch", topics[b].name, block)
			}
		}
		fullSw := count(modes, "full")
		t.Logf("topic switches: %d full recalls for %d topics (%d switches) over %d messages", fullSw, len(topics), len(topics)-1, len(sw))
		if fullSw > 2*len(topics) {
			t.Errorf("%d full recalls for %d topics, want at most 2 per topic", fullSw, len(topics))
		}

		st := s.Stats()
		if st.FullRecalls+st.ProbeReuses != int64(len(cont)+len(sw)) {
			t.Fatalf("stats: %d full + %d reuses, want %d recalls", st.FullRecalls, st.ProbeReuses, len(cont)+len(sw))
		}
	})
}

// TestRecallScope: Recall answers only the caller's own sessions: another
// tenant's, another end user's and a session without an end user asked by
// a named user (and the reverse) are ErrNotFound, like a missing one.
func TestRecallScope(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	seedTopics(t, s, "t", "alice-1", "alice")
	seedTopics(t, s, "t", "private", "")
	q := topics[1].questions[0]
	res, err := s.Recall(context.Background(), "t", "alice-1", "alice", q)
	if err != nil || res.Mode != "full" || len(res.Memories) == 0 {
		t.Fatalf("own session: %+v, %v", res, err)
	}
	if !strings.Contains(res.Memories[0].Text, "kubernetes") || res.Memories[0].Role != "fact" || res.Memories[0].At.IsZero() || res.Memories[0].ID == "" {
		t.Fatalf("best memory %+v", res.Memories[0])
	}
	if res, err := s.Recall(context.Background(), "t", "private", "", q); err != nil || len(res.Memories) == 0 {
		t.Fatalf("private session, no user named: %+v, %v", res, err)
	}
	for _, c := range []struct{ tenant, id, user string }{
		{"other", "alice-1", "alice"}, // another tenant
		{"t", "alice-1", "bob"},       // another end user
		{"t", "alice-1", ""},          // no end user named: not alice
		{"t", "private", "alice"},     // a private session
		{"t", "missing", "alice"},
	} {
		if _, err := s.Recall(context.Background(), c.tenant, c.id, c.user, q); !errors.Is(err, ErrNotFound) {
			t.Errorf("Recall(%q, %q, %q): %v, want ErrNotFound", c.tenant, c.id, c.user, err)
		}
	}
	for _, bad := range []string{"", "  \n", strings.Repeat("x", MaxRecallQueryBytes+1)} {
		if _, err := s.Recall(context.Background(), "t", "alice-1", "alice", bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("query of %d bytes: %v, want ErrInvalid", len(bad), err)
		}
	}
}

// TestRecallCrossSessionAndShared: a new session of a user recalls the
// user's earlier session, marked as another session's; the chat path and
// Recall share the working memory, so a recall on the topic a turn just
// recalled is a reuse; Recall writes nothing (the session's log and its
// units are unchanged).
func TestRecallCrossSessionAndShared(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	seedTopics(t, s, "t", "old", "carol")
	prepare := func(id, q string) *Turn {
		turn, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: id, UserID: "carol", Mode: ModeAppend, Messages: []Message{text("user", q)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := turn.Complete(text("assistant", "ok")); err != nil {
			t.Fatal(err)
		}
		return turn
	}
	prepare("new", "hello there")
	settle(t, s, "t", "old")
	res, err := s.Recall(context.Background(), "t", "new", "carol", "Why do my kubernetes pods crash with OOMKilled?")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Memories) == 0 || !res.Memories[0].OtherSession || !strings.Contains(res.Memories[0].Text, "OOMKilled") {
		t.Fatalf("cross-session recall: %+v", res)
	}

	turn := prepare("old", topics[2].questions[0])
	if turn.Stats.Recall != "full" {
		t.Fatalf("chat recall %q, want full", turn.Stats.Recall)
	}
	before, err := s.Memory("t", "old")
	if err != nil {
		t.Fatal(err)
	}
	sv, _ := s.Session("t", "old")
	res, err = s.Recall(context.Background(), "t", "old", "carol", topics[2].questions[1])
	if err != nil || res.Mode != "reuse" {
		t.Fatalf("recall after a turn on the topic: %+v, %v; want reuse", res, err)
	}
	after, _ := s.Memory("t", "old")
	sv2, _ := s.Session("t", "old")
	if len(after.Units) != len(before.Units) || len(sv2.Messages) != len(sv.Messages) || !sv2.UpdatedAt.Equal(sv.UpdatedAt) {
		t.Fatalf("Recall changed the session: %d → %d units, %d → %d messages", len(before.Units), len(after.Units), len(sv.Messages), len(sv2.Messages))
	}
	for i := range after.Units {
		if after.Units[i].AccessCount != before.Units[i].AccessCount {
			t.Fatalf("Recall touched unit %s", after.Units[i].ID)
		}
	}
}
