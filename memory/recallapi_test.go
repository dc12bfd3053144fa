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

// recalls reports whether Recall's answer shows a memory containing want.
func recalls(res RecallResult, want string) bool {
	for _, m := range res.Memories {
		if strings.Contains(m.Text, want) {
			return true
		}
	}
	return false
}

// say records one drop-in turn of session id (user "" when none).
func say(t *testing.T, s *Store, tenant, id, user, q, a string) *Turn {
	t.Helper()
	turn := prepare2(t, s, tenant, id, user, text("user", q))
	if err := turn.Complete(text("assistant", a)); err != nil {
		t.Fatal(err)
	}
	return turn
}

// TestRecallFindsTheSessionsOwnTurns (issue 35): a short session whose turns
// are all still in the window, with no memory model extracting anything,
// finds what it said through Recall (what session_recall runs) as soon as
// the turn is recorded, in the user's words or the question's; a failed
// turn is not found; a restart keeps it; no other key or user finds it; and
// the recall block of a chat turn still shows only what the window does
// not.
func TestRecallFindsTheSessionsOwnTurns(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	say(t, s, "t", "s", "", "my telescope is named Orion-1 and it sits on the balcony", "what a lovely name")
	if res, err := s.Recall(context.Background(), "t", "s", "", "telescope name Orion balcony"); err != nil || !recalls(res, "Orion-1") || res.Mode != "full" {
		t.Fatalf("right after the turn: %+v, %v", res, err)
	}
	say(t, s, "t", "s", "", "I also bought a red kayak last summer", "nice")
	say(t, s, "t", "s", "", "what should I cook tonight?", "pasta")
	if v, err := s.Memory("t", "s"); err != nil || len(v.Units) != 0 {
		t.Fatalf("the test wants no unit at all (nothing extracted, nothing evicted): %+v, %v", v.Units, err)
	}
	for _, q := range []string{"what is my telescope called", "Where does the telescope sit?", "telescope"} {
		res, err := s.Recall(context.Background(), "t", "s", "", q)
		if err != nil || !recalls(res, "Orion-1") {
			t.Errorf("Recall(%q): %+v, %v", q, res, err)
		}
		if len(res.Memories) > 0 && (res.Memories[0].Role != "user" || res.Memories[0].ID == "" || res.Memories[0].At.IsZero()) {
			t.Errorf("Recall(%q): best memory %+v", q, res.Memories[0])
		}
	}
	if res, err := s.Recall(context.Background(), "t", "s", "", "kayak colour"); err != nil || !recalls(res, "red kayak") {
		t.Errorf("kayak: %+v, %v", res, err)
	}
	if res, err := s.Recall(context.Background(), "t", "s", "", "quantum chromodynamics"); err != nil || len(res.Memories) != 0 || res.Mode != "none" {
		t.Errorf("words the session never said: %+v, %v", res, err)
	}
	for _, c := range []struct{ tenant, user string }{{"other", ""}, {"t", "bob"}} {
		if _, err := s.Recall(context.Background(), c.tenant, "s", c.user, "telescope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("tenant %q user %q: %v, want ErrNotFound", c.tenant, c.user, err)
		}
	}

	// The chat path: the message is in the window, so the recall block
	// does not show it again.
	turn := prepare2(t, s, "t", "s", "", text("user", "what is my telescope called?"))
	if strings.Contains(string(turn.Block), "Orion-1") {
		t.Errorf("the recall block repeats a message in the window: %s", turn.Block)
	}
	if err := turn.Complete(text("assistant", "Orion-1")); err != nil {
		t.Fatal(err)
	}

	// A failed turn is not history, nor memory.
	turn = prepare2(t, s, "t", "s", "", text("user", "my passport number is ZX-4417"))
	if res, _ := s.Recall(context.Background(), "t", "s", "", "passport number"); !recalls(res, "ZX-4417") {
		t.Errorf("the turn in flight: %+v", res)
	}
	if err := turn.Fail(); err != nil {
		t.Fatal(err)
	}
	if res, _ := s.Recall(context.Background(), "t", "s", "", "passport number"); recalls(res, "ZX-4417") {
		t.Errorf("a failed turn is recalled: %+v", res)
	}

	// After a restart, from the saved index reconciled with the log.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, nil)
	if res, err := s.Recall(context.Background(), "t", "s", "", "what is my telescope called"); err != nil || !recalls(res, "Orion-1") {
		t.Errorf("after a restart: %+v, %v", res, err)
	}
	if res, _ := s.Recall(context.Background(), "t", "s", "", "passport number"); recalls(res, "ZX-4417") {
		t.Errorf("after a restart, a failed turn is recalled: %+v", res)
	}
	if st := s.Stats(); st.IndexRebuilds != 0 {
		t.Errorf("the saved index was rebuilt (%d), not reconciled", st.IndexRebuilds)
	}
}

// TestRecallOfEvictedAndWindowTurns: once a message leaves the window its
// unit takes its document over (no new embedding), and Recall finds both
// what left the window and what is in it.
func TestRecallOfEvictedAndWindowTurns(t *testing.T) {
	s := openStore(t, t.TempDir(), smallWindow)
	msgs := evictedSession(t, s)
	turn := prepare(t, s, "t", "s", ModeFull, msgs...)
	if err := turn.Complete(text("assistant", "Krakatoa, and my kettle is called Bertha")); err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]string{"favourite volcano": "Krakatoa", "kettle name": "Bertha"} {
		res, err := s.Recall(context.Background(), "t", "s", "", q)
		if err != nil || !recalls(res, want) {
			t.Errorf("Recall(%q): %+v, %v", q, res, err)
		}
	}
	sess, err := s.reg.session("t", "s", false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	defer sess.mu.Unlock()
	units, window := 0, 0
	for _, e := range sess.hist {
		id := msgUnitID(e.seq)
		d, ok := sess.ix.Get(id)
		switch u := sess.units[id]; {
		case e.dropped && u != nil:
			units++
			if !ok || d.Text != sess.docText(u) {
				t.Errorf("evicted %s: document %q, %v", id, d.Text, ok)
			}
		case !e.dropped:
			window++
			if !ok || d.Text != sess.windowDoc(e).Text {
				t.Errorf("in the window %s: document %q, %v", id, d.Text, ok)
			}
		}
	}
	if units == 0 || window == 0 {
		t.Fatalf("want messages both evicted (%d) and in the window (%d)", units, window)
	}
}

// TestRecallOfWindowByWordsWhileNotEmbedded: with a model's embeddings the
// worker indexes a turn after it; Recall finds it by its words before
// that, and while the embeddings endpoint is down.
func TestRecallOfWindowByWordsWhileNotEmbedded(t *testing.T) {
	f, e := newEmbeddingsServer(t)
	s := openStore(t, t.TempDir(), func(o *Options) { o.Recall.Index.Embedder = e })
	f.set(true, 0)
	say(t, s, "t", "s", "", "my telescope is named Orion-1 and it sits on the balcony", "what a lovely name")
	for _, q := range []string{"telescope name Orion balcony", "what is my telescope called"} {
		if res, err := s.Recall(context.Background(), "t", "s", "", q); err != nil || !recalls(res, "Orion-1") {
			t.Errorf("endpoint down: Recall(%q): %+v, %v", q, res, err)
		}
	}
	f.set(false, 0)
	say(t, s, "t", "s", "", "the kayak is red", "ok")
	if res, err := s.Recall(context.Background(), "t", "s", "", "kayak colour"); err != nil || !recalls(res, "kayak is red") {
		t.Errorf("endpoint up: %+v, %v", res, err)
	}
}

// TestReuseSearchesTheTopicsWords: on the active topic the working memory
// skips the full retrieval, not the words: a new question on the topic
// still finds a memory only its own words reach, beyond the probe's few
// hits and the previous set.
func TestReuseSearchesTheTopicsWords(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Recall.K = 7 })
	say(t, s, "t", "s", "", "hello", "hi")
	for _, f := range []string{
		"Etna volcano eruption lava flow red hot river one",
		"Etna volcano eruption lava flow red hot river two",
		"Etna volcano eruption lava flow red hot river three",
		"Etna volcano eruption lava flow red hot river four",
		"Etna volcano eruption lava flow red hot river five",
		"Etna volcano eruption lava flow red hot river six",
		"The Etna volcano eruption left ash on the Catania airport",
		"an ash tree grows in the garden",
		"ash wood makes good baseball bats",
	} {
		if _, err := s.AddMemory("t", "s", CategoryFact, f, 1); err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.Recall(context.Background(), "t", "s", "", "lava flow red hot river")
	if err != nil || first.Mode != "full" || recalls(first, "Catania") {
		t.Fatalf("first recall: %+v, %v", first, err)
	}
	next, err := s.Recall(context.Background(), "t", "s", "", "Etna volcano eruption lava flow red hot river, and the ash?")
	if err != nil || next.Mode != "reuse" {
		t.Fatalf("the same topic: %+v, %v", next, err)
	}
	if !recalls(next, "Catania airport") {
		t.Fatalf("the topic's new memory is not found: %+v", next)
	}
}
