package knowledge

import (
	"strings"
	"testing"
)

// TestPrompts: each prompt shows what it is given, sanitized and bounded,
// and tells the model the exact forms ParseFactOps, ParseTriples,
// ParseReview and ParseToolContext accept.
func TestPrompts(t *testing.T) {
	long := strings.Repeat("x", 3*MaxPromptMsgBytes)
	msgs := []Line{{Role: "user", Text: "I live in Lisbon\u200b now"}, {Role: "assistant", Text: long}}
	fp := FactPrompt([]KnownFact{{ID: "fact-000000000001-00", Content: "The user likes tea.", Review: "promote"}}, msgs)
	for _, want := range []string{"[fact-000000000001-00] The user likes tea. (review: promote)", "user: I live in Lisbon now",
		"[ADD] <", "[UPDATE:<id>]", TripleInstructions} {
		if !strings.Contains(fp, want) {
			t.Errorf("fact prompt lacks %q", want)
		}
	}
	if strings.Contains(fp, long[:MaxPromptMsgBytes+1]) {
		t.Error("fact prompt shows a message beyond MaxPromptMsgBytes")
	}
	if got := FactPrompt(nil, msgs); !strings.Contains(got, "Known facts:\n(none)\n") {
		t.Errorf("fact prompt without facts: %q", got[:120])
	}
	if ep := EpisodePrompt(msgs[:1]); !strings.HasSuffix(ep, "user: I live in Lisbon now\n") {
		t.Errorf("episode prompt ends %q", ep[len(ep)-40:])
	}
	f := ReviewFact{ID: "fact-1", Content: "The user likes tea.", Importance: 2.5, Created: "2026-01-02", Promote: true}
	if rp := ReviewPrompt(f, 1, 3, ""); !strings.Contains(rp, "Memory [fact-1], importance 2.50, created 2026-01-02:") ||
		!strings.Contains(rp, "(2 searches left)") || !strings.Contains(rp, "core memory, shown") {
		t.Errorf("first round: %q", rp)
	}
	if rp := ReviewPrompt(f, 3, 3, "- fact: x\n"); !strings.Contains(rp, "This is the last round") || strings.Contains(rp, "[SEARCH:") ||
		!strings.Contains(rp, "Your searches so far:\n- fact: x\n") {
		t.Errorf("last round: %q", rp)
	}
	tp := ToolContextPrompt([]ToolLine{{Call: true, Text: "get_weather(city=Lisbon)"}, {Name: "get_weather", Text: long}}, 256)
	if !strings.Contains(tp, "assistant called: get_weather(city=Lisbon)\n") || !strings.Contains(tp, "tool result (get_weather): ") ||
		strings.Contains(tp, long[:200]) {
		t.Errorf("tool context prompt: %q", tp)
	}
}
