package llamacpp

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
)

// pieceChain builds the chain of a prompt made of parts, one piece each.
func pieceChain(parts ...string) chain {
	b := newChainBuilder(1)
	for _, p := range parts {
		b.add([]byte(p))
	}
	return b.c
}

func TestShiftEvidence(t *testing.T) {
	sys := "system: " + strings.Repeat("s", 100)
	a, b, c, d := strings.Repeat("a", 1000), strings.Repeat("b", 1000), strings.Repeat("c", 1000), strings.Repeat("d", 1000)
	e := strings.Repeat("e", 500)
	prev := pieceChain(sys, a, b, c, d)
	evicted := pieceChain(sys, c, d, e) // a and b left; c and d stay
	// One token a byte: the new prompt is 2,608 tokens, 108 of them the
	// prefix, 2,000 the kept pieces.
	total := int64(len(sys) + 2500)
	f := func(name string, prev, cur chain, cacheN, total int64, want int32) {
		t.Helper()
		if got := shiftEvidence(prev, cur, cacheN, total); got != want {
			t.Errorf("%s: verdict %d, want %d", name, got, want)
		}
	}
	f("moved", prev, evicted, 108+2000, total, shiftYes)
	f("moved, less what the engine rounds", prev, evicted, 108+1200, total, shiftYes)
	f("computed again", prev, evicted, 108, total, shiftNo)
	f("unclear", prev, evicted, 108+600, total, shiftUnknown)
	f("an extension moves nothing", prev, pieceChain(sys, a, b, c, d, e), 4108, 4608, shiftUnknown)
	f("nothing kept", prev, pieceChain(sys, e), 108, 608, shiftUnknown)
	f("too little moved to tell", pieceChain(sys, a, "xy"), pieceChain(sys, "xy", e), 108, 610, shiftUnknown)
	f("no previous prompt", chain{}, evicted, 0, total, shiftUnknown)
	// The server stops at the first piece it lacks: what follows it is
	// not expected from the cache.
	f("a new piece first", prev, pieceChain(sys, e, c, d), 108, total, shiftUnknown)
	// Pieces moved in another order: only the first run counts.
	f("reordered", prev, pieceChain(sys, d, c, e), 108+1000, total, shiftYes)
}

func TestShiftStateVerdict(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var s shiftState
	if s.verdict.Load() != shiftUnknown {
		t.Fatal("a new state knows something")
	}
	s.observe(shiftUnknown, log)
	s.observe(shiftYes, log)
	if s.verdict.Load() != shiftYes || s.seen.Load() != 1 {
		t.Fatalf("after a move: %d", s.verdict.Load())
	}
	s.observe(shiftNo, log) // one miss is not enough
	if s.verdict.Load() != shiftYes {
		t.Fatal("one miss turned the verdict")
	}
	s.observe(shiftYes, log)
	s.observe(shiftNo, log)
	s.observe(shiftNo, log)
	if s.verdict.Load() != shiftNo || s.missed.Load() != 3 {
		t.Fatalf("after two misses in a row: %d, missed %d", s.verdict.Load(), s.missed.Load())
	}
	s.reset()
	if s.verdict.Load() != shiftUnknown {
		t.Fatal("reset kept the verdict")
	}
}

// bodyOf is a chat body of these message contents (the first a system
// message).
func bodyOf(contents ...string) []byte {
	msgs := []map[string]string{}
	for i, c := range contents {
		role := "user"
		if i == 0 {
			role = "system"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": c})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}

// words is n words of one kind, for a message.
func words(kind string, n int) string { return strings.TrimSpace(strings.Repeat(kind+" ", n)) }

// TestConnectorLearnsKVShifting: the connector asks every request for
// n_cache_reuse, and learns from the answers whether the server moves the
// KV a prompt keeps when the turns before it left: a server that does is
// seen at once; one that does not after two answers.
func TestConnectorLearnsKVShifting(t *testing.T) {
	for _, shifts := range []bool{true, false} {
		t.Run(fmt.Sprint("shifts=", shifts), func(t *testing.T) {
			h := newHarness(t, 1, nil)
			h.fake.shifts.Store(shifts)
			sys := words("sys", 20)
			turns := []string{words("alpha", 200), words("bravo", 200), words("charlie", 200), words("delta", 200), words("echo", 200), words("foxtrot", 200)}
			send := func(parts ...string) engine.Timings {
				t.Helper()
				tm, body := h.send(&engine.Request{Tenant: "t1", SessionID: "s", Model: "m", Body: bodyOf(append([]string{sys}, parts...)...)})
				if !strings.Contains(string(body), `"n_cache_reuse":64`) {
					t.Fatalf("no n_cache_reuse in %.200s", body)
				}
				return tm
			}
			send(turns[:4]...)
			if !h.c.ShiftsKV("m") || h.c.Stats().ShiftsKV {
				t.Fatal("before any eviction: not presumed shifting, or a verdict")
			}
			tm := send(turns[2:5]...) // the first two turns left
			if !h.c.ShiftsKV("m") {
				t.Fatalf("after one eviction: ShiftsKV false, cache_n %d", tm.CacheN)
			}
			send(turns[3:6]...)
			if shifts != h.c.ShiftsKV("m") {
				t.Fatalf("after two evictions: ShiftsKV %v", h.c.ShiftsKV("m"))
			}
			st := h.c.Stats()
			if st.ShiftsKV != shifts || (shifts && st.KVShifts != 2) || (!shifts && st.KVShiftMisses != 2) {
				t.Fatalf("stats %+v", st)
			}
			if shifts && tm.CacheN < 20+400 {
				t.Fatalf("the fake did not move the kept turns: cache_n %d", tm.CacheN)
			}
		})
	}
}
