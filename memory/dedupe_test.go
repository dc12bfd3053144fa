package memory

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// unitStats counts a session's units, distinct contents and empty ones.
func unitStats(t *testing.T, s *Store, id string) (units, distinct, empty int) {
	t.Helper()
	v, err := s.Memory("t", id)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, u := range v.Units {
		k := u.Role + "\x00" + strings.TrimSpace(u.Content)
		seen[k] = true
		if strings.TrimSpace(u.Content) == "" {
			empty++
		}
	}
	return len(v.Units), len(seen), empty
}

// TestIdenticalRequestsMakeOneUnit reproduces issue 12 row 12: 50
// identical full-history requests made 49 identical units.
func TestIdenticalRequestsMakeOneUnit(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	for range 50 {
		tr := prepare(t, s, "t", "same", ModeFull, text("user", "what is the capital of France?"))
		if err := tr.Complete(text("assistant", "Paris.")); err != nil {
			t.Fatal(err)
		}
	}
	if n, distinct, empty := unitStats(t, s, "same"); n != distinct || n > 1 || empty != 0 {
		t.Fatalf("%d units, %d distinct, %d empty", n, distinct, empty)
	}
	s.Close()
	s = openStore(t, dir, nil)
	if n, distinct, _ := unitStats(t, s, "same"); n != distinct || n > 1 {
		t.Fatalf("after reopen: %d units, %d distinct", n, distinct)
	}
}

// TestSharedSessionFullHistoryClients: 20 full-history clients on one
// session, 900 requests (14,156 units, 302 distinct, 2,358 empty on main).
func TestSharedSessionFullHistoryClients(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, func(o *Options) { o.Window.Limit = 4096 })
	const clients, turns = 20, 45
	hist := make([][]Message, clients)
	for turn := range turns {
		for c := range clients {
			hist[c] = append(hist[c], text("user", fmt.Sprintf("client %d asks question %d about %s", c, turn, vocab[(c*7+turn)%len(vocab)])))
			tr := prepare(t, s, "t", "shared", ModeFull, hist[c]...)
			reply := fmt.Sprintf("answer %d for client %d", turn, c)
			if turn%5 == 0 {
				reply = "" // an empty reply (tool-less refusal, cut stream)
			}
			if err := tr.Complete(text("assistant", reply)); err != nil {
				t.Fatal(err)
			}
			hist[c] = append(hist[c], text("assistant", reply))
		}
	}
	n, distinct, empty := unitStats(t, s, "shared")
	t.Logf("%d requests: %d units, %d distinct, %d empty", clients*turns, n, distinct, empty)
	if n != distinct || empty != 0 {
		t.Fatalf("%d units, %d distinct, %d empty", n, distinct, empty)
	}
	// At most one unit per distinct message ever sent.
	if max := clients * turns * 2; n > max {
		t.Fatalf("%d units for %d distinct messages", n, max)
	}
	s.Close()
	s = openStore(t, dir, func(o *Options) { o.Window.Limit = 4096 })
	n2, distinct2, empty2 := unitStats(t, s, "shared")
	if empty2 != 0 || n2 > distinct2+distinct2/20 {
		t.Fatalf("after reopen: %d units, %d distinct, %d empty", n2, distinct2, empty2)
	}
}

// TestEvictedDuplicateStaysOut: repeated turns evicted from the window get
// no second unit, and stay out of the window after a restart.
func TestEvictedDuplicateStaysOut(t *testing.T) {
	dir := t.TempDir()
	mod := func(o *Options) {
		o.Window.Limit, o.Window.SystemReserve, o.Window.ToolsReserve = 2300, 1024, 1024
		o.Window.Strategy = StrategyTail
	}
	s := openStore(t, dir, mod)
	for range 30 {
		prepare(t, s, "t", "ok", ModeAppend, text("user", "ok")).Complete(text("assistant", "sure"))
	}
	filler := strings.Repeat("lorem ipsum dolor sit amet ", 4)
	for i := range 30 {
		prepare(t, s, "t", "ok", ModeAppend, text("user", fmt.Sprintf("q%d %s", i, filler))).Complete(text("assistant", fmt.Sprintf("a%d", i)))
	}
	count := func(window []json.RawMessage) (n int) {
		for _, m := range window {
			if strings.Contains(string(m), `"content":"ok"`) || strings.Contains(string(m), `"content":"sure"`) {
				n++
			}
		}
		return n
	}
	tr := prepare(t, s, "t", "ok", ModeAppend, text("user", "before"))
	if n := count(tr.Messages); n != 0 {
		t.Fatalf("%d repeated messages still in the window", n)
	}
	tr.Abort()
	if n, distinct, _ := unitStats(t, s, "ok"); n != distinct {
		t.Fatalf("%d units, %d distinct", n, distinct)
	}
	s.Close()
	s = openStore(t, dir, mod)
	tr = prepare(t, s, "t", "ok", ModeAppend, text("user", "after"))
	defer tr.Abort()
	if n := count(tr.Messages); n != 0 {
		t.Fatalf("after a restart %d evicted repeated messages came back into the window", n)
	}
}
