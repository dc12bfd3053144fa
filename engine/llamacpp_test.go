package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

const (
	fakeLayers = 2
	fakeWidth  = 8
	fakeVocab  = 4096
)

// fakeLlama is a scripted llama.cpp-compatible server: slots hold the
// tokens of their last prompt, completions report timings from the
// longest common prefix (as cache_prompt does), and slot actions really
// write and read state files in the documented layout in dir.
type fakeLlama struct {
	t     *testing.T
	dir   string
	nslot int
	// slotsStatus, when not zero, answers every /slots call with it and
	// slotsMsg.
	slotsStatus int
	slotsMsg    string
	failSave    atomic.Bool
	failRestore atomic.Bool

	mu       sync.Mutex
	slots    [][]int32
	written  map[string][]byte // file name → bytes of the last save
	restored map[string][]byte // file name → bytes of the last restore
	log      []string          // "save 0 name", "restore 1 name", "chat 0 cache_n"
	bodies   [][]byte
}

func newFakeLlama(t *testing.T, nslot int) (*fakeLlama, *httptest.Server) {
	f := &fakeLlama{t: t, dir: t.TempDir(), nslot: nslot, slots: make([][]int32, nslot),
		written: map[string][]byte{}, restored: map[string][]byte{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeLlama) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	switch {
	case r.URL.Path == "/v1/chat/completions":
		f.chat(w, body)
	case strings.HasPrefix(r.URL.Path, "/slots/") && r.Method == http.MethodPost:
		if f.slotsStatus != 0 {
			fakeError(w, f.slotsStatus, f.slotsMsg)
			return
		}
		id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/slots/"))
		if err != nil || id < 0 || id >= f.nslot {
			fakeError(w, 400, "Invalid slot ID")
			return
		}
		var req struct{ Filename string }
		_ = json.Unmarshal(body, &req)
		f.slotAction(w, id, r.URL.Query().Get("action"), req.Filename)
	default:
		fakeError(w, 404, "File Not Found")
	}
}

func fakeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%d,"message":%q,"type":"x"}}`, status, msg)
}

func validName(n string) bool {
	return n != "" && !strings.ContainsAny(n, "/\\ ") && !strings.HasPrefix(n, ".")
}

func (f *fakeLlama) slotAction(w http.ResponseWriter, id int, action, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch action {
	case "save":
		if !validName(name) {
			fakeError(w, 400, "Invalid filename")
			return
		}
		if f.failSave.Load() {
			fakeError(w, 500, "failed to save slot")
			return
		}
		// -np N without a unified KV: N streams, this slot's non-empty.
		g := genFile{magic: SlotStateMagic, version: SlotStateVersion, tokens: f.slots[id], header: true,
			streams: make([]genStream, f.nslot), seed: id}
		g.streams[id] = genStream{cells: len(f.slots[id]), vtrans: id%2 == 1, layers: fakeLayers, width: fakeWidth, ktype: GGMLTypeF16, seq: int32(id)}
		data := g.bytes()
		if err := os.WriteFile(filepath.Join(f.dir, name), data, 0o644); err != nil {
			fakeError(w, 500, err.Error())
			return
		}
		f.written[name] = data
		f.log = append(f.log, fmt.Sprintf("save %d %s", id, name))
		fmt.Fprintf(w, `{"id_slot":%d,"filename":%q,"n_saved":%d,"n_written":%d,"timings":{"save_ms":1.5}}`, id, name, len(f.slots[id]), len(data))
	case "restore":
		data, err := os.ReadFile(filepath.Join(f.dir, name))
		if err != nil || !validName(name) {
			fakeError(w, 400, "failed to restore slot: file not found")
			return
		}
		if f.failRestore.Load() {
			fakeError(w, 500, "failed to restore slot")
			return
		}
		st, err := ParseSlotState(data, fakeLayers)
		if err != nil {
			fakeError(w, 500, err.Error())
			return
		}
		f.slots[id] = append([]int32(nil), st.Tokens...)
		f.restored[name] = data
		f.log = append(f.log, fmt.Sprintf("restore %d %s", id, name))
		fmt.Fprintf(w, `{"id_slot":%d,"filename":%q,"n_restored":%d,"n_read":%d,"timings":{"restore_ms":1.2}}`, id, name, len(st.Tokens), len(data))
	case "erase":
		f.slots[id] = nil
		f.log = append(f.log, fmt.Sprintf("erase %d", id))
		fmt.Fprintf(w, `{"id_slot":%d,"n_erased":0}`, id)
	default:
		fakeError(w, 400, "Invalid action")
	}
}

func (f *fakeLlama) chat(w http.ResponseWriter, body []byte) {
	var req struct {
		IDSlot      *int `json:"id_slot"`
		CachePrompt bool `json:"cache_prompt"`
		Messages    []struct{ Content string }
	}
	if err := json.Unmarshal(body, &req); err != nil {
		fakeError(w, 400, err.Error())
		return
	}
	var text []string
	for _, m := range req.Messages {
		text = append(text, m.Content)
	}
	prompt := HashTokens(strings.Join(text, " "), fakeVocab)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	id := 0
	if req.IDSlot != nil && *req.IDSlot >= 0 && *req.IDSlot < f.nslot {
		id = *req.IDSlot
	}
	lcp := 0
	if req.CachePrompt {
		for lcp < len(prompt) && lcp < len(f.slots[id]) && prompt[lcp] == f.slots[id][lcp] {
			lcp++
		}
	}
	f.slots[id] = prompt
	f.log = append(f.log, fmt.Sprintf("chat %d %d", id, lcp))
	f.mu.Unlock()
	n := len(prompt) - lcp
	fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":%d,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":%d}},`+
		`"timings":{"cache_n":%d,"prompt_n":%d,"prompt_ms":%g,"predicted_n":1,"predicted_ms":0.5}}`,
		len(prompt), lcp, lcp, n, float64(n)*0.1)
}

func (f *fakeLlama) lastLog() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.log) == 0 {
		return ""
	}
	return f.log[len(f.log)-1]
}

func (f *fakeLlama) logSince(i int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log[i:]...)
}

func (f *fakeLlama) logLen() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.log)
}

// countHandler counts warnings.
type countHandler struct {
	mu    sync.Mutex
	warns []string
}

func (h *countHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.warns = append(h.warns, r.Message)
	h.mu.Unlock()
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }
func (h *countHandler) count(sub string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, w := range h.warns {
		if strings.Contains(w, sub) {
			n++
		}
	}
	return n
}

type harness struct {
	t     *testing.T
	fake  *fakeLlama
	srv   *httptest.Server
	cache *kv.Cache
	c     *LlamaCPP
	warns *countHandler
}

func newHarness(t *testing.T, slots int, mod func(*LlamaCPPOptions)) *harness {
	t.Helper()
	fake, srv := newFakeLlama(t, slots)
	cache, err := kv.Open(kv.Options{Store: tiers.Options{NoFlushOnClose: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	h := &countHandler{}
	o := LlamaCPPOptions{BaseURL: srv.URL + "/v1", SlotDir: fake.dir, Slots: slots, Cache: cache, Logger: slog.New(h)}
	if mod != nil {
		mod(&o)
	}
	c, err := NewLlamaCPP(o)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, fake: fake, srv: srv, cache: cache, c: c, warns: h}
}

// chatBody is a conversation whose prompt starts with the session's
// prefix and grows by turn.
func chatBody(session string, turn int) []byte {
	msgs := []map[string]string{{"role": "system", "content": "you are the assistant of " + session + " " + strings.Repeat("memory-of-"+session+" ", 20)}}
	for i := range turn {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("question %d of %s", i, session)})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}

func promptLen(session string, turn int) int {
	var req struct{ Messages []struct{ Content string } }
	_ = json.Unmarshal(chatBody(session, turn), &req)
	var text []string
	for _, m := range req.Messages {
		text = append(text, m.Content)
	}
	return len(HashTokens(strings.Join(text, " "), fakeVocab))
}

// do runs one request through Before, the upstream and After, as the
// proxy does, and returns the response's timings.
func (h *harness) do(session string, turn int) (Timings, []byte) {
	h.t.Helper()
	ctx := context.Background()
	req := &Request{Tenant: "t1", SessionID: session, Model: "m", Body: chatBody(session, turn)}
	body, err := h.c.Before(ctx, req)
	if err != nil {
		h.t.Fatalf("before: %v", err)
	}
	res, err := http.Post(h.srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	out, _ := io.ReadAll(res.Body)
	res.Body.Close()
	h.c.After(ctx, req, &Response{Status: res.StatusCode, Body: out})
	tm, ok := ParseTimings(out)
	if !ok {
		h.t.Fatalf("no timings in %s", out)
	}
	return tm, body
}

func slotOf(t *testing.T, body []byte) int {
	t.Helper()
	var v struct {
		IDSlot      *int  `json:"id_slot"`
		CachePrompt *bool `json:"cache_prompt"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	if v.IDSlot == nil {
		return -1
	}
	if v.CachePrompt == nil || !*v.CachePrompt {
		t.Fatalf("id_slot without cache_prompt: %s", body)
	}
	return *v.IDSlot
}

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestLlamaCPPEvictionAndReturn(t *testing.T) {
	h := newHarness(t, 2, nil)
	// A and B fill the two slots; A's second turn hits its slot.
	_, bodyA := h.do("A", 1)
	_, bodyB := h.do("B", 1)
	if slotOf(t, bodyA) == slotOf(t, bodyB) {
		t.Fatalf("A and B share slot %d", slotOf(t, bodyA))
	}
	tm, body := h.do("A", 2)
	if slotOf(t, body) != slotOf(t, bodyA) || tm.CacheN != int64(promptLen("A", 1)) {
		t.Fatalf("A's second turn: slot %d cache_n %d, want slot %d cache_n %d", slotOf(t, body), tm.CacheN, slotOf(t, bodyA), promptLen("A", 1))
	}
	// C takes the least recently used slot, B's: B is saved.
	mark := h.fake.logLen()
	_, bodyC := h.do("C", 1)
	if slotOf(t, bodyC) != slotOf(t, bodyB) {
		t.Fatalf("C got slot %d, want B's %d", slotOf(t, bodyC), slotOf(t, bodyB))
	}
	nameB := opFileName(ownerKey("t1", "B", "m"), slotOf(t, bodyB), "save")
	if got := h.fake.logSince(mark); len(got) != 2 || got[0] != fmt.Sprintf("save %d %s", slotOf(t, bodyB), nameB) {
		t.Fatalf("log %v, want B's save then C's chat", got)
	}
	// B's state is in the cache, byte for byte as the server wrote it.
	st, raw, tier, err := h.c.SessionState("t1", "B", "m")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, h.fake.written[nameB]) || tier == tiers.TierNone || len(st.Tokens) != promptLen("B", 1) {
		t.Fatalf("kept %d bytes (%d tokens) in %s; server wrote %d", len(raw), len(st.Tokens), tier, len(h.fake.written[nameB]))
	}
	if blk, err := st.Block("m"); err != nil || blk.Tokens != len(st.Tokens) || blk.Layers() != fakeLayers {
		t.Fatalf("block: %v", err)
	}
	// B returns: A's slot is the LRU now; A is saved, B restored there,
	// and B's next turn reuses its whole earlier prompt.
	mark = h.fake.logLen()
	tm, body = h.do("B", 2)
	slot := slotOf(t, body)
	nameA := opFileName(ownerKey("t1", "A", "m"), slot, "save")
	nameBr := opFileName(ownerKey("t1", "B", "m"), slot, "restore")
	want := []string{fmt.Sprintf("save %d %s", slot, nameA), fmt.Sprintf("restore %d %s", slot, nameBr), fmt.Sprintf("chat %d %d", slot, promptLen("B", 1))}
	if got := h.fake.logSince(mark); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("log %v, want %v", got, want)
	}
	if tm.CacheN != int64(promptLen("B", 1)) || tm.PromptN != int64(promptLen("B", 2)-promptLen("B", 1)) {
		t.Fatalf("B after restore: %+v", tm)
	}
	if !bytes.Equal(h.fake.restored[nameBr], h.fake.written[nameB]) {
		t.Fatal("restored file differs from the saved one")
	}
	if names := dirEntries(t, h.fake.dir); len(names) != 0 {
		t.Fatalf("slot dir keeps %v", names)
	}
	s := h.c.Stats()
	if !s.Enabled || s.Saves != 2 || s.Restores != 1 || s.Evictions != 2 || s.RestoreMisses != 3 || s.SlotHits != 1 ||
		s.SaveErrors+s.RestoreErrors+s.ParseErrors+s.StoreErrors != 0 || s.TimedResponses != 5 || s.Sessions != 3 {
		t.Fatalf("stats %+v", s)
	}
	// The same turns in kv.Cache's figures: A1, B1 and C1 prefilled
	// (misses costing the engine's prompt_ms), A2 found its slot and B2
	// was restored (hits).
	ks, am := h.cache.Stats(), h.cache.AmortizationStats()
	if ks.Hits != 2 || ks.Misses != 3 || am.TotalTurns != 5 || am.Computes != 3 || am.MeanComputeCost <= 0 || len(am.MeanLoadCost) == 0 {
		t.Fatalf("kv cache stats %+v, amortization %+v", ks, am)
	}
	ss, ok := h.c.SessionStats("t1", "B")
	if !ok || ss.Slot != slot || ss.Requests != 2 || ss.Saves != 1 || ss.Restores != 1 || ss.Last.CacheN != int64(promptLen("B", 1)) || ss.SavedTokens != promptLen("B", 1) {
		t.Fatalf("B's stats %+v", ss)
	}
	if ss, _ := h.c.SessionStats("t1", "A"); ss.Slot != -1 || ss.Saves != 1 {
		t.Fatalf("A's stats %+v", ss)
	}
	if _, ok := h.c.SessionStats("t2", "B"); ok {
		t.Fatal("another tenant sees B")
	}
	if len(h.warns.warns) != 0 {
		t.Fatalf("warnings %v", h.warns.warns)
	}
}

func TestLlamaCPPSaveFailureKeepsOlderState(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.do("A", 1)
	h.do("B", 1) // saves A (turn 1)
	h.do("A", 2) // saves B, restores A
	h.fake.failSave.Store(true)
	_, body := h.do("B", 2) // A's save fails: the request still goes, to slot 0
	if slotOf(t, body) != 0 {
		t.Fatalf("B's request went without its slot: %s", body)
	}
	s := h.c.Stats()
	if s.SaveErrors != 1 || s.Saves != 2 {
		t.Fatalf("stats %+v", s)
	}
	// A's turn-1 state is still kept and restored: A reuses that prefix.
	h.fake.failSave.Store(false)
	tm, _ := h.do("A", 3)
	if tm.CacheN != int64(promptLen("A", 1)) {
		t.Fatalf("A reused %d tokens, want its turn-1 prompt of %d", tm.CacheN, promptLen("A", 1))
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
	if _, _, _, err := h.c.SessionState("t1", "A", "m"); err != nil {
		t.Fatalf("A's state was lost: %v", err)
	}
	h.fake.failRestore.Store(false)
	h.do("B", 2) // saves A turn 2, restores B
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
				req := &Request{Tenant: "t", SessionID: "S" + strconv.Itoa(i%3), Model: "m", Body: chatBody("S", i)}
				body, err := h.c.Before(context.Background(), req)
				if err != nil || !bytes.Equal(body, req.Body) {
					t.Fatalf("disabled connector changed the body or failed: %v", err)
				}
				h.c.After(context.Background(), req, &Response{Status: 200, Body: []byte(`{"timings":{"cache_n":0,"prompt_n":10,"prompt_ms":3}}`)})
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
	_, body := h.do("B", 1) // A's save fails with 501: disabled
	if slotOf(t, body) != 0 {
		t.Fatalf("the request that found out still keeps its slot: %s", body)
	}
	_, body = h.do("C", 1)
	if slotOf(t, body) != -1 {
		t.Fatalf("disabled connector rewrote the body: %s", body)
	}
	if s := h.c.Stats(); s.Enabled || h.warns.count("disabled") != 1 {
		t.Fatalf("stats %+v, warnings %v", s, h.warns.warns)
	}
}

func TestLlamaCPPStatelessPassesThrough(t *testing.T) {
	h := newHarness(t, 1, nil)
	req := &Request{Body: []byte(`{"model":"m","messages":[]}`)}
	body, err := h.c.Before(context.Background(), req)
	if err != nil || !bytes.Equal(body, req.Body) {
		t.Fatalf("stateless body changed: %s %v", body, err)
	}
	h.c.After(context.Background(), req, &Response{Status: 200})
	if h.fake.logLen() != 0 {
		t.Fatalf("stateless request touched the server: %v", h.fake.log)
	}
}

func TestLlamaCPPCloseSavesAndForget(t *testing.T) {
	h := newHarness(t, 2, nil)
	h.do("A", 1)
	h.do("B", 1)
	if err := h.c.Forget(context.Background(), "t1", "B"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h.fake.lastLog(), "erase ") {
		t.Fatalf("forget did not erase B's slot: %v", h.fake.log)
	}
	if _, ok := h.c.SessionStats("t1", "B"); ok {
		t.Fatal("B's stats survive Forget")
	}
	if err := h.c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := h.c.SessionState("t1", "A", "m"); err != nil {
		t.Fatalf("Close did not save A: %v", err)
	}
	if _, _, _, err := h.c.SessionState("t1", "B", "m"); err == nil {
		t.Fatal("Close saved the forgotten B")
	}
	// After Close, requests pass through.
	req := &Request{Tenant: "t1", SessionID: "A", Model: "m", Body: chatBody("A", 2)}
	if body, _ := h.c.Before(context.Background(), req); !bytes.Equal(body, req.Body) {
		t.Fatal("closed connector rewrote a body")
	}
	if err := h.c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestLlamaCPPSaveOnResponse(t *testing.T) {
	h := newHarness(t, 2, func(o *LlamaCPPOptions) { o.SaveOnResponse = true })
	h.do("A", 1)
	st, _, _, err := h.c.SessionState("t1", "A", "m")
	if err != nil || len(st.Tokens) != promptLen("A", 1) {
		t.Fatalf("after one response: %v", err)
	}
	h.do("A", 2)
	if st, _, _, _ = h.c.SessionState("t1", "A", "m"); len(st.Tokens) != promptLen("A", 2) {
		t.Fatalf("kept %d tokens, want the latest %d", len(st.Tokens), promptLen("A", 2))
	}
}

// A corrupt state file is not kept, and what was kept before stays.
func TestLlamaCPPCorruptFileNotKept(t *testing.T) {
	h := newHarness(t, 1, func(o *LlamaCPPOptions) { o.Layers = fakeLayers + 1 })
	h.do("A", 1)
	h.do("B", 1)
	if s := h.c.Stats(); s.ParseErrors != 1 || s.Saves != 0 {
		t.Fatalf("stats %+v", s)
	}
	if _, _, _, err := h.c.SessionState("t1", "A", "m"); err == nil {
		t.Fatal("a file with the wrong layer count was kept")
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
				req := &Request{Tenant: "t", SessionID: session, Model: "m", Body: chatBody(session, i)}
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
				h.c.After(context.Background(), req, &Response{Status: res.StatusCode, Body: out})
			}
		}()
	}
	wg.Wait()
	if err := h.c.Close(); err != nil {
		t.Fatal(err)
	}
	s := h.c.Stats()
	if s.Requests != 48 || s.Responses != 48 || s.SlotHits+s.SlotAssigns != 48 || s.SaveErrors+s.ParseErrors+s.StoreErrors+s.RestoreErrors != 0 {
		t.Fatalf("stats %+v", s)
	}
	if s.Restores+s.RestoreMisses != s.SlotAssigns {
		t.Fatalf("%d restores and %d misses for %d assignments", s.Restores, s.RestoreMisses, s.SlotAssigns)
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
	for _, o := range []LlamaCPPOptions{
		{SlotDir: dir, Cache: cache},
		{BaseURL: "http://x", Cache: cache},
		{BaseURL: "http://x", SlotDir: dir},
		{BaseURL: "http://x", SlotDir: filepath.Join(dir, "missing"), Cache: cache},
		{BaseURL: "http://x", SlotDir: file, Cache: cache},
		{BaseURL: "http://x", SlotDir: dir, Cache: cache, Slots: -1},
		{BaseURL: "http://x", SlotDir: dir, Cache: cache, SlotTimeout: -1},
	} {
		if _, err := NewLlamaCPP(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	c, err := NewLlamaCPP(LlamaCPPOptions{BaseURL: "http://x/v1/", SlotDir: dir, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	if c.opts.BaseURL != "http://x" || c.opts.Slots != 1 || c.opts.Namespace == "" || c.opts.SlotTimeout == 0 || c.opts.MaxStateBytes == 0 {
		t.Fatalf("defaults %+v", c.opts)
	}
}

func TestSlotFileNamesFromHashes(t *testing.T) {
	for _, s := range []string{"../../etc/passwd", "a b", "", strings.Repeat("x", 5000), "名前"} {
		n := opFileName(ownerKey("t", s, "m/../x"), 3, "save")
		if !validName(n) || len(n) != len("kvsidecar-")+32+len("-3save.slot") || strings.Contains(n, s) && s != "" {
			t.Fatalf("file name %q from %q", n, s)
		}
	}
	if ownerKey("t", "a", "b") == ownerKey("t", "ab", "") || ownerKey("t1", "s", "m") == ownerKey("t2", "s", "m") {
		t.Fatal("keys collide")
	}
}
