package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// recount is an independent tokenizer instance (own cache) for MEM-001.
var recount = NewTokenizer(1 << 16)

type instantSummarizer struct{}

func (instantSummarizer) Summarize(_ context.Context, req SummaryRequest) (Summary, error) {
	return Summary{Text: fmt.Sprintf("summary of %d messages", len(req.Messages))}, nil
}

// mem001 drives one random conversation through Prepare and Complete and
// checks MEM-001 on every window: it never exceeds the hard limit (recounted
// with an independent tokenizer), always starts with the client's system
// messages and always holds the newest user message and what follows it.
type mem001Stats struct{ ok, tooLarge, evicted, blocks int }

func mem001(t testing.TB, seed uint64, limitRaw, toolsRaw uint16, turns int, knobs uint8) (st mem001Stats) {
	r := rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))
	sysRes := 1 + r.IntN(400)
	toolsRes := 1 + r.IntN(400)
	limit := sysRes + toolsRes + minHistory + int(limitRaw)%6000
	tools := 0
	if r.IntN(3) == 0 {
		tools = int(toolsRaw) % 700
	}
	strategy := Strategy(knobs % 3)
	fullClient := (knobs/3)%2 == 0
	mode := ModeAppend // the header names the style, or ModeAuto detects it
	if fullClient {
		mode = ModeFull
	}
	if (knobs/6)%2 == 1 {
		mode = ModeAuto
	}
	evictTo := 0.5 + r.Float64()/2
	// The recall block's share, as large as the reserves leave room for
	// (drawn apart so that the conversations stay those of the seed).
	share := min(rand.New(rand.NewPCG(seed, 7)).Float64()*0.3, 1-float64(sysRes+toolsRes+minHistory)/float64(limit))
	if share <= 0 {
		share = -1 // no recall block
	}
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Window.Limit = limit
		o.Window.SystemReserve = sysRes
		o.Window.ToolsReserve = toolsRes
		o.Window.Strategy = strategy
		o.Window.EvictTo = evictTo
		o.Window.StableMaxTokens = 1 + r.IntN(600)
		o.Recall.Share = share
		o.Extraction.Summarizer = instantSummarizer{}
		o.PendingWait = -1
	})
	enc := s.Encoding("test-model")

	var sys []Message
	for range r.IntN(3) {
		sys = append(sys, text("system", randText(r, r.IntN(120))))
	}
	conv := append([]Message(nil), sys...) // what a full-history client holds
	sysSent := false
	var sentBlocks []json.RawMessage
	for turn := 0; turn < turns; turn++ {
		var newMsgs []Message
		if r.IntN(8) == 0 && turn > 0 {
			// A tool round: the assistant called a tool, the tool answered.
			id := fmt.Sprintf("call_%d", turn)
			call := msg(t, fmt.Sprintf(`{"role":"assistant","content":null,"tool_calls":[{"id":%q,"type":"function","function":{"name":"lookup","arguments":"{\"q\":\"%s\"}"}}]}`, id, vocab[r.IntN(len(vocab))]))
			if fullClient || mode != ModeAuto {
				// A client that sends only new input without a header
				// never sends assistant messages: the upstream made them.
				newMsgs = append(newMsgs, call)
			}
			newMsgs = append(newMsgs, msg(t, fmt.Sprintf(`{"role":"tool","tool_call_id":%q,"content":%q}`, id, randText(r, r.IntN(80)))))
		}
		user := text("user", fmt.Sprintf("u%d %s", turn, randText(r, 1+r.IntN(150))))
		newMsgs = append(newMsgs, user)

		var req []Message
		if fullClient {
			req = append(append([]Message(nil), conv...), newMsgs...)
		} else {
			if !sysSent {
				req = append(req, sys...)
			}
			req = append(req, newMsgs...)
		}
		tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "tenant", SessionID: "sess", Mode: mode, Model: "test-model", Messages: req, ToolsTokens: tools})
		if err == nil && tr.Stats.AsSent {
			// Legitimate only when system + current turn + tools cannot
			// fit; the window is then the request exactly as sent.
			need := tools + countWindow(t, recount, enc, raws(sys))
			need += countWindow(t, recount, enc, raws([]Message{user}))
			if need <= limit {
				t.Fatalf("turn %d: sent as is but system+user+tools = %d ≤ %d", turn, need, limit)
			}
			if fmt.Sprint(rawStrings(tr.Messages)) != fmt.Sprint(rawStrings(raws(req))) {
				t.Fatalf("turn %d: a request over the limit was not sent as is", turn)
			}
			st.tooLarge++
			// The engine refuses it too: the failed turn leaves the
			// session as it was, and the client drops the message.
			if err := tr.Fail(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("turn %d: Prepare: %v", turn, err)
		}
		sysSent = true
		conv = append(conv, newMsgs...)
		st.ok++
		st.evicted += tr.Stats.Evicted
		if tr.Block != nil {
			st.blocks++
		}

		got := countWindow(t, recount, enc, tr.Messages)
		if got+tools > limit {
			t.Fatalf("MEM-001 turn %d: window %d + tools %d = %d tokens > limit %d", turn, got, tools, got+tools, limit)
		}
		if got+tools != tr.Stats.TotalTokens {
			t.Fatalf("turn %d: stats say %d tokens, recount %d", turn, tr.Stats.TotalTokens, got+tools)
		}
		for i, m := range sys {
			if i >= len(tr.Messages) || string(tr.Messages[i]) != string(m.Raw) {
				t.Fatalf("MEM-001 turn %d: system message %d dropped or moved", turn, i)
			}
		}
		if tr.Stable != nil && string(tr.Messages[len(sys)]) != string(tr.Stable) {
			t.Fatalf("turn %d: stable block not right after the system messages", turn)
		}
		n := len(tr.Messages)
		if n == 0 || string(tr.Messages[n-1]) != string(user.Raw) {
			t.Fatalf("MEM-001 turn %d: newest user message is not the window's last", turn)
		}
		if tr.Block != nil && string(tr.Messages[n-2]) != string(tr.Block) {
			t.Fatalf("turn %d: recall block not right before the newest user message", turn)
		}
		if want := map[bool]string{true: "full", false: "append"}[fullClient]; tr.Stats.Mode != want && tr.Stats.Match != "new" {
			t.Fatalf("turn %d: a %s client taken as %s (%s)", turn, want, tr.Stats.Mode, tr.Stats.Match)
		}
		assertSubsequence(t, tr.Messages[len(sys):], conv, append([]json.RawMessage{tr.Block, tr.Stable}, sentBlocks...)...)

		reply := text("assistant", fmt.Sprintf("a%d %s", turn, randText(r, r.IntN(120))))
		switch r.IntN(10) {
		case 0:
			tr.Abort()
			continue
		case 1:
			tr.CompletePartial(reply)
		default:
			tr.Complete(reply)
		}
		if tr.Block != nil {
			sentBlocks = append(sentBlocks, tr.Block) // kept in the transcript
		}
		conv = append(conv, reply)
	}
	return st
}

func raws(ms []Message) []json.RawMessage {
	out := make([]json.RawMessage, len(ms))
	for i, m := range ms {
		out[i] = m.Raw
	}
	return out
}

// assertSubsequence checks the window's history keeps the conversation's
// order (the block aside).
func assertSubsequence(t testing.TB, window []json.RawMessage, conv []Message, blocks ...json.RawMessage) {
	t.Helper()
	j := 0
	for _, w := range window {
		if slices.ContainsFunc(blocks, func(b json.RawMessage) bool { return b != nil && string(w) == string(b) }) {
			continue
		}
		for j < len(conv) && string(conv[j].Raw) != string(w) {
			j++
		}
		if j == len(conv) {
			t.Fatalf("window message out of order or unknown: %.80s", w)
		}
		j++
	}
}

func TestMEM001Property(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 60
	if testing.Short() {
		n = 15
	}
	var total mem001Stats
	for i := 0; i < n; i++ {
		seed := r.Uint64()
		limit, tools := uint16(r.Uint32()), uint16(r.Uint32())
		knobs := uint8(r.Uint32())
		turns := 5 + r.IntN(40)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			st := mem001(t, seed, limit, tools, turns, knobs)
			total.ok += st.ok
			total.tooLarge += st.tooLarge
			total.evicted += st.evicted
			total.blocks += st.blocks
		})
	}
	// The generator must reach every regime, or the property is vacuous.
	if total.ok == 0 || total.tooLarge == 0 || total.evicted == 0 || total.blocks == 0 {
		t.Fatalf("generator too narrow: %+v", total)
	}
	t.Logf("windows %d, refused %d, evicted %d, with block %d", total.ok, total.tooLarge, total.evicted, total.blocks)
}

func FuzzMEM001(f *testing.F) {
	f.Add(uint64(1), uint16(0), uint16(0), uint8(10), uint8(0))
	f.Add(uint64(2), uint16(300), uint16(500), uint8(30), uint8(1))
	f.Add(uint64(3), uint16(5000), uint16(100), uint8(20), uint8(2))
	f.Add(uint64(4), uint16(60000), uint16(9), uint8(25), uint8(4))
	f.Fuzz(func(t *testing.T, seed uint64, limit, tools uint16, turns, knobs uint8) {
		mem001(t, seed, limit, tools, int(turns%30), knobs)
	})
}

func TestWindowEvictionIsStickyBetweenOverflows(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Window.Limit = 700
		o.Window.SystemReserve = 60
		o.Window.ToolsReserve = 60
		o.Window.Strategy = StrategyTail
		o.Window.EvictTo = 0.5
		o.Recall.K = -1
	})
	sys := text("system", "stable system prompt")
	conv := []Message{sys}
	var prev []json.RawMessage
	evictions, stable := 0, 0
	for i := 0; i < 40; i++ {
		conv = append(conv, text("user", fmt.Sprintf("q%d %s", i, strings.Repeat("alpha beta ", 8))))
		tr := prepare(t, s, "t", "s", ModeFull, conv...)
		if tr.Stats.Evicted > 0 {
			evictions++
		} else if prev != nil {
			// No eviction: the previous window is a prefix of this one.
			p := commonPrefix(prev, tr.Messages)
			if p.Messages != len(prev) {
				t.Fatalf("turn %d: no eviction but only %d of %d messages shared", i, p.Messages, len(prev))
			}
			stable++
		}
		a := text("assistant", fmt.Sprintf("a%d", i))
		tr.Complete(a)
		conv = append(conv, a)
		prev = append(tr.Messages, a.Raw)
	}
	if evictions == 0 || stable < 2*evictions {
		t.Fatalf("evictions %d, stable turns %d: hysteresis not working", evictions, stable)
	}
}

// TestBlockCountIsAdditive checks the claim the block's cost rests on: for
// both encodings, the count of the joined segments equals the sum of the
// segments' counts, for contents chosen to stress the pre-tokenizers
// (leading and trailing whitespace, "/", apostrophes, digits, CJK, emoji).
func TestBlockCountIsAdditive(t *testing.T) {
	pieces := []string{"a", "Z", "'s", "'LL", " ", "  ", "\n", "\r\n", "\t", "/", "//", ".", "!?", "123", "4567",
		"日本語", "नमस्ते", "🙂", "é", "-", "#", "[x]", "don't", "\u00a0", "ﬁ", "\u200b", "<|endoftext|>", "a/b", "\n/", " /"}
	r := rand.New(rand.NewPCG(9, 9))
	content := func() string {
		var b strings.Builder
		for range r.IntN(12) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		return b.String()
	}
	tk := NewTokenizer(0)
	roles := []string{"user", "assistant", "tool", "fact"}
	n := 1500
	if testing.Short() {
		n = 300
	}
	for i := 0; i < n; i++ {
		segs := []string{stableHeader}
		if r.IntN(2) == 0 {
			segs = append(segs, blockPinned)
			for range 1 + r.IntN(3) {
				segs = append(segs, summarySegment(&Unit{Content: content()}))
			}
		}
		segs = append(segs, blockSummaries)
		for range 1 + r.IntN(3) {
			segs = append(segs, summarySegment(&Unit{Content: content()}))
		}
		segs = append(segs, recallHeader)
		for range 1 + r.IntN(4) {
			it := recallItem{role: roles[r.IntN(len(roles))], text: content(), cross: r.IntN(2) == 0}
			if r.IntN(4) > 0 {
				it.at = time.Unix(1_700_000_000+r.Int64N(1e8), 0)
			}
			if d := dateSegment(it.at); d != "" {
				segs = append(segs, d)
			}
			segs = append(segs, it.segment())
		}
		joined := strings.Join(segs, "")
		for _, enc := range []Encoding{CL100K, O200K} {
			sum := 0
			for _, s := range segs {
				sum += tk.Count(enc, s)
			}
			if got := tk.Count(enc, joined); got != sum {
				t.Fatalf("%v: count(%q) = %d, sum of segments %d", enc, joined, got, sum)
			}
		}
	}
}

// TestEvictionWhenTheEngineShifts: when the engine moves the KV a prompt
// keeps (WindowOptions.EngineShifts), history leaves the window oldest
// first, in small steps, so what stays after an eviction is one run of the
// previous prompt's messages, in order, right after its unchanged start
// (what llama-server's n_cache_reuse moves) and the window stays full;
// otherwise it leaves in the large steps of EvictTo.
func TestEvictionWhenTheEngineShifts(t *testing.T) {
	for _, shifts := range []bool{false, true} {
		t.Run(fmt.Sprint("shifts=", shifts), func(t *testing.T) {
			s := openStore(t, t.TempDir(), func(o *Options) {
				o.Window.Limit = 900
				o.Window.EngineShifts = func(model string) bool { return shifts && model == "test-model" }
				o.Recall.K = -1 // the kept run alone
			})
			r := rand.New(rand.NewPCG(3, 5))
			var prev []json.RawMessage
			evictions, fill, fills := 0, 0, 0
			for i := 0; i < 80; i++ {
				q := text("user", fmt.Sprintf("q%d %s", i, randText(r, 10+r.IntN(30))))
				if i == 3 {
					q = text("user", "IMPORTANT: always remember my passport number 4471! "+randText(r, 10))
				}
				tr := prepare2(t, s, "t", "s", "", text("system", "You are a helpful assistant."), q)
				if tr.Stats.Evicted > 0 && prev != nil {
					evictions++
					// The new prompt: the system start, then a run of the
					// previous prompt's messages, in order and with nothing
					// between them, then the new message.
					if string(tr.Messages[0]) != string(prev[0]) {
						t.Fatalf("turn %d: the prompt's start moved", i)
					}
					kept := tr.Messages[1 : len(tr.Messages)-1]
					at := slices.IndexFunc(prev, func(m json.RawMessage) bool { return string(m) == string(kept[0]) })
					run := at >= 0 && at+len(kept) <= len(prev)
					for j := 0; run && j < len(kept); j++ {
						run = string(prev[at+j]) == string(kept[j])
					}
					if shifts && (!run || at+len(kept) != len(prev)) {
						t.Fatalf("turn %d: the kept history is not the previous prompt's tail in one run", i)
					}
					fill += tr.Stats.HistoryTokens
					fills++
				}
				a := text("assistant", fmt.Sprintf("a%d %s", i, randText(r, 5)))
				if err := tr.Complete(a); err != nil {
					t.Fatal(err)
				}
				prev = append(append([]json.RawMessage(nil), tr.Messages...), a.Raw)
			}
			if evictions < 2 {
				t.Fatalf("%d evictions", evictions)
			}
			mean := fill / fills
			t.Logf("shifts=%v: %d evictions, history after one %d tokens", shifts, evictions, mean)
			if shifts && mean < 500 || !shifts && mean > 400 {
				t.Fatalf("history after an eviction: %d tokens on average", mean)
			}
		})
	}
}
