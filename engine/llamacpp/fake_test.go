package llamacpp

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
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

const (
	// fakePrefillMs is the prefill time the fake reports per token: far
	// above what a restore of its small files takes, even under -race.
	fakePrefillMs = 5.0
	fakeLayers    = 2
	fakeWidth     = 8
	fakeVocab     = 4096
)

// fakeTokens is the fake server's tokenizer: one token per word, from a
// hash of the word.
func fakeTokens(text string) []int32 {
	var out []int32
	for _, w := range strings.Fields(text) {
		h := uint32(2166136261)
		for i := 0; i < len(w); i++ {
			h = (h ^ uint32(w[i])) * 16777619
		}
		out = append(out, int32(h%fakeVocab))
	}
	return out
}

// fakeLlama is a scripted llama.cpp-compatible server: slots hold the
// tokens of their last prompt, completions report timings from the
// longest common prefix (as cache_prompt does), slot actions really write
// and read state files in the documented layout in dir, GET /slots lists
// task counters and token counts, and a restart (with another model or
// not) empties the slots and resets the counters.
type fakeLlama struct {
	t   testing.TB
	dir string
	// slotsStatus, when not zero, answers every /slots action with it and
	// slotsMsg.
	slotsStatus   int
	slotsMsg      string
	failSave      atomic.Bool
	failRestore   atomic.Bool
	corruptSave   atomic.Bool
	ignoreRestore atomic.Bool // restores "succeed" but leave the slot empty
	// shifts makes the fake move the KV a prompt keeps past a change, as
	// llama-server does for a request's n_cache_reuse (KV shifting).
	shifts atomic.Bool
	// hold, when set (before the first request), picks the chats that
	// generate until their client goes away; each sends its slot on held
	// when it starts, and logs "cancelled <slot>" when its client left.
	hold         func(prompt string) bool
	held         chan int
	restoreDelay time.Duration
	// restoreGate, when set (before the first request), holds each restore
	// until it receives a value.
	restoreGate chan struct{}
	// restoreCost, when clock is set, advances clock on each restore: a
	// restore that costs that much without real time passing.
	restoreCost time.Duration
	clock       *stepClock

	mu       sync.Mutex
	model    int // model seed: its fingerprint
	task     int
	slots    [][]int32
	tasks    []int           // id_task per slot, -1 never used
	busy     []chan struct{} // per slot: held while a chat runs there
	written  map[string][]byte
	restored map[string][]byte
	log      []string // "save 0", "restore 1", "chat 0 <cache_n>", "probe 0", "erase 0"
}

func newFakeLlama(t testing.TB, nslot int) (*fakeLlama, *httptest.Server) {
	f := &fakeLlama{t: t, dir: t.TempDir(), model: 1, written: map[string][]byte{}, restored: map[string][]byte{}, held: make(chan int, 16)}
	f.restart(1, nslot)
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

// restart empties every slot as a restarted server has them, running model.
func (f *fakeLlama) restart(model, nslot int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.model, f.task = model, 0
	f.slots, f.tasks = make([][]int32, nslot), make([]int, nslot)
	if len(f.busy) != nslot {
		f.busy = make([]chan struct{}, nslot)
		for i := range f.busy {
			f.busy[i] = make(chan struct{}, 1)
		}
	}
	for i := range f.tasks {
		f.tasks[i] = -1
	}
}

func (f *fakeLlama) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	switch {
	case r.URL.Path == "/v1/chat/completions":
		f.chat(w, r, body)
	case r.URL.Path == "/completion":
		f.completion(w, body)
	case r.URL.Path == "/v1/models":
		f.mu.Lock()
		fmt.Fprintf(w, `{"data":[{"id":"m","meta":{"n_vocab":%d,"n_embd":%d,"n_params":%d}}]}`, fakeVocab, fakeWidth, 1000)
		f.mu.Unlock()
	case r.URL.Path == "/props":
		fmt.Fprint(w, `{"default_generation_settings":{"n_ctx":4096},"chat_template":"chatml","bos_token":"<s>","eos_token":"</s>"}`)
	case r.URL.Path == "/slots" && r.Method == http.MethodGet:
		f.mu.Lock()
		var out []map[string]any
		for i, s := range f.slots {
			e := map[string]any{"id": i, "n_ctx": 4096, "is_processing": false}
			if f.tasks[i] >= 0 {
				e["id_task"], e["n_prompt_tokens"] = f.tasks[i], len(s)
			}
			out = append(out, e)
		}
		f.mu.Unlock()
		json.NewEncoder(w).Encode(out)
	case strings.HasPrefix(r.URL.Path, "/slots/") && r.Method == http.MethodPost:
		if f.slotsStatus != 0 {
			fakeError(w, f.slotsStatus, f.slotsMsg)
			return
		}
		id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/slots/"))
		if err != nil || id < 0 || id >= len(f.slots) {
			fakeError(w, 400, "Invalid slot ID")
			return
		}
		var req struct{ Filename string }
		_ = json.Unmarshal(body, &req)
		if r.URL.Query().Get("action") == "restore" && f.restoreGate != nil {
			<-f.restoreGate
		}
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

// stateFile writes a slot's tokens as a state file; the model decides the
// V layout, so files of two models never restore into each other.
func (f *fakeLlama) stateFile(id int) []byte {
	nslot := len(f.slots)
	g := genFile{magic: SlotStateMagic, version: SlotStateVersion, tokens: f.slots[id], header: true,
		streams: make([]genStream, nslot), seed: id}
	g.streams[id] = genStream{cells: len(f.slots[id]), vtrans: f.model%2 == 0, layers: fakeLayers, width: fakeWidth, ktype: GGMLTypeF16, seq: int32(id)}
	return g.bytes()
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
		data := f.stateFile(id)
		if f.corruptSave.Load() {
			data = data[:len(data)-3]
		}
		if err := os.WriteFile(filepath.Join(f.dir, name), data, 0o644); err != nil {
			fakeError(w, 500, err.Error())
			return
		}
		f.written[name] = data
		f.log = append(f.log, fmt.Sprintf("save %d", id))
		fmt.Fprintf(w, `{"id_slot":%d,"filename":%q,"n_saved":%d,"n_written":%d,"timings":{"save_ms":1.5}}`, id, name, len(f.slots[id]), len(data))
	case "restore":
		time.Sleep(f.restoreDelay)
		if f.clock != nil {
			f.clock.advance(f.restoreCost)
		}
		data, err := os.ReadFile(filepath.Join(f.dir, name))
		if err != nil || !validName(name) {
			fakeError(w, 400, "failed to restore slot: file not found")
			return
		}
		if f.failRestore.Load() {
			fakeError(w, 500, "failed to restore slot")
			return
		}
		st, err := parseSlotState(data, fakeLayers)
		if err != nil || st.Cells() > 0 && layoutOf(st) != f.layoutLocked() {
			fakeError(w, 500, "failed to restore slot: mismatched layout")
			return
		}
		f.task++
		f.tasks[id] = f.task
		f.slots[id] = append([]int32(nil), st.Tokens...)
		if f.ignoreRestore.Load() {
			f.slots[id] = nil
		}
		f.restored[name] = data
		f.log = append(f.log, fmt.Sprintf("restore %d", id))
		fmt.Fprintf(w, `{"id_slot":%d,"filename":%q,"n_restored":%d,"n_read":%d,"timings":{"restore_ms":1.2}}`, id, name, len(st.Tokens), len(data))
	case "erase":
		f.slots[id] = nil
		f.log = append(f.log, fmt.Sprintf("erase %d", id))
		fmt.Fprintf(w, `{"id_slot":%d,"n_erased":0}`, id)
	default:
		fakeError(w, 400, "Invalid action")
	}
}

// layoutLocked is the KV layout of the model the fake runs.
func (f *fakeLlama) layoutLocked() string {
	g := genFile{magic: SlotStateMagic, version: SlotStateVersion, tokens: []int32{1}, header: true,
		streams: []genStream{{cells: 1, vtrans: f.model%2 == 0, layers: fakeLayers, width: fakeWidth, ktype: GGMLTypeF16}}}
	st, err := parseSlotState(g.bytes(), 0)
	if err != nil {
		panic(err)
	}
	return layoutOf(st)
}

// completion answers the fingerprint probe: its top tokens depend on the
// model. The probe's prompt takes the slot.
func (f *fakeLlama) completion(w http.ResponseWriter, body []byte) {
	var req struct {
		IDSlot *int   `json:"id_slot"`
		Prompt string `json:"prompt"`
	}
	_ = json.Unmarshal(body, &req)
	f.mu.Lock()
	id := 0
	if req.IDSlot != nil && *req.IDSlot >= 0 && *req.IDSlot < len(f.slots) {
		id = *req.IDSlot
	}
	f.task++
	f.tasks[id] = f.task
	f.slots[id] = fakeTokens(req.Prompt)
	f.log = append(f.log, fmt.Sprintf("probe %d", id))
	m := f.model
	f.mu.Unlock()
	fmt.Fprintf(w, `{"content":"x","completion_probabilities":[{"id":1,"top_logprobs":[{"id":%d},{"id":%d}]}]}`, m*7, m*13)
}

func (f *fakeLlama) chat(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		IDSlot      *int `json:"id_slot"`
		CachePrompt bool `json:"cache_prompt"`
		NCacheReuse int  `json:"n_cache_reuse"`
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
	prompt := fakeTokens(strings.Join(text, " "))
	f.mu.Lock()
	id := 0
	if req.IDSlot != nil && *req.IDSlot >= 0 && *req.IDSlot < len(f.slots) {
		id = *req.IDSlot
	}
	busy := f.busy[id]
	f.mu.Unlock()
	// One request at a time per slot, as the server runs them: a request
	// for a busy slot waits (or gives up when its client goes away).
	select {
	case busy <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	defer func() { <-busy }()
	if f.hold != nil && f.hold(strings.Join(text, " ")) {
		// A generation that runs until its client goes away.
		f.held <- id
		<-r.Context().Done()
		f.mu.Lock()
		f.log = append(f.log, fmt.Sprintf("cancelled %d", id))
		f.mu.Unlock()
		return
	}
	f.mu.Lock()
	lcp := 0
	if req.CachePrompt {
		for lcp < len(prompt) && lcp < len(f.slots[id]) && prompt[lcp] == f.slots[id][lcp] {
			lcp++
		}
	}
	if req.CachePrompt && req.NCacheReuse > 0 && f.shifts.Load() {
		// llama-server's chunk reuse: past the common prefix, chunks of
		// the slot's tokens found further on, in order, are moved.
		cached, hc, hp := f.slots[id], lcp, lcp
		for hc < len(cached) && hp < len(prompt) {
			n := 0
			for hc+n < len(cached) && hp+n < len(prompt) && cached[hc+n] == prompt[hp+n] {
				n++
			}
			if n >= req.NCacheReuse {
				lcp += n
				hc, hp = hc+n, hp+n
			} else {
				hc++
			}
		}
	}
	f.task++
	f.tasks[id] = f.task
	f.slots[id] = prompt
	f.log = append(f.log, fmt.Sprintf("chat %d %d", id, lcp))
	f.mu.Unlock()
	n := len(prompt) - lcp
	fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":%d,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":%d}},`+
		`"timings":{"cache_n":%d,"prompt_n":%d,"prompt_ms":%g,"predicted_n":1,"predicted_ms":0.5}}`,
		len(prompt), lcp, lcp, n, float64(n)*fakePrefillMs)
}

// logOf returns the fake's log entries of one kind ("save", "restore",
// "chat", "probe", "erase", "cancelled") since mark.
func (f *fakeLlama) logOf(kind string, mark int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, l := range f.log[mark:] {
		if strings.HasPrefix(l, kind+" ") {
			out = append(out, l)
		}
	}
	return out
}

// logBeforeChat returns the fake's log entries of one kind since mark and
// before the first chat after it: what a request's Before did.
func (f *fakeLlama) logBeforeChat(kind string, mark int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, l := range f.log[mark:] {
		if strings.HasPrefix(l, "chat ") {
			break
		}
		if strings.HasPrefix(l, kind+" ") {
			out = append(out, l)
		}
	}
	return out
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
	t     testing.TB
	fake  *fakeLlama
	srv   *httptest.Server
	cache *kv.Cache
	dir   string // the cache's archive
	opts  Options
	c     *Connector
	warns *countHandler
}

func newHarness(t testing.TB, slots int, mod func(*Options)) *harness {
	t.Helper()
	fake, srv := newFakeLlama(t, slots)
	h := &harness{t: t, fake: fake, srv: srv, dir: t.TempDir(), warns: &countHandler{}}
	h.opts = Options{BaseURL: srv.URL + "/v1", SlotDir: fake.dir, Slots: slots, Logger: slog.New(h.warns), MinSaveTokens: 4,
		BackgroundQuiet: -1} // tests of the quiet period set it
	if mod != nil {
		mod(&h.opts)
	}
	h.open()
	return h
}

// open opens the cache and a connector over it (again, after close).
func (h *harness) open() {
	h.t.Helper()
	cache, err := kv.Open(kv.Options{Store: tiersOptions(h.dir), MaxBlobBytes: 1 << 30})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { cache.Close() })
	h.opts.Cache = cache
	c, err := New(h.opts)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	h.cache, h.c = cache, c
}

func tiersOptions(dir string) tiers.Options { return tiers.Options{Dir: dir} }

// close closes the connector and the cache, as a sidecar shutting down.
func (h *harness) close() {
	h.t.Helper()
	if err := h.c.Close(); err != nil {
		h.t.Fatal(err)
	}
	if err := h.cache.Close(); err != nil {
		h.t.Fatal(err)
	}
}

const sharedDoc = "the shared document every session of this test starts with and that is long enough to be worth a restore"

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

// sharedBody is a conversation that starts with sharedDoc.
func sharedBody(session string, turn int) []byte {
	msgs := []map[string]string{{"role": "system", "content": sharedDoc}}
	for i := range turn {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("question %d of %s", i, session)})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}

func promptLenOf(body []byte) int {
	var req struct{ Messages []struct{ Content string } }
	_ = json.Unmarshal(body, &req)
	var text []string
	for _, m := range req.Messages {
		text = append(text, m.Content)
	}
	return len(fakeTokens(strings.Join(text, " ")))
}

func promptLen(session string, turn int) int { return promptLenOf(chatBody(session, turn)) }

// send runs one request through Before, the server and After, as the
// proxy does, and returns the response's timings and the body sent.
func (h *harness) send(req *engine.Request) (engine.Timings, []byte) {
	h.t.Helper()
	ctx := context.Background()
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
	h.c.After(ctx, req, &engine.Response{Status: res.StatusCode, Body: out})
	tm, ok := engine.ParseTimings(out)
	if !ok {
		h.t.Fatalf("no timings in %s", out)
	}
	return tm, body
}

// do runs one turn of session's conversation and lets the background
// saver finish, as the idle time between turns does.
func (h *harness) do(session string, turn int) (engine.Timings, []byte) {
	h.t.Helper()
	tm, body := h.send(&engine.Request{Tenant: "t1", SessionID: session, Model: "m", Body: chatBody(session, turn)})
	h.c.Flush()
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

// sessionTokens returns the tokens of the newest state a session saved.
func (h *harness) sessionTokens(session string) int {
	l := h.c.cat.session(sessKey("t1", session))
	if len(l) == 0 {
		return 0
	}
	return l[len(l)-1].tokens
}

// stepClock is a clock.Clock that moves only when advanced; its zero value
// reads the Unix epoch.
type stepClock struct{ ns atomic.Int64 }

func (c *stepClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *stepClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// After is real time: the connector's timers are not what tests step.
func (c *stepClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
