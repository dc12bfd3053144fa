package llamacpp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/kv"
)

func TestLlamaCPPEvictionAndReturn(t *testing.T) {
	h := newHarness(t, 2, nil)
	// A and B fill the two slots; each is saved once idle; A's second turn
	// finds its slot.
	_, bodyA := h.do("A", 1)
	_, bodyB := h.do("B", 1)
	if slotOf(t, bodyA) == slotOf(t, bodyB) {
		t.Fatalf("A and B share slot %d", slotOf(t, bodyA))
	}
	if got := h.fake.logOf("save", 0); len(got) != 2 {
		t.Fatalf("saves %v, want one per session", got)
	}
	tm, body := h.do("A", 2)
	if slotOf(t, body) != slotOf(t, bodyA) || tm.CacheN != int64(promptLen("A", 1)) {
		t.Fatalf("A's second turn: slot %d cache_n %d, want slot %d cache_n %d", slotOf(t, body), tm.CacheN, slotOf(t, bodyA), promptLen("A", 1))
	}
	// C takes the least recently used slot, B's, whose KV is stored
	// already: nothing is saved on C's request path.
	mark := h.fake.logLen()
	_, bodyC := h.send(&engine.Request{Tenant: "t1", SessionID: "C", Model: "m", Body: chatBody("C", 1)})
	if slotOf(t, bodyC) != slotOf(t, bodyB) {
		t.Fatalf("C got slot %d, want B's %d", slotOf(t, bodyC), slotOf(t, bodyB))
	}
	if got := h.fake.logBeforeChat("save", mark); len(got) != 0 {
		t.Fatalf("C's request saved %v", got)
	}
	h.c.Flush()
	// B returns to A's slot (the LRU now): B's state is restored there and
	// B's next turn reuses its whole earlier prompt.
	mark = h.fake.logLen()
	tm, body = h.do("B", 2)
	slot := slotOf(t, body)
	if got := h.fake.logOf("restore", mark); len(got) != 1 || got[0] != fmt.Sprintf("restore %d", slot) {
		t.Fatalf("restores %v", got)
	}
	if tm.CacheN != int64(promptLen("B", 1)) || tm.PromptN != int64(promptLen("B", 2)-promptLen("B", 1)) {
		t.Fatalf("B after restore: %+v", tm)
	}
	// The file restored is the one the server wrote, byte for byte.
	var saved []byte
	for name, b := range h.fake.written {
		if bytes.Equal(h.fake.restored[strings.Replace(strings.Replace(name, "save", "restore", 1), "-"+strconv.Itoa(slotOf(t, bodyB))+"restore", "-"+strconv.Itoa(slot)+"restore", 1)], b) {
			saved = b
		}
	}
	if saved == nil {
		t.Fatal("restored file differs from every saved one")
	}
	if names := dirEntries(t, h.fake.dir); len(names) != 0 {
		t.Fatalf("slot dir keeps %v", names)
	}
	s := h.c.Stats()
	if !s.Enabled || s.Restores != 1 || s.Evictions != 0 || s.SlotHits != 1 || s.PrefixReuses != 0 ||
		s.SaveErrors+s.RestoreErrors+s.ParseErrors != 0 || s.TimedResponses != 5 || s.Sessions != 3 || s.QueueDepth != 0 {
		t.Fatalf("stats %+v", s)
	}
	// A state superseded by a newer one of the same conversation is gone:
	// one state per session.
	var tierBytes int64
	for _, b := range s.StateBytesByTier {
		tierBytes += b
	}
	if s.States != 3 || s.Saves != 5 || s.StatesDeleted != 2 || tierBytes != s.StateBytes || s.StateBytes == 0 {
		t.Fatalf("states %d, saves %d, deleted %d", s.States, s.Saves, s.StatesDeleted)
	}
	// kv.Cache counts the turns itself: every save a computed miss, the
	// restore a hit loaded from a tier.
	ks, am := h.cache.Stats(), h.cache.AmortizationStats()
	if ks.Hits != 1 || ks.Misses != 5 || am.Computes != 5 || am.MeanComputeCost <= 0 || len(am.MeanLoadCost) != 1 {
		t.Fatalf("kv cache stats %+v, amortization %+v", ks, am)
	}
	ss, ok := h.c.SessionStats("t1", "B")
	if !ok || ss.Slot != slot || ss.Requests != 2 || ss.Saves != 2 || ss.Restores != 1 || ss.Last.CacheN != int64(promptLen("B", 1)) || ss.SavedTokens != promptLen("B", 2) {
		t.Fatalf("B's stats %+v", ss)
	}
	if ss, _ := h.c.SessionStats("t1", "A"); ss.Slot != -1 || ss.Saves != 2 {
		t.Fatalf("A's stats %+v", ss)
	}
	if _, ok := h.c.SessionStats("t2", "B"); ok {
		t.Fatal("another tenant sees B")
	}
	if len(h.warns.warns) != 0 {
		t.Fatalf("warnings %v", h.warns.warns)
	}

	// Its hooks show the same: /metrics (the families of every connector
	// and its own) and the console's facts.
	hk := engine.Wrap(h.c)
	reg := obs.New()
	hk.ExportMetrics(reg)
	var m bytes.Buffer
	reg.WritePrometheus(&m)
	for _, want := range []string{`sidecar_engine_enabled{connector="llamacpp"} 1`, "sidecar_engine_requests_total 5",
		"sidecar_engine_restores_total 1", "sidecar_engine_saves_total 5", "sidecar_engine_states 3", "sidecar_engine_restores_off 0",
		fmt.Sprintf("sidecar_engine_reused_tokens_total %d", s.ReusedTokens)} {
		if !strings.Contains(m.String(), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	f := hk.ConsoleFacts()
	if f.Status != "on" || f.Summary != "5 requests, 5 saves, 1 restores on the request path" || len(f.Lines) != 4 ||
		f.Lines[1].Name != "States kept" || !strings.HasPrefix(f.Lines[1].Value, "3 (") || len(f.Tiers) == 0 {
		t.Fatalf("console facts %+v", f)
	}
	if r, ok := hk.Report().(Stats); !ok || r.Restores != 1 || hk.Stats().Connector != Name {
		t.Fatalf("report %+v", hk.Report())
	}
	var (
		_ engine.PreRequest      = h.c
		_ engine.PostResponse    = h.c
		_ engine.Settler         = h.c
		_ engine.Reporter        = h.c
		_ engine.SessionReporter = h.c
		_ engine.Forgetter       = h.c
		_ engine.MetricsExporter = h.c
		_ engine.ConsoleReporter = h.c
		_ engine.Snapshotter     = h.c
	)
}

// A slot whose KV is not saved yet when another session needs it is saved
// first, on that request's path: nothing is lost.
func TestLlamaCPPEvictionSavesUnsavedKV(t *testing.T) {
	h := newHarness(t, 1, func(o *Options) { o.NoBackgroundSave = true })
	h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 1)})
	mark := h.fake.logLen()
	h.send(&engine.Request{Tenant: "t1", SessionID: "B", Model: "m", Body: chatBody("B", 1)})
	if got := h.fake.logBeforeChat("save", mark); len(got) != 1 {
		t.Fatalf("saves before B's chat: %v", got)
	}
	tm, _ := h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 2)})
	if tm.CacheN != int64(promptLen("A", 1)) {
		t.Fatalf("A reused %d tokens, want %d", tm.CacheN, promptLen("A", 1))
	}
	if s := h.c.Stats(); s.Evictions != 2 || s.Restores != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestLlamaCPPSaveFailureKeepsOlderState(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1) // saved
	h.do("B", 1)
	h.do("A", 2) // A1 restored
	h.fake.failSave.Store(true)
	h.do("A", 3) // A3's save fails
	_, body := h.do("B", 2)
	if slotOf(t, body) != 0 {
		t.Fatalf("B's request went without its slot: %s", body)
	}
	if s := h.c.Stats(); s.SaveErrors == 0 {
		t.Fatalf("stats %+v", s)
	}
	// A's older state is still kept and restored: A reuses that prefix.
	h.fake.failSave.Store(false)
	tm, _ := h.do("A", 4)
	if tm.CacheN != int64(promptLen("A", 2)) {
		t.Fatalf("A reused %d tokens, want its last saved prompt's %d", tm.CacheN, promptLen("A", 2))
	}
	if names := dirEntries(t, h.fake.dir); len(names) != 0 {
		t.Fatalf("slot dir keeps %v", names)
	}
}

func TestLlamaCPPRestoreFailure(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1)
	h.do("B", 1)
	h.fake.failRestore.Store(true)
	tm, body := h.do("A", 2)
	if slotOf(t, body) != 0 || tm.CacheN >= int64(promptLen("A", 1)) {
		t.Fatalf("after a failed restore: slot %d, cache_n %d", slotOf(t, body), tm.CacheN)
	}
	if s := h.c.Stats(); s.RestoreErrors != 1 || s.Restores != 0 {
		t.Fatalf("stats %+v", s)
	}
	h.fake.failRestore.Store(false)
	h.do("B", 2)
	tm, _ = h.do("A", 3)
	if tm.CacheN != int64(promptLen("A", 2)) {
		t.Fatalf("A reused %d tokens, want %d", tm.CacheN, promptLen("A", 2))
	}
	if names := dirEntries(t, h.fake.dir); len(names) != 0 {
		t.Fatalf("slot dir keeps %v", names)
	}
}

func TestLlamaCPPDisabled(t *testing.T) {
	for _, tc := range []struct {
		status int
		msg    string
	}{
		{404, "File Not Found"},
		{501, "This server does not support slots action. Start it with `--slot-save-path`"},
		{500, "This server does not support slots action. Start it with `--slot-save-path`"},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			h := newHarness(t, 2, nil)
			h.fake.slotsStatus, h.fake.slotsMsg = tc.status, tc.msg
			for i := range 5 {
				req := &engine.Request{Tenant: "t", SessionID: "S" + strconv.Itoa(i%3), Model: "m", Body: chatBody("S", i)}
				body, err := h.c.Before(context.Background(), req)
				if err != nil || !bytes.Equal(body, req.Body) {
					t.Fatalf("disabled connector changed the body or failed: %v", err)
				}
				h.c.After(context.Background(), req, &engine.Response{Status: 200, Body: []byte(`{"timings":{"cache_n":0,"prompt_n":10,"prompt_ms":3}}`)})
			}
			s := h.c.Stats()
			if s.Enabled || s.DisabledReason == "" || s.Responses != 5 || s.TimedResponses != 5 {
				t.Fatalf("stats %+v", s)
			}
			if n := h.warns.count("disabled"); n != 1 {
				t.Fatalf("%d warnings, want one", n)
			}
			if err := h.c.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A server that loses its slot API later (restarted without
// --slot-save-path) disables the connector at the first failed call.
func TestLlamaCPPDisabledLater(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1)
	h.fake.slotsStatus, h.fake.slotsMsg = 501, "This server does not support slots action. Start it with `--slot-save-path`"
	_, body := h.do("B", 1) // B's background save fails with 501: disabled
	if slotOf(t, body) != 0 {
		t.Fatalf("the request before it found out keeps its slot: %s", body)
	}
	_, body = h.do("C", 1)
	if slotOf(t, body) != -1 {
		t.Fatalf("disabled connector rewrote the body: %s", body)
	}
	if s := h.c.Stats(); s.Enabled || h.warns.count("disabled") != 1 {
		t.Fatalf("stats %+v, warnings %v", s, h.warns.warns)
	}
}

// A stateless request goes to a slot too, never to one holding a
// session's unsaved KV without saving it first, and reuses a stored
// prefix like a session does.
func TestLlamaCPPStatelessRequests(t *testing.T) {
	h := newHarness(t, 2, nil)
	_, bodyA := h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: sharedBody("A", 1)})
	_, body := h.send(&engine.Request{Tenant: "t1", Model: "m", Body: sharedBody("x", 1)})
	if s := slotOf(t, body); s < 0 || s == slotOf(t, bodyA) {
		t.Fatalf("stateless request went to slot %d (A holds %d)", s, slotOf(t, bodyA))
	}
	h.c.Flush()
	// A third request, stateless too, with two slots holding KV: it takes
	// one whose KV is stored, and restores the shared document there.
	mark := h.fake.logLen()
	tm, _ := h.send(&engine.Request{Tenant: "t1", Model: "m", Body: sharedBody("y", 1)})
	if len(h.fake.logBeforeChat("save", mark)) != 0 || tm.CacheN < int64(len(fakeTokens(sharedDoc))) {
		t.Fatalf("log %v, timings %+v", h.fake.log[mark:], tm)
	}
	tm, _ = h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: sharedBody("A", 2)})
	if tm.CacheN != int64(promptLenOf(sharedBody("A", 1))) {
		t.Fatalf("A lost its KV to stateless requests: %+v", tm)
	}
}

func TestLlamaCPPCloseSavesAndForget(t *testing.T) {
	h := newHarness(t, 2, nil)
	h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 1)})
	h.send(&engine.Request{Tenant: "t1", SessionID: "B", Model: "m", Body: chatBody("B", 1)})
	h.c.Flush()
	if err := h.c.Forget(context.Background(), "t1", "B"); err != nil {
		t.Fatal(err)
	}
	if got := h.fake.logOf("erase", 0); len(got) != 1 {
		t.Fatalf("forget did not erase B's slot: %v", h.fake.log)
	}
	if _, ok := h.c.SessionStats("t1", "B"); ok || h.sessionTokens("B") != 0 {
		t.Fatal("B's stats or state survive Forget")
	}
	// A's second turn is not saved before Close; Close saves it.
	h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 2)})
	h.c.mu.Lock()
	h.c.sched.saveCandidate() // the saver may or may not have run: Close saves what is left
	h.c.mu.Unlock()
	if err := h.c.Close(); err != nil {
		t.Fatal(err)
	}
	if h.sessionTokens("A") != promptLen("A", 2) {
		t.Fatalf("Close did not save A's last turn: %d tokens kept", h.sessionTokens("A"))
	}
	// After Close, requests pass through.
	req := &engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 3)}
	if body, _ := h.c.Before(context.Background(), req); !bytes.Equal(body, req.Body) {
		t.Fatal("closed connector rewrote a body")
	}
	if err := h.c.Close(); err != nil {
		t.Fatal(err)
	}
}

// A restarted sidecar finds the states in the tiers again and restores
// them, whatever the server's slots hold.
func TestLlamaCPPSidecarRestart(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1)
	h.do("B", 1)
	h.close()
	h.open()
	tm, _ := h.do("A", 2)
	if tm.CacheN != int64(promptLen("A", 1)) {
		t.Fatalf("after a sidecar restart A reused %d tokens, want %d", tm.CacheN, promptLen("A", 1))
	}
	if s := h.c.Stats(); s.Restores != 1 || s.States != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// A server restart empties the slots: a session that believed it held one
// is restored from the tiers. A restart with another model (same shape and
// KV layout) refuses its states.
func TestLlamaCPPServerRestart(t *testing.T) {
	h := newHarness(t, 2, nil)
	h.do("A", 1)
	h.do("B", 1)
	h.fake.restart(1, 2)
	tm, _ := h.do("A", 2)
	if tm.CacheN != int64(promptLen("A", 1)) {
		t.Fatalf("after a server restart A reused %d tokens, want %d", tm.CacheN, promptLen("A", 1))
	}
	if s := h.c.Stats(); s.Restarts != 1 || s.Restores != 1 {
		t.Fatalf("stats %+v", s)
	}
	h.fake.restart(3, 2) // another model, same layout
	mark := h.fake.logLen()
	tm, _ = h.do("B", 2)
	if tm.CacheN != 0 || len(h.fake.logOf("restore", mark)) != 0 {
		t.Fatalf("a state of another model was restored: %+v %v", tm, h.fake.log[mark:])
	}
	tm, _ = h.do("B", 3)
	if tm.CacheN != int64(promptLen("B", 2)) {
		t.Fatalf("B under the new model: %+v", tm)
	}
}

// A state of another KV layout (another type or flash attention) is
// refused by the server; the request prefills and nothing is lost.
func TestLlamaCPPLayoutMismatch(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1)
	h.do("B", 1)
	h.fake.restart(2, 1) // vtrans differs
	tm, _ := h.do("A", 2)
	if tm.CacheN != 0 {
		t.Fatalf("%+v", tm)
	}
	if s := h.c.Stats(); s.Restores != 0 || s.RestoreErrors+s.Refused+s.RestoreMisses == 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A client talking to the server directly can replace a slot's KV: the
// connector notices (GET /slots) and restores the session.
func TestLlamaCPPForeignSlotUse(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1)
	res, err := http.Post(h.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"id_slot":0,"messages":[{"content":"someone else entirely"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	tm, _ := h.do("A", 2)
	if tm.CacheN != int64(promptLen("A", 1)) {
		t.Fatalf("A reused %d tokens, want %d", tm.CacheN, promptLen("A", 1))
	}
	if s := h.c.Stats(); s.SlotsLost != 1 || s.Restores != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A new session that starts with a document another session computed
// restores that session's state and reuses the shared prefix; another
// tenant does not.
func TestLlamaCPPPrefixReuseAcrossSessions(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: sharedBody("A", 2)})
	h.c.Flush()
	doc := int64(len(fakeTokens(sharedDoc)))
	tm, _ := h.send(&engine.Request{Tenant: "t2", SessionID: "D", Model: "m", Body: sharedBody("D", 1)})
	h.c.Flush()
	if s := h.c.Stats(); s.PrefixReuses != 0 {
		t.Fatalf("another tenant reused A's state: %+v", s)
	}
	tm, _ = h.send(&engine.Request{Tenant: "t1", SessionID: "E", Model: "m", Body: sharedBody("E", 1)})
	if tm.CacheN < doc {
		t.Fatalf("E reused %d tokens, want at least the shared document's %d", tm.CacheN, doc)
	}
	if s := h.c.Stats(); s.PrefixReuses != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// The sidecar's own calls borrow a slot whose KV is saved, saving it first
// if need be: no session reprocesses its prompt because of them.
func TestLlamaCPPBackgroundCallsEvictNobody(t *testing.T) {
	h := newHarness(t, 2, nil)
	h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 1)})
	h.send(&engine.Request{Tenant: "t1", SessionID: "B", Model: "m", Body: chatBody("B", 1)})
	for i := range 3 {
		h.send(&engine.Request{Tenant: "t1", SessionID: "A", Model: "m", Background: true,
			Body: []byte(`{"model":"m","messages":[{"role":"user","content":"extract facts ` + strconv.Itoa(i) + `"}]}`)})
	}
	for _, s := range []string{"A", "B"} {
		tm, _ := h.send(&engine.Request{Tenant: "t1", SessionID: s, Model: "m", Body: chatBody(s, 2)})
		if tm.CacheN != int64(promptLen(s, 1)) {
			t.Fatalf("%s reused %d tokens after background calls, want %d", s, tm.CacheN, promptLen(s, 1))
		}
	}
	if s := h.c.Stats(); s.BackgroundCalls != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// Restores the engine accepts but does not reuse stop after a few, with
// one warning.
func TestLlamaCPPUnusedRestoresStop(t *testing.T) {
	h := newHarness(t, 1, func(o *Options) { o.UnusedRestores = 2 })
	h.fake.ignoreRestore.Store(true)
	for turn := 1; turn <= 4; turn++ {
		h.do("A", turn)
		h.do("B", turn)
	}
	s := h.c.Stats()
	if !s.RestoresOff || s.UnusedRestores != 2 || s.Restores != 2 || h.warns.count("does not reuse") != 1 {
		t.Fatalf("stats %+v, warnings %v", s, h.warns.warns)
	}
}

// A restore that costs more than the prefill it saves is skipped once both
// are measured, after costSamples restores, not on one measurement; then
// every one is.
func TestLlamaCPPRestoreOnlyWhenItPays(t *testing.T) {
	clk := &stepClock{}
	h := newHarness(t, 1, func(o *Options) { o.Clock = clk })
	h.fake.clock, h.fake.restoreCost = clk, 500*time.Millisecond // against fakePrefillMs per token of prefill
	h.do("A", 1)
	h.do("B", 1)
	turn := 2
	for ; turn <= 8 && h.c.Stats().RestoreSkips == 0; turn++ {
		h.do("A", turn)
		h.do("B", turn)
	}
	s := h.c.Stats()
	if s.RestoreSkips == 0 || s.Restores < 3 { // costSamples: not decided on one restore
		t.Fatalf("restored %d, skipped %d by turn %d; want skips only after %d restores", s.Restores, s.RestoreSkips, turn, costSamples)
	}
	restores := s.Restores
	h.do("A", turn)
	h.do("B", turn)
	if s := h.c.Stats(); s.Restores != restores || s.RestoreSkips < 3 {
		t.Fatalf("after the measures: restored %d (was %d), skipped %d", s.Restores, restores, s.RestoreSkips)
	}
}

// A corrupt state file is not kept, and what was kept before stays.
func TestLlamaCPPCorruptFileNotKept(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1)
	h.fake.corruptSave.Store(true)
	h.do("A", 2)
	if s := h.c.Stats(); s.ParseErrors != 1 || s.Saves != 1 {
		t.Fatalf("stats %+v", s)
	}
	if h.sessionTokens("A") != promptLen("A", 1) {
		t.Fatal("the older state was not kept")
	}
}

// Many sessions over few slots at once: every request gets a slot in
// range, nothing is left in the directory, counters add up.
func TestLlamaCPPConcurrent(t *testing.T) {
	h := newHarness(t, 3, nil)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				session := "S" + strconv.Itoa((g+i)%5)
				req := &engine.Request{Tenant: "t", SessionID: session, Model: "m", Body: chatBody(session, i), Background: i%4 == 3}
				body, err := h.c.Before(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				if s := slotOf(t, body); s < 0 || s >= 3 {
					t.Errorf("slot %d", s)
				}
				res, err := http.Post(h.srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				out, _ := io.ReadAll(res.Body)
				res.Body.Close()
				h.c.After(context.Background(), req, &engine.Response{Status: res.StatusCode, Body: out})
			}
		}()
	}
	wg.Wait()
	if err := h.c.Close(); err != nil {
		t.Fatal(err)
	}
	s := h.c.Stats()
	if s.Requests != 48 || s.Responses != 48 || s.SlotHits+s.SlotAssigns != 48 || s.SaveErrors+s.ParseErrors+s.RestoreErrors != 0 || s.QueueDepth != 0 {
		t.Fatalf("stats %+v", s)
	}
	if names := dirEntries(t, h.fake.dir); len(names) != 0 {
		t.Fatalf("slot dir keeps %v", names)
	}
}

func TestLlamaCPPOptions(t *testing.T) {
	cache, err := kv.Open(kv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o600)
	for _, o := range []Options{
		{SlotDir: dir, Cache: cache},
		{BaseURL: "http://x", Cache: cache},
		{BaseURL: "http://x", SlotDir: dir},
		{BaseURL: "http://x", SlotDir: filepath.Join(dir, "missing"), Cache: cache},
		{BaseURL: "http://x", SlotDir: file, Cache: cache},
		{BaseURL: "http://x", SlotDir: dir, Cache: cache, Slots: -1},
		{BaseURL: "http://x", SlotDir: dir, Cache: cache, SlotTimeout: -1},
		{BaseURL: "http://x", SlotDir: dir, Cache: cache, MinSaveTokens: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	// Files an interrupted run left behind are removed; others stay.
	os.WriteFile(filepath.Join(dir, "kvsidecar-abc-0save.slot"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(dir, ".tmp-kvsidecar-abc-0restore.slot-1"), []byte("x"), 0o600)
	c, err := New(Options{BaseURL: "http://x/v1/", SlotDir: dir, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.opts.BaseURL != "http://x" || c.opts.Slots != 1 || c.opts.Namespace == "" || c.opts.SlotTimeout == 0 || c.opts.MaxStateBytes == 0 || c.opts.MinSaveTokens != 64 {
		t.Fatalf("defaults %+v", c.opts)
	}
	if names := dirEntries(t, dir); len(names) != 1 || names[0] != "f" {
		t.Fatalf("slot dir after start: %v", names)
	}
}

func TestSlotFileNamesFromHashes(t *testing.T) {
	ch := chain{hashes: []uint64{7}, bytes: []int64{1}}
	for _, s := range []string{"../../etc/passwd", "a b", "", strings.Repeat("x", 5000), "名前"} {
		n := opFileName(stateKey("fp", sessKey("t", s), ch), 3, "save")
		if !validName(n) || len(n) != len("kvsidecar-")+32+len("-3save.slot") || strings.Contains(n, s) && s != "" {
			t.Fatalf("file name %q from %q", n, s)
		}
	}
	if sessKey("t", "ab") == sessKey("ta", "b") || sessKey("t1", "s") == sessKey("t2", "s") {
		t.Fatal("keys collide")
	}
}

// A slot action slower than SlotTimeout, and a state the cache cannot
// keep, leave requests working: they prefill.
func TestLlamaCPPTimeoutsAndStoreFailures(t *testing.T) {
	h := newHarness(t, 1, func(o *Options) { o.SlotTimeout = 100 * time.Millisecond })
	h.do("A", 1)
	h.do("B", 1)
	h.fake.restoreDelay = 300 * time.Millisecond
	tm, body := h.do("A", 2)
	if slotOf(t, body) != 0 || tm.CacheN >= int64(promptLen("A", 1)) {
		t.Fatalf("after a timed-out restore: %s %+v", body, tm)
	}
	if s := h.c.Stats(); s.RestoreErrors != 1 {
		t.Fatalf("stats %+v", s)
	}
	h.fake.restoreDelay = 0

	// A cache that cannot hold a state (too large here; a full disk fails
	// the same way): the save fails, the requests go on.
	small := newHarness(t, 1, nil)
	small.close()
	cache, err := kv.Open(kv.Options{Store: tiersOptions(small.dir), MaxBlobBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	small.opts.Cache = cache
	c, err := New(small.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	small.c, small.cache = c, cache
	for turn := 1; turn <= 2; turn++ {
		if _, body := small.do("A", turn); slotOf(t, body) != 0 {
			t.Fatalf("turn %d: %s", turn, body)
		}
		small.do("B", turn)
	}
	if s := c.Stats(); s.SaveErrors == 0 || s.Saves != 0 || s.Responses != 4 {
		t.Fatalf("stats %+v", s)
	}
}
