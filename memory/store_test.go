package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
)

func TestFullHistoryAppendsOnlyNewTail(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	sys := text("system", "You are terse.")
	u1, a1, u2 := text("user", "hi"), text("assistant", "hello"), text("user", "how are you")

	turn := prepare(t, s, "t1", "s1", ModeFull, sys, u1)
	if turn.Stats.Match != "new" || turn.Stats.Appended != 2 {
		t.Fatalf("first turn: match %q appended %d, want new/2", turn.Stats.Match, turn.Stats.Appended)
	}
	if err := turn.Complete(a1); err != nil {
		t.Fatal(err)
	}
	// The client re-serializes the assistant message differently: still a match.
	a1c := msg(t, `{"content":"hello","role":"assistant","refusal":null}`)
	turn = prepare(t, s, "t1", "s1", ModeFull, sys, u1, a1c, u2)
	if turn.Stats.Match != "extend" || turn.Stats.Appended != 1 {
		t.Fatalf("second turn: match %q appended %d, want extend/1", turn.Stats.Match, turn.Stats.Appended)
	}
	want := []string{string(sys.Raw), string(u1.Raw), string(a1.Raw), string(u2.Raw)}
	if got := rawStrings(turn.Messages); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("window:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	turn.Abort()

	// A retry of the same request appends nothing.
	turn = prepare(t, s, "t1", "s1", ModeFull, sys, u1, a1c, u2)
	if turn.Stats.Appended != 0 {
		t.Fatalf("retry appended %d", turn.Stats.Appended)
	}
	turn.Abort()
	v, err := s.Session("t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Messages) != 4 {
		t.Fatalf("stored %d messages, want 4", len(v.Messages))
	}
}

func TestCompleteNotDuplicatedWhenClientSentReplyFirst(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.PendingWait = -1 })
	u1, a1, u2 := text("user", "q1"), text("assistant", "r1"), text("user", "q2")
	t1 := prepare(t, s, "t", "s", ModeFull, u1)
	// The next request races ahead of Complete and carries the reply.
	t2 := prepare(t, s, "t", "s", ModeFull, u1, a1, u2)
	if err := t1.Complete(a1); err != nil {
		t.Fatal(err)
	}
	t2.Abort()
	v, _ := s.Session("t", "s")
	var roles []string
	for _, m := range v.Messages {
		roles = append(roles, m.Role+":"+m.Content)
	}
	if got := strings.Join(roles, ","); got != "user:q1,assistant:r1,user:q2" {
		t.Fatalf("history %s", got)
	}
}

func TestDivergedHistoryArchivesCutMessages(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	u1, a1, u2, a2 := text("user", "write a poem"), text("assistant", "roses"), text("user", "longer"), text("assistant", "roses are red")
	turn := prepare(t, s, "t", "s", ModeFull, u1)
	turn.Complete(a1)
	turn = prepare(t, s, "t", "s", ModeFull, u1, a1, u2)
	turn.Complete(a2)
	// The user edits their second message.
	u2e := text("user", "shorter please")
	turn = prepare(t, s, "t", "s", ModeFull, u1, a1, u2e)
	if turn.Stats.Match != "diverged" {
		t.Fatalf("match %q, want diverged", turn.Stats.Match)
	}
	turn.Abort()
	v, _ := s.Session("t", "s")
	var got []string
	for _, m := range v.Messages {
		got = append(got, m.Content)
	}
	if strings.Join(got, "|") != "write a poem|roses|shorter please" {
		t.Fatalf("history %q", got)
	}
	mem, err := s.Memory("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	var archived []string
	for _, u := range mem.Units {
		if u.Tier == PlaceArchive {
			archived = append(archived, u.Content)
		}
	}
	if strings.Join(archived, "|") != "longer|roses are red" {
		t.Fatalf("archived %q, want the cut branch", archived)
	}
}

func TestClientTrimmedHistoryIsRecognised(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	var all []Message
	for i := 0; i < 4; i++ {
		u := text("user", fmt.Sprintf("question %d", i))
		all = append(all, u)
		turn := prepare(t, s, "t", "s", ModeFull, all...)
		a := text("assistant", fmt.Sprintf("answer %d", i))
		turn.Complete(a)
		all = append(all, a)
	}
	// The client keeps only its last 4 messages and adds one.
	req := append(append([]Message(nil), all[len(all)-4:]...), text("user", "question 4"))
	turn := prepare(t, s, "t", "s", ModeFull, req...)
	if turn.Stats.Match != "trimmed" || turn.Stats.Appended != 1 {
		t.Fatalf("match %q appended %d, want trimmed/1", turn.Stats.Match, turn.Stats.Appended)
	}
	turn.Abort()
	v, _ := s.Session("t", "s")
	if len(v.Messages) != 9 {
		t.Fatalf("stored %d, want 9", len(v.Messages))
	}
}

func TestAppendModeReconstitutesHistory(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	sys := text("system", "sys")
	turn := prepare(t, s, "t", "s", ModeAppend, sys, text("user", "one"))
	turn.Complete(text("assistant", "uno"))
	turn = prepare(t, s, "t", "s", ModeAppend, text("user", "two"))
	turn.Complete(text("assistant", "dos"))
	// Repeating the same system message does not duplicate it.
	turn = prepare(t, s, "t", "s", ModeAppend, sys, text("user", "three"))
	var got []string
	for _, r := range turn.Messages {
		var m Message
		json.Unmarshal(r, &m)
		got = append(got, m.Role+":"+m.Content)
	}
	if strings.Join(got, ",") != "system:sys,user:one,assistant:uno,user:two,assistant:dos,user:three" {
		t.Fatalf("window %q", got)
	}
	turn.Complete(text("assistant", "tres"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart: the session is intact.
	s2 := openStore(t, dir, nil)
	v, err := s2.Session("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, m := range v.Messages {
		got = append(got, m.Content)
	}
	if strings.Join(got, ",") != "sys,one,uno,two,dos,three,tres" {
		t.Fatalf("after restart %q", got)
	}
	turn = prepare(t, s2, "t", "s", ModeAppend, text("user", "four"))
	if n := len(turn.Messages); n != 8 {
		t.Fatalf("window after restart has %d messages, want 8", n)
	}
	turn.Abort()
}

func TestTenantIsolation(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	turn := prepare(t, s, "alice", "shared-id", ModeFull, text("user", "alice secret"))
	turn.Complete(text("assistant", "ok"))
	if _, err := s.Session("bob", "shared-id"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob sees alice's session: %v", err)
	}
	if _, err := s.Memory("bob", "shared-id"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob sees alice's memory: %v", err)
	}
	if err := s.Delete("bob", "shared-id"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob deletes alice's session: %v", err)
	}
	turn = prepare(t, s, "bob", "shared-id", ModeAppend, text("user", "bob here"))
	for _, r := range turn.Messages {
		if strings.Contains(string(r), "alice") {
			t.Fatalf("bob's window holds alice's message %s", r)
		}
	}
	turn.Abort()
	if _, err := s.Session("alice", "shared-id"); err != nil {
		t.Fatalf("alice lost her session: %v", err)
	}
}

func TestFileNamesComeFromHashes(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	id := "../../etc/passwd"
	turn := prepare(t, s, "tenant/../x", id, ModeFull, text("user", "hi"))
	turn.Abort()
	// Close waits for the background writers (the user index): every file
	// the store makes is there, none half-written.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var files, logs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, rel)
			if strings.HasSuffix(rel, ".log") {
				logs = append(logs, rel)
			}
		}
		return nil
	})
	if len(logs) != 1 {
		t.Fatalf("files %q, want one session log", files)
	}
	for _, f := range files {
		if strings.Contains(f, "passwd") || strings.Contains(f, "..") || strings.Contains(f, "tenant") {
			t.Fatalf("file name %q leaks the client string", f)
		}
	}
}

func TestDeleteRemovesLogAndUnits(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	turn := prepare(t, s, "t", "s", ModeFull, text("user", "x"))
	turn.Complete(text("assistant", "y"))
	if err := s.Delete("t", "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Session("t", "s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := os.Stat(sessionPath(dir, "t", "s")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("log still there: %v", err)
	}
	if err := s.Delete("t", "s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	// The id can be reused and starts empty.
	turn = prepare(t, s, "t", "s", ModeAppend, text("user", "fresh"))
	if len(turn.Messages) != 1 {
		t.Fatalf("reused id window %q", rawStrings(turn.Messages))
	}
	turn.Abort()
}

func TestEvictedTurnsBecomeUnitsAndSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	limit := func(o *Options) {
		o.Window.Limit = 600
		o.Window.SystemReserve = 100
		o.Window.ToolsReserve = 100
		o.Window.Strategy = StrategyTail
		o.Decay.WorkingMaxUnits = 5
	}
	s := openStore(t, dir, limit)
	sys := text("system", "be brief")
	var all []Message
	all = append(all, sys)
	for i := 0; i < 30; i++ {
		all = append(all, text("user", fmt.Sprintf("turn %d: %s", i, strings.Repeat("lorem ipsum ", 10))))
		turn := prepare(t, s, "t", "s", ModeFull, all...)
		if turn.Stats.TotalTokens > 600 {
			t.Fatalf("turn %d: %d tokens > 600", i, turn.Stats.TotalTokens)
		}
		if string(turn.Messages[0]) != string(sys.Raw) {
			t.Fatalf("turn %d: system message not first", i)
		}
		a := text("assistant", fmt.Sprintf("reply %d", i))
		turn.Complete(a)
		all = append(all, a)
	}
	mem, err := s.Memory("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if mem.Working+mem.Archive == 0 || !strings.HasPrefix(mem.Units[0].Content, "turn 0:") {
		t.Fatalf("evicted turns are not units: %+v", mem)
	}
	nUnits := len(mem.Units)
	s.Close()

	s2 := openStore(t, dir, limit)
	mem2, err := s2.Memory("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if len(mem2.Units) != nUnits {
		t.Fatalf("after restart %d units, want %d", len(mem2.Units), nUnits)
	}
	// Beyond WorkingMaxUnits the least recently used moved to archive.
	if mem2.Working > 5 || mem2.Archive == 0 || mem2.Working+mem2.Archive != nUnits {
		t.Fatalf("tiers after restart: working %d archive %d of %d", mem2.Working, mem2.Archive, nUnits)
	}
	v, _ := s2.Session("t", "s")
	if len(v.Messages) != 61 {
		t.Fatalf("after restart %d messages, want 61", len(v.Messages))
	}
	if v.Messages[1].Tier == PlaceFocus {
		t.Fatalf("evicted message reported in focus after restart")
	}
}

func TestImportanceKeepsRelevantTurn(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Window.Limit = 500
		o.Window.SystemReserve = 50
		o.Window.ToolsReserve = 50
		o.Recall.K = -1
	})
	filler := strings.Repeat("weather ocean mountain river forest ", 6)
	msgs := []Message{text("user", "Remember: the invoice number for customer Zorblax is 7731, IMPORTANT"), text("assistant", "noted")}
	for i := 0; i < 12; i++ {
		msgs = append(msgs, text("user", fmt.Sprintf("chat %d %s", i, filler)), text("assistant", fmt.Sprintf("sure %d %s", i, filler)))
	}
	msgs = append(msgs, text("user", "what is the invoice number for customer Zorblax?"))
	turn := prepare(t, s, "t", "s", ModeFull, msgs...)
	if turn.Stats.Evicted == 0 {
		t.Fatal("nothing evicted; the test needs overflow")
	}
	if !contains(turn.Messages, msgs[0]) {
		t.Fatalf("importance dropped the relevant, emphasised turn")
	}
	if contains(turn.Messages, msgs[2]) {
		t.Fatalf("importance kept the oldest filler turn")
	}
	// Kept history stays in original order.
	last := -1
	for _, r := range turn.Messages {
		for i, m := range msgs {
			if string(m.Raw) == string(r) {
				if i < last {
					t.Fatalf("window out of order")
				}
				last = i
			}
		}
	}
	turn.Abort()
}

func TestRecallBlockSitsBeforeNewestUserMessage(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Window.Limit = 400
		o.Window.SystemReserve = 50
		o.Window.ToolsReserve = 50
		o.Window.Strategy = StrategyTail
		o.Recall.Share = 0.3
	})
	sys := text("system", "sys prompt")
	filler := strings.Repeat("lorem ipsum dolor ", 8)
	msgs := []Message{sys, text("user", "my favourite volcano is Krakatoa"), text("assistant", "nice")}
	for i := 0; i < 10; i++ {
		msgs = append(msgs, text("user", fmt.Sprintf("filler %d %s", i, filler)), text("assistant", "ok "+filler))
	}
	turn := prepare(t, s, "t", "s", ModeFull, msgs...)
	turn.Complete(text("assistant", "fine"))
	msgs = append(msgs, text("assistant", "fine"), text("user", "which volcano is my favourite?"))
	turn = prepare(t, s, "t", "s", ModeFull, msgs...)
	if turn.Block == nil {
		t.Fatal("no block injected")
	}
	n := len(turn.Messages)
	if string(turn.Messages[0]) != string(sys.Raw) || string(turn.Messages[n-2]) != string(turn.Block) ||
		string(turn.Messages[n-1]) != string(msgs[len(msgs)-1].Raw) {
		t.Fatalf("block not right before the newest user message")
	}
	if !strings.Contains(string(turn.Block), "Krakatoa") {
		t.Fatalf("block lacks the recalled turn: %s", turn.Block)
	}
	first := turn.Block
	turn.Abort()
	// Same state, same bytes.
	turn = prepare(t, s, "t", "s", ModeFull, msgs...)
	if string(turn.Block) != string(first) {
		t.Fatalf("block bytes changed:\n%s\n%s", first, turn.Block)
	}
	if turn.Stats.Prefix.Messages != len(turn.Messages) {
		t.Fatalf("prefix %+v, want the whole window shared", turn.Stats.Prefix)
	}
	turn.Abort()
	mem, _ := s.Memory("t", "s")
	for _, u := range mem.Units {
		if strings.Contains(u.Content, "Krakatoa") && u.AccessCount != 2 {
			t.Fatalf("access count %d, want 2", u.AccessCount)
		}
	}
}

// TestContextTooLargeGoesAsSent: a request whose own messages do not fit
// the limit is not refused (the engine behind may take it): its window is
// the request as sent, and it is recorded like any other.
func TestContextTooLargeGoesAsSent(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Window.Limit = 300
		o.Window.SystemReserve = 50
		o.Window.ToolsReserve = 50
	})
	req := []Message{text("system", "be brief"), text("user", strings.Repeat("word ", 400))}
	tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeFull, Model: "m", Messages: req})
	if err != nil || !tr.Stats.AsSent {
		t.Fatalf("err %v, as sent %v", err, err == nil && tr.Stats.AsSent)
	}
	if fmt.Sprint(rawStrings(tr.Messages)) != fmt.Sprint(rawStrings(raws(req))) {
		t.Fatalf("window %s, want the request as sent", rawStrings(tr.Messages))
	}
	if err := tr.Complete(text("assistant", "ok")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Session("t", "s"); err != nil || len(v.Messages) != 3 {
		t.Fatalf("session after an as-sent turn: %+v, %v", v, err)
	}
	// A limit from the engine below the store's also sends as is.
	tr, err = s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s2", Mode: ModeAppend, Model: "m", Limit: 5, Messages: []Message{text("user", "a question of more than five tokens, surely")}})
	if err != nil || !tr.Stats.AsSent || tr.Stats.Limit != 5 {
		t.Fatalf("engine limit 5: err %v, stats %+v", err, tr.Stats)
	}
	tr.Abort()
}

func TestInvalidInput(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	ctx := context.Background()
	if _, err := s.Prepare(ctx, TurnRequest{Tenant: "t", SessionID: "", Mode: ModeFull, Model: "m", Messages: []Message{text("user", "x")}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty id: %v", err)
	}
	if _, err := s.Prepare(ctx, TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeFull, Model: "m", Messages: nil}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no messages: %v", err)
	}
	if _, err := s.Prepare(ctx, TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeFull, Model: "m", Messages: []Message{{Content: "x"}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no role: %v", err)
	}
}

func TestClosedStore(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	s.Close()
	if _, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeFull, Model: "m", Messages: []Message{text("user", "x")}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

type recSummarizer struct {
	calls int
}

func (r *recSummarizer) Summarize(_ context.Context, req SummaryRequest) (Summary, error) {
	r.calls++
	var words []string
	for _, m := range req.Messages {
		if f := strings.Fields(m.Content); len(f) > 1 {
			words = append(words, f[1])
		}
	}
	return Summary{Text: "SUMMARY covers " + strings.Join(words, ","), Facts: []string{"fact from summary"}}, nil
}

func TestSummaryStrategy(t *testing.T) { synctest.Test(t, testSummaryStrategy) }

func testSummaryStrategy(t *testing.T) {
	dir := t.TempDir()
	sum := &recSummarizer{}
	opts := func(o *Options) {
		o.Window.Limit = 500
		o.Window.SystemReserve = 50
		o.Window.ToolsReserve = 50
		o.Window.Strategy = StrategySummary
		o.Extraction.Summarizer = sum
		o.Recall.K = -1
	}
	s := openBubbleStore(t, dir, opts)
	filler := strings.Repeat("lorem ipsum dolor ", 8)
	var msgs []Message
	for i := 0; i < 12; i++ {
		msgs = append(msgs, text("user", fmt.Sprintf("turn t%d %s", i, filler)))
		turn := prepare(t, s, "t", "s", ModeFull, msgs...)
		a := text("assistant", "ok "+filler)
		turn.Complete(a)
		synctest.Wait() // the worker and the summarizer are done with the turn
		msgs = append(msgs, a)
	}
	s.Close() // the summary is persisted
	if sum.calls == 0 {
		t.Fatal("summarizer never called")
	}
	s2 := openBubbleStore(t, dir, opts)
	msgs = append(msgs, text("user", "next"))
	turn := prepare(t, s2, "t", "s", ModeFull, msgs...)
	if turn.Stable == nil || !strings.Contains(string(turn.Stable), "SUMMARY covers t0") || string(turn.Messages[0]) != string(turn.Stable) {
		t.Fatalf("summary not in the stable block at the window's start: %s", turn.Stable)
	}
	turn.Abort()
	mem, _ := s2.Memory("t", "s")
	var types []string
	for _, u := range mem.Units {
		if u.Type == UnitSummary || u.Type == UnitFact {
			types = append(types, string(u.Type))
		}
	}
	if !strings.Contains(strings.Join(types, ","), "summary") || !strings.Contains(strings.Join(types, ","), "fact") {
		t.Fatalf("units %v lack summary and fact", types)
	}
}

func TestCommonPrefixMatchesSerializedBytes(t *testing.T) {
	f := func(prev, cur []string) {
		t.Helper()
		var a, b []json.RawMessage
		for _, p := range prev {
			a = append(a, json.RawMessage(p))
		}
		for _, c := range cur {
			b = append(b, json.RawMessage(c))
		}
		got := commonPrefix(a, b).Bytes
		sa, sb := AppendMessagesJSON(nil, a), AppendMessagesJSON(nil, b)
		want := commonBytes(sa, sb)
		if got != want {
			t.Errorf("commonPrefix(%q, %q).Bytes = %d, want %d", prev, cur, got, want)
		}
	}
	f([]string{`{"a":1}`}, []string{`{"a":1}`})
	f([]string{`{"a":1}`}, []string{`{"a":1}`, `{"b":2}`})
	f([]string{`{"a":1}`, `{"b":2}`}, []string{`{"a":1}`, `{"b":3}`})
	f([]string{`{"a":1}`, `{"b":2}`}, []string{`{"a":1}`})
	f([]string{`{"x":1}`}, []string{`{"y":1}`})
}
