package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// openBubbleStore opens a store on the bubble's fake time (synctest).
func openBubbleStore(t *testing.T, dir string, mod func(*Options)) *Store {
	t.Helper()
	o := Options{Dir: dir, Fsync: FsyncNever, Window: WindowOptions{Limit: 32000}}
	if mod != nil {
		mod(&o)
	}
	s, err := Open(o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// topics are the simulated conversation's subjects: facts to remember and
// questions about them.
var topics = []struct {
	name      string
	facts     []string
	questions []string
}{
	{"volcano", []string{
		"The user's favourite volcano is Krakatoa in Indonesia.",
		"The user climbed Mount Etna volcano and saw lava flows.",
		"The user wants a volcano eruption tour with magma and ash viewing.",
		"The user is afraid of volcano ash clouds after the Eyjafjallajokull eruption.",
		"The user collects volcanic rocks like obsidian and basalt from every volcano.",
		"The user's volcano trip budget is tight and lava tours are expensive.",
	}, []string{
		"Which volcano should I visit to see lava?", "Tell me more about volcano ash and eruptions.",
		"Is magma from a volcano dangerous?", "Where can I find obsidian near a volcano?",
		"How do volcano eruption tours work?", "What volcano did I climb?",
	}},
	{"kubernetes", []string{
		"The user's kubernetes cluster runs on three nodes with 64 pods.",
		"The user deploys services to kubernetes with helm charts.",
		"The user's kubernetes pods crash with OOMKilled errors.",
		"The user wants kubernetes autoscaling for the deployment.",
		"The user's kubernetes ingress uses nginx with TLS certificates.",
		"The user prefers kubectl over dashboards for kubernetes clusters.",
	}, []string{
		"Why do my kubernetes pods crash?", "How should I scale the kubernetes deployment?",
		"Which helm chart should the kubernetes cluster use?", "How is kubernetes ingress set up?",
		"How many nodes does my kubernetes cluster have?", "What kubectl command lists kubernetes pods?",
	}},
	{"cooking", []string{
		"The user cooks pasta with garlic and olive oil sauce.",
		"The user is allergic to peanuts when cooking.",
		"The user's favourite pasta sauce is carbonara with pecorino.",
		"The user bakes sourdough bread when cooking on weekends.",
		"The user wants quick cooking recipes under twenty minutes.",
		"The user cooks risotto with saffron and parmesan.",
	}, []string{
		"What pasta sauce should I cook tonight?", "Give me a quick cooking recipe with garlic.",
		"How do I bake sourdough bread for cooking class?", "Which risotto cooking method is best?",
		"Is carbonara pasta hard to cook?", "What should I avoid when cooking for my allergy?",
	}},
	{"finance", []string{
		"The user's invoice payments are due on the fifth of each month.",
		"The user's tax return needs receipts for the finance office.",
		"The user's monthly finance budget is four thousand euros.",
		"The user invests savings in index funds for finance goals.",
		"The user's finance spreadsheet tracks invoice and tax records.",
		"The user wants to reduce finance fees on the bank account.",
	}, []string{
		"When is my invoice payment due?", "How do I prepare my tax return receipts?",
		"What is my monthly finance budget?", "Should I put finance savings in index funds?",
		"How can my finance spreadsheet track invoices?", "How do I lower finance bank fees?",
	}},
}

// simulate runs queries in one session holding every topic's facts and
// returns the share of recalls that were full recalls.
func simulate(t *testing.T, s *Store, id string, queries []string) float64 {
	t.Helper()
	turn, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: id, UserID: id, Mode: ModeAppend, Messages: []Message{text("user", "hello")}})
	if err != nil {
		t.Fatal(err)
	}
	turn.Complete(text("assistant", "hi"))
	for _, tp := range topics {
		for _, f := range tp.facts {
			if _, err := s.AddMemory("t", id, CategoryFact, f, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	full, reuse := 0, 0
	for i, q := range queries {
		turn, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: id, UserID: id, Mode: ModeAppend, Messages: []Message{text("user", q)}})
		if err != nil {
			t.Fatal(err)
		}
		if testing.Verbose() {
			t.Logf("%s %q: %s %d", id, q, turn.Stats.Recall, turn.Stats.Recalled)
		}
		switch turn.Stats.Recall {
		case "full":
			full++
		case "reuse":
			reuse++
		default:
			t.Fatalf("query %d %q: no recall", i, q)
		}
		// Recalled now, or by an earlier block still in the window (kept
		// in the transcript: a continuing topic costs no new tokens).
		if turn.Stats.Recalled == 0 && !slices.ContainsFunc(turn.Messages[:len(turn.Messages)-1], func(m json.RawMessage) bool {
			return strings.Contains(string(m), RecallBlockPrefix)
		}) {
			t.Fatalf("query %d %q: nothing recalled", i, q)
		}
		turn.Complete(text("assistant", "noted"))
		time.Sleep(20 * time.Second) // the user reads and types
	}
	return float64(full) / float64(full+reuse)
}

// TestConversationSimulationFullRecallRate: on a continuous topic the light
// probe keeps finding the active set and full recalls are rare; switching
// topic every turn forces a full recall almost every time.
func TestConversationSimulationFullRecallRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openBubbleStore(t, t.TempDir(), nil)
		var continuous, switching []string
		for round := 0; round < 4; round++ {
			continuous = append(continuous, topics[0].questions...)
			for q := range 6 {
				for _, tp := range topics {
					switching = append(switching, tp.questions[(q+round)%6])
				}
			}
		}
		switching = switching[:len(continuous)]
		cont := simulate(t, s, "continuous", continuous)
		sw := simulate(t, s, "switching", switching)
		t.Logf("full-recall rate over %d queries: continuous topic %.1f%%, topic switch every turn %.1f%%",
			len(continuous), 100*cont, 100*sw)
		if !(cont < sw) {
			t.Fatalf("continuous %.2f, switches %.2f: want continuous < switches", cont, sw)
		}
		if cont > 0.25 || sw < 0.75 {
			t.Fatalf("continuous %.2f (want ≤ 0.25), switches %.2f (want ≥ 0.75)", cont, sw)
		}
		st := s.Stats()
		if st.FullRecalls+st.ProbeReuses != int64(2*len(continuous)) || st.FullRecallRate <= 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestWorkingMemoryExpiryAndLinks: the active set forgets after
// ActiveSetDecay, forcing a full recall; links between memories recalled
// together strengthen on co-activation and fade with time.
func TestWorkingMemoryExpiryAndLinks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openBubbleStore(t, t.TempDir(), nil)
		turn := prepare(t, s, "t", "s", ModeAppend, text("user", "hello"))
		turn.Complete(text("assistant", "hi"))
		for _, f := range topics[0].facts {
			if _, err := s.AddMemory("t", "s", CategoryFact, f, 1); err != nil {
				t.Fatal(err)
			}
		}
		ask := func(q string) TurnStats {
			turn := prepare(t, s, "t", "s", ModeAppend, text("user", q))
			turn.Complete(text("assistant", "ok"))
			return turn.Stats
		}
		if st := ask(topics[0].questions[0]); st.Recall != "full" {
			t.Fatalf("first recall %q, want full", st.Recall)
		}
		sess, _ := s.reg.session("t", "s", false)
		// links snapshots the weights between the active memories.
		links := func() map[linkKey]float64 {
			sess.mu.Lock()
			defer sess.mu.Unlock()
			out := map[linkKey]float64{}
			for a := range sess.wm.active {
				for b := range sess.wm.active {
					if a < b {
						out[mkLink(a, b)] = sess.wm.linkWeight(a, b, time.Now(), s.opts.Recall.LinkHalfLife)
					}
				}
			}
			return out
		}
		before := links()
		if len(before) == 0 {
			t.Fatal("no two active memories")
		}
		for k, w := range before {
			if w <= 0 {
				t.Fatalf("active memories %v not linked after a full recall", k)
			}
		}

		time.Sleep(time.Minute)
		if st := ask(topics[0].questions[1]); st.Recall != "reuse" {
			t.Fatalf("same topic after 1m: %q, want reuse", st.Recall)
		}
		after := links()
		var strongest linkKey
		for k, w := range after {
			if w > before[k] && before[k] > 0 {
				strongest = k
			}
		}
		if strongest == (linkKey{}) {
			t.Fatalf("no link between active memories grew on co-activation: %v then %v", before, after)
		}
		w2 := after[strongest]

		time.Sleep(s.opts.Recall.ActiveSetDecay + time.Second)
		sess.mu.Lock()
		w3 := sess.wm.linkWeight(strongest.a, strongest.b, time.Now(), s.opts.Recall.LinkHalfLife)
		sess.mu.Unlock()
		if w3 >= w2 {
			t.Fatalf("link %v after %v idle, was %v: want decayed", w3, s.opts.Recall.ActiveSetDecay, w2)
		}
		if st := ask(topics[0].questions[2]); st.Recall != "full" {
			t.Fatalf("same topic after the active set expired: %q, want full", st.Recall)
		}
	})
}

// TestReuseKeepsBlockBytes: a reused recall (same topic) shows again what
// of the previous set the new question is about, with the probe's hits
// that pass the gate, and the prefix up to the history is shared with the
// previous window.
func TestReuseKeepsBlockBytes(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Window.Limit = 32000 })
	prepare(t, s, "t", "s", ModeAppend, text("system", "sys"), text("user", "hello")).Complete(text("assistant", "hi"))
	for _, f := range topics[1].facts {
		if _, err := s.AddMemory("t", "s", CategoryFact, f, 1); err != nil {
			t.Fatal(err)
		}
	}
	a := prepare(t, s, "t", "s", ModeAppend, text("user", topics[1].questions[0]))
	a.Complete(text("assistant", "ok"))
	b := prepare(t, s, "t", "s", ModeAppend, text("user", topics[1].questions[1]))
	if a.Stats.Recall != "full" || b.Stats.Recall != "reuse" {
		t.Fatalf("recall %q then %q", a.Stats.Recall, b.Stats.Recall)
	}
	if !strings.Contains(string(a.Block), "OOMKilled") || !strings.Contains(string(b.Block), "autoscaling") {
		t.Fatalf("blocks not about their questions:\n%s\n%s", a.Block, b.Block)
	}
	if strings.Contains(string(b.Block), "three nodes") {
		t.Fatalf("the reused block shows a fact the question is not about:\n%s", b.Block)
	}
	if b.Stats.Prefix.Messages < 2 {
		t.Fatalf("prefix %+v", b.Stats.Prefix)
	}
	b.Abort()
}

// evictedSession makes a session whose first turn (about Krakatoa) left the
// window and returns the query that recalls it.
func evictedSession(t *testing.T, s *Store) []Message {
	t.Helper()
	filler := strings.Repeat("lorem ipsum dolor ", 8)
	msgs := []Message{text("system", "sys"), text("user", "my favourite volcano is Krakatoa"), text("assistant", "nice")}
	for i := 0; i < 10; i++ {
		msgs = append(msgs, text("user", fmt.Sprintf("filler %d %s", i, filler)), text("assistant", "ok "+filler))
	}
	turn := prepare(t, s, "t", "s", ModeFull, msgs...)
	turn.Complete(text("assistant", "fine"))
	return append(msgs, text("assistant", "fine"), text("user", "which volcano is my favourite?"))
}

func smallWindow(o *Options) {
	o.Window.Limit, o.Window.SystemReserve, o.Window.ToolsReserve, o.Window.Strategy = 400, 50, 50, StrategyTail
	o.Recall.Share = 0.3
}

// TestIndexRebuiltWhenFileMissingOrCorrupt: the index file is derived data;
// without it, or with a damaged one, the index is rebuilt from the units.
func TestIndexRebuiltWhenFileMissingOrCorrupt(t *testing.T) {
	for _, damage := range []string{"deleted", "corrupt"} {
		t.Run(damage, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, smallWindow)
			msgs := evictedSession(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			path := indexPath(newSession(dir, "t", "s"))
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("index not saved on Close: %v", err)
			}
			if damage == "deleted" {
				os.Remove(path)
			} else {
				data[len(data)/2] ^= 0xff
				os.WriteFile(path, data, 0o600)
			}
			s = openStore(t, dir, smallWindow)
			turn := prepare(t, s, "t", "s", ModeFull, msgs...)
			if !strings.Contains(string(turn.Block), "Krakatoa") {
				t.Fatalf("not recalled after rebuild: %s", turn.Block)
			}
			turn.Abort()
			if st := s.Stats(); st.IndexRebuilds != 1 {
				t.Fatalf("IndexRebuilds %d, want 1", st.IndexRebuilds)
			}
			s.Close()
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("rebuilt index not saved: %v", err)
			}
			// A clean reopen uses the file as is.
			s = openStore(t, dir, smallWindow)
			turn = prepare(t, s, "t", "s", ModeFull, msgs...)
			turn.Abort()
			if st := s.Stats(); st.IndexRebuilds != 0 || !strings.Contains(string(turn.Block), "Krakatoa") {
				t.Fatalf("reopen: rebuilds %d, block %s", st.IndexRebuilds, turn.Block)
			}
		})
	}
}

// TestDeleteMemoryRemovesItEverywhere: a deleted memory leaves the units,
// the index (also after restart, where the stale file is reconciled) and
// the working memory.
func TestDeleteMemoryRemovesItEverywhere(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, smallWindow)
	msgs := evictedSession(t, s)
	turn := prepare(t, s, "t", "s", ModeFull, msgs...)
	turn.Abort()
	var id string
	mem, _ := s.Memory("t", "s")
	for _, u := range mem.Units {
		if strings.Contains(u.Content, "Krakatoa") {
			id = u.ID
		}
	}
	if id == "" {
		t.Fatal("no Krakatoa unit")
	}
	s.Close() // the index file now holds the unit
	s = openStore(t, dir, smallWindow)
	if err := s.DeleteMemory("t", "s", id); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMemory("t", "s", id); !errors.Is(err, ErrMemoryNotFound) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	sess, _ := s.reg.session("t", "s", false)
	sess.mu.Lock()
	_, inIndex := s.recall.indexLocked(context.Background(), sess).Get(id)
	active := sess.wm.isActive(id)
	sess.mu.Unlock()
	if inIndex || active {
		t.Fatalf("deleted memory still indexed %v / active %v", inIndex, active)
	}
	turn = prepare(t, s, "t", "s", ModeFull, msgs...)
	if strings.Contains(string(turn.Block), "Krakatoa") {
		t.Fatalf("deleted memory recalled: %s", turn.Block)
	}
	turn.Abort()
	// Crash before the index is saved again: the old file still has the
	// document; reconciliation with the log drops it.
	indexFile := indexPath(sess)
	old, _ := os.ReadFile(indexFile)
	s.Close()
	os.WriteFile(indexFile, old, 0o600)
	s = openStore(t, dir, smallWindow)
	turn = prepare(t, s, "t", "s", ModeFull, msgs...)
	turn.Abort()
	if strings.Contains(string(turn.Block), "Krakatoa") {
		t.Fatalf("deleted memory recalled after restart: %s", turn.Block)
	}
	mem, _ = s.Memory("t", "s")
	for _, u := range mem.Units {
		if u.ID == id {
			t.Fatal("deleted unit back after restart")
		}
	}
}

// TestPinnedMemoriesAlwaysInjected: system and core memories are in every
// block, recalled or not, ordered by id.
func TestPinnedMemoriesAlwaysInjected(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
	if _, err := s.AddMemory("t", "s", CategorySystem, "Always answer in French.", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMemory("t", "s", CategoryCore, "The user is called Ada.", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMemory("t", "s", "bogus", "x", 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad category: %v", err)
	}
	turn := prepare(t, s, "t", "s", ModeAppend, text("user", "unrelated question about weather"))
	blk := string(turn.Stable)
	i, j := strings.Index(blk, "French"), strings.Index(blk, "Ada")
	if i < 0 || j < 0 || i > j {
		t.Fatalf("pinned memories missing or out of order: %s", blk)
	}
	turn.Abort()
}

// TestReuseNeverShowsStaleMemory: when the probe finds the same topic the
// full retrieval is skipped, but the set shown is rebuilt from memory as it
// is: a memory deleted meanwhile is not shown.
func TestReuseNeverShowsStaleMemory(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Window.Limit = 32000 })
	prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
	for _, f := range topics[2].facts {
		if _, err := s.AddMemory("t", "s", CategoryFact, f, 1); err != nil {
			t.Fatal(err)
		}
	}
	a := prepare(t, s, "t", "s", ModeAppend, text("user", topics[2].questions[0]))
	a.Complete(text("assistant", "ok"))
	if a.Stats.Recall != "full" || !strings.Contains(string(a.Block), "carbonara") {
		t.Fatalf("first recall %q: %s", a.Stats.Recall, a.Block)
	}
	var carbonara string
	mem, _ := s.Memory("t", "s")
	for _, u := range mem.Units {
		if strings.Contains(u.Content, "carbonara") {
			carbonara = u.ID
		}
	}
	if err := s.DeleteMemory("t", "s", carbonara); err != nil {
		t.Fatal(err)
	}
	b := prepare(t, s, "t", "s", ModeAppend, text("user", topics[2].questions[4]))
	defer b.Abort()
	if b.Stats.Recall != "reuse" {
		t.Fatalf("same topic: %q, want reuse", b.Stats.Recall)
	}
	if strings.Contains(string(b.Block), "carbonara") {
		t.Fatalf("a deleted memory shown on reuse: %s", b.Block)
	}
}

// TestStatementsGetASmallerRecallBlock: a message that asks nothing gets
// Recall.StatementShare of the recall block's share; a question the whole.
func TestStatementsGetASmallerRecallBlock(t *testing.T) {
	for _, c := range []struct {
		share     float64
		statement bool
	}{{0, false}, {1, true}} {
		s := openStore(t, t.TempDir(), func(o *Options) {
			smallWindow(o)
			o.Recall.StatementShare = c.share
		})
		msgs := evictedSession(t, s)
		msgs = msgs[:len(msgs)-1]
		q := prepare(t, s, "t", "s", ModeFull, append(msgs, text("user", "which volcano is my favourite?"))...)
		q.Abort()
		st := prepare(t, s, "t", "s", ModeFull, append(msgs, text("user", "I keep thinking about my favourite volcano"))...)
		st.Abort()
		if !strings.Contains(string(q.Block), "Krakatoa") {
			t.Errorf("share %v: the question's block lacks the memory: %s", c.share, q.Block)
		}
		if got := strings.Contains(string(st.Block), "Krakatoa"); got != c.statement {
			t.Errorf("share %v: the statement's block shows the memory: %v, want %v (%s)", c.share, got, c.statement, st.Block)
		}
	}
}
