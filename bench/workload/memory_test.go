package workload

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory"
)

// TestLocomoReplayTurns: speaker A's runs become user messages, B's runs
// the replies; each LoCoMo session's first message carries its date.
func TestLocomoReplayTurns(t *testing.T) {
	c := LocomoConversation{SpeakerA: "Ann", SessionTimes: map[int]string{1: "1 May", 2: "2 May"}, Turns: []LocomoTurn{
		{Speaker: "Ann", Text: "hi", Session: 1}, {Speaker: "Ann", Text: "news", Session: 1},
		{Speaker: "Bo", Text: "hey", Session: 1}, {Speaker: "Ann", Text: "bye", Session: 1},
		{Speaker: "Bo", Text: "morning", Session: 2}, {Speaker: "Ann", Text: "yo", Session: 2},
	}}
	got := locomoReplay(c)
	want := []replayTurn{
		{"(1 May)\nAnn: hi\nAnn: news", "Bo: hey"},
		{"Ann: bye", "I see."},
		{"(2 May)", "Bo: morning"},
		{"Ann: yo", "I see."},
	}
	if len(got) != len(want) {
		t.Fatalf("%d turns %q", len(got), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("turn %d %q, want %q", i, got[i], want[i])
		}
	}
}

// TestTrimmedKeepsNewestThatFit: the trimming baseline keeps the system
// message, the question, and the newest messages that fit the window.
func TestTrimmedKeepsNewestThatFit(t *testing.T) {
	r := &memRun{o: MemoryOptions{WindowTokens: 40}, tok: memory.NewTokenizer(0), enc: memory.CL100K}
	msgs := []memMsg{{"system", "sys"}}
	for _, w := range []string{"one", "two", "three", "four", "five", "six", "seven", "eight"} {
		msgs = append(msgs, memMsg{"user", w + " " + w})
	}
	msgs = append(msgs, memMsg{"user", "question?"})
	p, err := r.trimmed(msgs)
	if err != nil {
		t.Fatal(err)
	}
	var kept []memMsg
	if err := json.Unmarshal(mustJSON(t, p.raws), &kept); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range p.tokens {
		total += n
	}
	if kept[0].Content != "sys" || kept[len(kept)-1].Content != "question?" || total > 40 || len(kept) < 4 {
		t.Fatalf("kept %q (%d tokens)", kept, total)
	}
	if kept[len(kept)-2].Content != "eight eight" || strings.Contains(p.text, "one one") {
		t.Fatalf("not the newest: %q", kept)
	}
}

func mustJSON(t *testing.T, raws []json.RawMessage) []byte {
	t.Helper()
	b, err := json.Marshal(raws)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPrefixAccounting: a turn whose prompt starts with the whole previous
// one (its recall block included: blocks stay in the transcript) is
// stable; a turn that dropped history counts as an eviction; the cached
// share counts, over every turn, the previous prompt's leading messages
// the new one repeats, of the new prompt's tokens.
func TestPrefixAccounting(t *testing.T) {
	r := &memRun{tok: memory.NewTokenizer(0), enc: memory.CL100K}
	prompt := func(msgs ...memMsg) promptInfo {
		b, _ := json.Marshal(msgs)
		p, err := r.parsePrompt(b)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	sum := func(p promptInfo, n int) (s int) {
		for _, t := range p.tokens[:n] {
			s += t
		}
		return s
	}
	sys, h1, h2 := memMsg{"system", "sys"}, memMsg{"user", "h one"}, memMsg{"assistant", "h two"}
	blk := memMsg{"system", memory.RecallBlockPrefix + ": x"}
	u1, a1, u2 := memMsg{"user", "q1"}, memMsg{"assistant", "a1"}, memMsg{"user", "q2"}
	first := prompt(sys, h1, h2, blk, u1)
	second := prompt(sys, h1, h2, blk, u1, a1, u2) // grows: stable
	third := prompt(sys, h2, u1, a1, u2)           // h1 left the window
	var acc prefixAcc
	acc.add(first)
	acc.add(second)
	acc.add(third)
	rep := acc.report()
	if rep.Turns != 2 || rep.Stable != 1 || rep.Evictions != 1 {
		t.Fatalf("%+v", rep)
	}
	if rep.SharedPct != 100 {
		t.Fatalf("shared %.1f%% on a stable turn, want 100%%", rep.SharedPct)
	}
	cached := sum(first, 5) + sum(second, 1)
	if want := recallRound1(100 * float64(cached) / float64(sum(second, 7)+sum(third, 5))); rep.CachedPct != want {
		t.Fatalf("cached %.1f%%, want %.1f%%", rep.CachedPct, want)
	}
	// An engine that moves KV also serves h2, u1, a1 and u2 of the third
	// prompt: they follow each other in the second, the block between
	// them skipped, as llama-server's chunk walk does.
	shifted := cached + sum(third, 5) - sum(third, 1)
	if want := recallRound1(100 * float64(shifted) / float64(sum(second, 7)+sum(third, 5))); rep.ShiftCachedPct != want {
		t.Fatalf("shift cached %.1f%%, want %.1f%%", rep.ShiftCachedPct, want)
	}
	// A new message before the kept ones stops the walk.
	if got := movedTokens(&second, &third, 1); got != sum(third, 5)-sum(third, 1) {
		t.Fatalf("moved %d", got)
	}
	if got := movedTokens(&second, ptr(prompt(sys, memMsg{"user", "new"}, h2, u1)), 1); got != 0 {
		t.Fatalf("moved %d after a new message", got)
	}
}

func ptr[T any](v T) *T { return &v }

// TestLocomoExtraction: the benchmark's stand-in for the model states each
// turn of a fact prompt's new messages as a fact and its rule-based
// triples on it ("+n", the n-th fact); a turn the store would reject is
// left out, so the references stay right; other calls get [SKIP].
func TestLocomoExtraction(t *testing.T) {
	turns := []LocomoTurn{
		{Speaker: "Ann", DiaID: "D1:1", Text: "I adopted a puppy named Rex."},
		{Speaker: "Ann", DiaID: "D1:2", Text: "See [ADD] this | that."},
		{Speaker: "Ann", DiaID: "D1:3", Text: "He loves Brighton beach."},
		{Speaker: "Bo", DiaID: "D1:4", Text: "Lovely!"},
	}
	ex := LocomoExtraction([]LocomoConversation{{Turns: turns}})
	prompt := "You maintain...\n\nKnown facts:\n(none)\n\nNew messages:\n" +
		"user: (1 May) Ann: I adopted a puppy named Rex. Ann: See [ADD] this | that. Ann: He loves Brighton beach.\nassistant: Bo: Lovely!\n" +
		"\nReply with memory operations only, one per line: [ADD] x\n[TRIPLE] <subject> | <predicate> | <object> | <supports>\n"
	got := strings.Split(ex(prompt), "\n")
	want := []string{
		"[ADD] Ann: I adopted a puppy named Rex.",
		"[ADD] Ann: He loves Brighton beach.",
		"[ADD] Bo: Lovely!",
		"[TRIPLE] Ann | mentions | Rex | +1",
		"[TRIPLE] Ann | adopted | puppy named | +1",
		"[TRIPLE] Ann | mentions | He | +2",
		"[TRIPLE] Ann | mentions | Brighton | +2",
		"[TRIPLE] Bo | mentions | Lovely | +3",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("reply\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := ex("Summarize the conversation so far."); got != "[SKIP]" {
		t.Fatalf("a summary call got %q", got)
	}
}
