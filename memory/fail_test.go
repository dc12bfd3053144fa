package memory

import (
	"testing"
)

// TestFailedTurnIsNotHistory: a turn whose upstream answer failed leaves no
// message (before and after a restart), so a client's retry of the same
// message is stored once; a failed turn after which the history moved on
// keeps its messages (nothing is reordered).
func TestFailedTurnIsNotHistory(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	contents := func(s *Store, id string) []string {
		t.Helper()
		v, err := s.Session("t", id)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range v.Messages {
			if m.Role != "system" {
				out = append(out, m.Role+":"+m.Content)
			}
		}
		return out
	}
	tr := prepare(t, s, "t", "a", ModeAppend, text("user", "hello"))
	if err := tr.Complete(text("assistant", "hi")); err != nil {
		t.Fatal(err)
	}
	// The upstream answers 429; the client retries the same message.
	if err := prepare(t, s, "t", "a", ModeAppend, text("user", "what is new")).Fail(); err != nil {
		t.Fatal(err)
	}
	if got := contents(s, "a"); len(got) != 2 {
		t.Fatalf("a failed turn stayed in the history: %q", got)
	}
	tr = prepare(t, s, "t", "a", ModeAppend, text("user", "what is new"))
	if err := tr.Complete(text("assistant", "nothing")); err != nil {
		t.Fatal(err)
	}
	want := []string{"user:hello", "assistant:hi", "user:what is new", "assistant:nothing"}
	if got := contents(s, "a"); !equalStrings(got, want) {
		t.Fatalf("history %q, want %q", got, want)
	}
	// A full-history client whose retry sends the same messages.
	full := []Message{text("user", "one")}
	prepare(t, s, "t", "b", ModeFull, full...).Fail()
	tr = prepare(t, s, "t", "b", ModeFull, full...)
	if err := tr.Complete(text("assistant", "two")); err != nil {
		t.Fatal(err)
	}
	// A failed turn that changed the system messages changes them back.
	tr = prepare(t, s, "t", "d", ModeAppend, text("system", "be brief"), text("user", "q1"))
	if err := tr.Complete(text("assistant", "a1")); err != nil {
		t.Fatal(err)
	}
	prepare(t, s, "t", "d", ModeAppend, text("system", "be verbose"), text("user", "q2")).Fail()
	sysOf := func(s *Store) string {
		v, _ := s.Session("t", "d")
		return v.Messages[0].Role + ":" + v.Messages[0].Content
	}
	if got := sysOf(s); got != "system:be brief" {
		t.Fatalf("system after a failed turn: %q", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, nil)
	if got := sysOf(s); got != "system:be brief" {
		t.Fatalf("system after a failed turn and a restart: %q", got)
	}
	if got := contents(s, "a"); !equalStrings(got, want) {
		t.Fatalf("after a restart: history %q, want %q", got, want)
	}
	if got := contents(s, "b"); !equalStrings(got, []string{"user:one", "assistant:two"}) {
		t.Fatalf("after a restart: full-history session %q", got)
	}
	if st := s.Stats(); st.Undone != 0 {
		t.Fatalf("a fresh store counts %d undone", st.Undone)
	}

	// History moved on past the failed turn: its message stays.
	t1 := prepare(t, s, "t", "c", ModeAppend, text("user", "first"))
	s.opts.PendingWait = -1
	t2 := prepare(t, s, "t", "c", ModeAppend, text("user", "second"))
	if err := t1.Fail(); err != nil {
		t.Fatal(err)
	}
	if err := t2.Complete(text("assistant", "ok")); err != nil {
		t.Fatal(err)
	}
	if got := contents(s, "c"); !equalStrings(got, []string{"user:first", "user:second", "assistant:ok"}) {
		t.Fatalf("a failed turn under a later one: %q", got)
	}
}

// TestRetryAfterPartialReplyIsStoredOnce: an upstream broke a streamed
// answer after some content (recorded as a partial reply); the drop-in
// client retries the same message: the session holds the message once,
// with the retry's answer and not the partial one.
func TestRetryAfterPartialReplyIsStoredOnce(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	tr := prepare(t, s, "t", "a", ModeAuto, text("system", "sys"), text("user", "tell me a story"))
	if err := tr.CompletePartial(text("assistant", "Once upon a")); err != nil {
		t.Fatal(err)
	}
	tr = prepare(t, s, "t", "a", ModeAuto, text("system", "sys"), text("user", "tell me a story"))
	if tr.Stats.Match != "retry" {
		t.Fatalf("match %q", tr.Stats.Match)
	}
	if err := tr.Complete(text("assistant", "Once upon a time, the end.")); err != nil {
		t.Fatal(err)
	}
	v, _ := s.Session("t", "a")
	var got []string
	for _, m := range v.Messages {
		got = append(got, m.Role+":"+m.Content)
	}
	want := []string{"system:sys", "user:tell me a story", "assistant:Once upon a time, the end."}
	if !equalStrings(got, want) {
		t.Fatalf("history %q, want %q", got, want)
	}
	// The same message after a whole answer is a new turn.
	tr = prepare(t, s, "t", "a", ModeAuto, text("user", "tell me a story"))
	if tr.Stats.Match == "retry" {
		t.Fatal("a repeated message after a complete answer taken for a retry")
	}
	tr.Abort()
}
