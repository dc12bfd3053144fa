package memory

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestModeDetection relates requests without a mode header to a stored
// conversation (u1 a1 u2 a2): each row is a client style, the mode taken,
// the match, and the history after the request. The header, when sent,
// wins.
func TestModeDetection(t *testing.T) {
	u1, a1, u2, a2 := text("user", "my cat is Tom"), text("assistant", "nice cat"), text("user", "he is grey"), text("assistant", "grey cats rule")
	sys := text("system", "be brief")
	u3 := text("user", "what colour is Tom?")
	a1b := msg(t, `{"content":"nice cat","role":"assistant"}`) // a1 re-serialized by the client
	cases := []struct {
		name  string
		mode  Mode
		req   []Message
		taken string
		match string
		hist  []Message // the stored history afterwards
	}{
		{"drop-in: system and the newest message", ModeAuto, []Message{sys, u3}, "append", "append", []Message{u1, a1, u2, a2, u3}},
		{"drop-in without system", ModeAuto, []Message{u3}, "append", "append", []Message{u1, a1, u2, a2, u3}},
		{"full history", ModeAuto, []Message{sys, u1, a1b, u2, a2, u3}, "full", "extend", []Message{u1, a1, u2, a2, u3}},
		{"retry of the same full request", ModeAuto, []Message{sys, u1, a1, u2, a2}, "full", "extend", []Message{u1, a1, u2, a2}},
		{"client trimmed its oldest turns", ModeAuto, []Message{sys, u2, a2, u3}, "full", "trimmed", []Message{u1, a1, u2, a2, u3}},
		{"edit of the second message", ModeAuto, []Message{sys, u1, a1, text("user", "he is black")}, "full", "diverged", []Message{u1, a1, text("user", "he is black")}},
		{"regenerate the last answer", ModeAuto, []Message{sys, u1, a1, u2}, "full", "diverged", []Message{u1, a1, u2}},
		{"trimmed client that edited", ModeAuto, []Message{sys, a1, text("user", "he is black")}, "full", "diverged", []Message{u1, a1, text("user", "he is black")}},
		{"reused id, another conversation", ModeAuto, []Message{sys, text("user", "hi"), text("assistant", "hello"), u3}, "full", "diverged",
			[]Message{text("user", "hi"), text("assistant", "hello"), u3}},
		{"header full wins over detection", ModeFull, []Message{sys, u3}, "full", "diverged", []Message{u3}},
		{"header append wins over detection", ModeAppend, []Message{sys, u1, a1}, "append", "append", []Message{u1, a1, u2, a2, u1, a1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, t.TempDir(), nil)
			prepare(t, s, "t", "s", ModeFull, sys, u1, a1, u2).Complete(a2)
			tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: tc.mode, Messages: tc.req})
			if err != nil {
				t.Fatal(err)
			}
			if tr.Stats.Mode != tc.taken || tr.Stats.Match != tc.match || tr.Stats.ModeDetected != (tc.mode == ModeAuto) {
				t.Fatalf("taken %s/%s (detected %v), want %s/%s", tr.Stats.Mode, tr.Stats.Match, tr.Stats.ModeDetected, tc.taken, tc.match)
			}
			tr.Abort()
			v, err := s.Session("t", "s")
			if err != nil {
				t.Fatal(err)
			}
			var got, want []string
			for _, m := range v.Messages {
				if !m.System && m.Tier != PlaceArchive {
					got = append(got, m.Role+":"+m.Content)
				}
			}
			for _, m := range tc.hist {
				want = append(want, m.Role+":"+m.Content)
			}
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Fatalf("history %q, want %q", got, want)
			}
			// Nothing is lost: a cut message stays as an archive unit.
			if tc.match == "diverged" {
				mem, _ := s.Memory("t", "s")
				kept := map[string]bool{}
				for _, u := range mem.Units {
					kept[u.Content] = true
				}
				for _, m := range []Message{u1, a1, u2, a2} {
					inHist := strings.Contains(strings.Join(got, "|"), m.Role+":"+m.Content)
					if !inHist && !kept[m.Content] {
						t.Fatalf("%q was cut and lost", m.Content)
					}
				}
			}
		})
	}
	// Counted by mode and how it was chosen.
	s := openStore(t, t.TempDir(), nil)
	prepare(t, s, "t", "x", ModeAuto, sys, u1).Complete(a1)
	prepare(t, s, "t", "x", ModeAuto, sys, u2).Complete(a2)
	prepare(t, s, "t", "x", ModeAppend, u3).Abort()
	if st := s.Stats(); st.FullDetected != 1 || st.AppendDetected != 1 || st.AppendNamed != 1 || st.FullNamed != 0 {
		t.Fatalf("mode counts %+v", st)
	}
}

// TestDropInClientKeepsItsConversation: a client sending only its system
// message and its newest message, with no header, builds one conversation
// the window is made from (issue 11: it was reset on every request).
func TestDropInClientKeepsItsConversation(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	sys := text("system", "You are terse.")
	for i := 0; i < 10; i++ {
		tr := prepare(t, s, "t", "s", ModeAuto, sys, text("user", fmt.Sprintf("fact %d: my locker code is %d", i, 1000+i)))
		if i > 0 && (tr.Stats.Match != "append" || len(tr.Messages) != 2*i+2) {
			t.Fatalf("turn %d: %s with %d messages", i, tr.Stats.Match, len(tr.Messages))
		}
		tr.Complete(text("assistant", fmt.Sprintf("noted %d", i)))
	}
	v, _ := s.Session("t", "s")
	if len(v.Messages) != 21 {
		t.Fatalf("stored %d messages, want 21", len(v.Messages))
	}
}
