package main

// End-to-end tests against the real llama.cpp server of ../shared/llama
// (issue 10): the sidecar binary with --engine llamacpp in front of a
// llama-server started by bench/harness/llamaserver, asserting on llama.cpp's own
// timings (prompt_n: tokens reprocessed, cache_n: tokens reused). Where the
// server or python3 is missing they skip, or fail under
// KVSIDECAR_REQUIRE_LLAMA=1 (as in CI).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// realStack is a llama-server and the sidecar in front of it.
type realStack struct {
	t       *testing.T
	llama   *llamaserver.Server
	dataDir string
	args    []string // the sidecar's flags
	log     string   // the sidecar's log, appended across restarts
	sc      *child
	client  openai.Client
	// clientPromptN sums the prompt_n of every client turn: what the
	// server processed beyond it came from the sidecar's own calls.
	clientPromptN int64
}

// newRealStack starts a llama-server with slots slots and its RAM prompt
// cache off (so any reuse after a slot changed hands is the sidecar's), and
// the sidecar on its defaults plus the llamacpp engine flags and extra.
func newRealStack(t *testing.T, slots int, model string, extra ...string) *realStack {
	t.Helper()
	llama := llamatest.Start(t, llamaserver.Options{
		Model: model, Slots: slots, CacheRAMMiB: -1, Threads: 1,
		// Random weights never end an answer: bound the sidecar's own
		// calls (the client's set max_tokens).
		Args: []string{"--n-predict", "128"},
	})
	s := &realStack{t: t, llama: llama, dataDir: t.TempDir(), log: filepath.Join(t.TempDir(), "sidecar.log")}
	s.args = []string{"--upstream", llama.URL(), "--data-dir", s.dataDir, "--engine", "llamacpp",
		"--llamacpp-slot-dir", llama.SlotDir(), "--llamacpp-slots", strconv.Itoa(slots)}
	s.args = append(s.args, extra...)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(s.log)
			t.Logf("sidecar log ends:\n%s", tail(string(b), 4000))
		}
	})
	s.startSidecar()
	return s
}

// convos starts n conversations named name-0.. name-(n-1), each on a
// 1,000-token document of its own (seeds seed, seed+1, …).
func (s *realStack) convos(name string, n, seed int) []*convo {
	s.t.Helper()
	cs := make([]*convo, n)
	for i := range cs {
		doc, _ := realDoc(s.t, s.llama, seed+i, 1000)
		cs[i] = newConvo(fmt.Sprintf("%s-%d", name, i), doc)
	}
	return cs
}

// startSidecar runs the sidecar binary (this test binary) with s.args,
// appending its log to s.log.
func (s *realStack) startSidecar() {
	t := s.t
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--listen", "127.0.0.1:0"}, s.args...)...)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	cmd.SysProcAttr = launch.SysProcAttr()
	c := startCmd(t, cmd, s.log)
	s.sc = c
	s.client = openai.NewClient(option.WithBaseURL("http://"+c.addr+"/v1/"), option.WithAPIKey("sk-real"), option.WithMaxRetries(0))
}

// killSidecar kills the sidecar with SIGKILL and waits for it.
func (s *realStack) killSidecar() { s.sc.kill() }

// waitIdle waits, as a user pauses between turns, until the sidecar's
// background engine queue is empty (sidecar_engine_queue_depth, where it
// exports it; else one second more) and the llama-server has no request
// in flight, at least 300 ms after the last response. Bounded by 30 s.
func (s *realStack) waitIdle() {
	s.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	quiet, hasQueue := 0, false
	for quiet < 3 {
		if time.Now().After(deadline) {
			s.t.Logf("the sidecar or llama-server was still busy after 30 s")
			return
		}
		time.Sleep(100 * time.Millisecond)
		busy := false
		if m, err := workload.ScrapeMetrics(ctx, "http://"+s.sc.admin+"/metrics"); err == nil {
			q, ok := m.Get("sidecar_engine_queue_depth")
			hasQueue = ok
			busy = ok && q > 0
		}
		if m, err := workload.ScrapeMetrics(ctx, s.llama.URL()+"/metrics"); err == nil {
			p, _ := m.Get("llamacpp:requests_processing")
			d, _ := m.Get("llamacpp:requests_deferred")
			busy = busy || p+d > 0
		}
		if busy {
			quiet = 0
		} else {
			quiet++
		}
	}
	if !hasQueue {
		time.Sleep(time.Second)
	}
}

// serverPromptTokens is the llama-server's own count of prompt tokens
// processed since it started.
func (s *realStack) serverPromptTokens() int64 {
	m, err := workload.ScrapeMetrics(context.Background(), s.llama.URL()+"/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	v, _ := m.Get("llamacpp:prompt_tokens_total")
	return int64(v)
}

// convo is a full-history client's conversation.
type convo struct {
	id         string
	msgs       []openai.ChatCompletionMessageParamUnion
	lastPrompt int64 // prompt tokens of the previous turn
}

func newConvo(id, system string) *convo {
	return &convo{id: id, msgs: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system)}}
}

// turnTimings are llama.cpp's figures for one turn.
type turnTimings struct {
	PromptN, CacheN int64
	Prompt          int64 // PromptN + CacheN
	New             int64 // what the turn added to the previous prompt
}

func (tt turnTimings) String() string {
	return fmt.Sprintf("prompt %d tokens (%d new): prompt_n %d, cache_n %d", tt.Prompt, tt.New, tt.PromptN, tt.CacheN)
}

// say sends the next user message of c through the sidecar with openai-go
// and returns the turn's timings.
func (s *realStack) say(c *convo, text string) turnTimings {
	s.t.Helper()
	c.msgs = append(c.msgs, openai.UserMessage(text))
	comp, err := s.client.Chat.Completions.New(context.Background(),
		openai.ChatCompletionNewParams{Model: "tiny", Messages: c.msgs, MaxTokens: openai.Int(6), Temperature: openai.Float(0)},
		// Each conversation is one end user of an app (the OpenAI "user"
		// field): the sessions do not recall one another.
		option.WithHeader("X-Session-ID", c.id), option.WithJSONSet("user", c.id), option.WithJSONSet("grammar", "root ::= [a-z ]+"))
	if err != nil {
		s.t.Fatalf("session %s: %q: %v", c.id, text, err)
	}
	var tm struct {
		PromptN int64 `json:"prompt_n"`
		CacheN  int64 `json:"cache_n"`
	}
	f, ok := comp.JSON.ExtraFields["timings"]
	if !ok || json.Unmarshal([]byte(f.Raw()), &tm) != nil {
		s.t.Fatalf("session %s: the response carries no llama.cpp timings: %s", c.id, tail(comp.RawJSON(), 500))
	}
	c.msgs = append(c.msgs, openai.AssistantMessage(comp.Choices[0].Message.Content))
	tt := turnTimings{PromptN: tm.PromptN, CacheN: tm.CacheN, Prompt: tm.PromptN + tm.CacheN}
	tt.New = max(0, tt.Prompt-c.lastPrompt)
	c.lastPrompt = tt.Prompt
	s.clientPromptN += tm.PromptN
	return tt
}

// reuseLimit is the most a returning session may reprocess: its new tokens
// plus 10% of its prompt.
func reuseLimit(tt turnTimings) int64 { return tt.New + tt.Prompt/10 }

// checkReused reports a returning turn that reprocessed more than reuseLimit.
func checkReused(t *testing.T, what string, tt turnTimings) {
	t.Helper()
	if tt.PromptN > reuseLimit(tt) {
		t.Errorf("%s reprocessed %d tokens, more than its %d new ones + 10%% of its prompt (limit %d): %v",
			what, tt.PromptN, tt.New, reuseLimit(tt), tt)
	} else {
		t.Logf("%s: %v", what, tt)
	}
}

// realDoc returns a distinct document of at least tokens tokens on the
// server's tokenizer, and its token count.
func realDoc(t *testing.T, s *llamaserver.Server, seed, tokens int) (string, int) {
	t.Helper()
	words := strings.Fields("ledger harbor copper violet meadow cable orbit lantern quartz saddle timber walnut engine glacier pepper signal canyon marble thunder velvet basket falcon garden hammer island")
	var b strings.Builder
	fmt.Fprintf(&b, "Manual %d.", seed)
	x := uint32(seed*2654435761 + 1)
	for {
		for i := 0; i < 40; i++ {
			x = x*1664525 + 1013904223
			fmt.Fprintf(&b, " %s %d", words[x>>16%uint32(len(words))], x>>8%100)
		}
		n, err := s.Tokenize(context.Background(), b.String())
		if err != nil {
			t.Fatal(err)
		}
		if n >= tokens {
			return b.String(), n
		}
	}
}

// (a) More sessions than slots, llama.cpp's RAM cache off: a session whose
// slot went to another comes back and reprocesses only its new tokens.
func TestRealEngineRestoresAfterEviction(t *testing.T) {
	s := newRealStack(t, 2, llamatest.Model(t))
	cs := s.convos("evict", 4, 1)
	for _, c := range cs {
		s.say(c, "What is the first item?")
	}
	for _, c := range cs {
		checkReused(t, "returning session "+c.id, s.say(c, "And the second?"))
	}
}

// (b) The llama-server dies (kill -9) between turns and restarts empty:
// the sessions' KV comes back from the sidecar.
func TestRealEngineRestoresAfterLlamaServerKill9(t *testing.T) {
	s := newRealStack(t, 2, llamatest.Model(t))
	cs := s.convos("enginekill", 2, 10)
	for _, c := range cs {
		s.say(c, "What is the first item?")
	}
	s.waitIdle()
	s.llama.Kill()
	if err := s.llama.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		checkReused(t, "session "+c.id+" after the llama-server's kill -9", s.say(c, "And the second?"))
	}
}

// (c) The sidecar dies (kill -9) between turns; after its restart other
// sessions take the slots, and the first ones still come back from the
// sidecar's tiers.
func TestRealEngineRestoresAfterSidecarKill9(t *testing.T) {
	s := newRealStack(t, 2, llamatest.Model(t))
	cs := s.convos("sidecarkill", 4, 20)
	for _, c := range cs[:2] {
		s.say(c, "What is the first item?")
	}
	s.waitIdle()
	s.killSidecar()
	s.startSidecar()
	for _, c := range cs[2:] { // these take both slots
		s.say(c, "What is the first item?")
	}
	for _, c := range cs[:2] {
		checkReused(t, "session "+c.id+" after the sidecar's kill -9", s.say(c, "And the second?"))
	}
}

// (d) A new session whose system document is another session's reuses
// that session's KV for the shared prefix, though that KV left the slots.
func TestRealEngineReusesSharedPrefixAcrossSessions(t *testing.T) {
	s := newRealStack(t, 2, llamatest.Model(t))
	shared, docTokens := realDoc(t, s.llama, 30, 1500)
	s.say(newConvo("prefix-first", shared), "What is the first item?")
	for i := range 2 { // push the first session out of both slots
		doc, _ := realDoc(t, s.llama, 31+i, 1000)
		s.say(newConvo(fmt.Sprintf("prefix-other-%d", i), doc), "What is the first item?")
	}
	s.waitIdle()
	tt := s.say(newConvo("prefix-new", shared), "Which items mention a harbor?")
	if tt.CacheN < int64(docTokens)*9/10 {
		t.Errorf("a new session sharing a %d-token document reused %d tokens (want ≥ 90%%): %v", docTokens, tt.CacheN, tt)
	} else {
		t.Logf("new session on a shared %d-token document: %v", docTokens, tt)
	}
}

// (e) The sidecar's own background calls (fact extraction, on by default)
// reach the same server yet make no session reprocess: with as many
// sessions as slots, every returning turn reuses its KV.
func TestRealEngineBackgroundCallsEvictNoOne(t *testing.T) {
	s := newRealStack(t, 2, llamatest.Model(t))
	cs := s.convos("background", 2, 40)
	background := func() int64 { return s.serverPromptTokens() - s.clientPromptN }
	for round := 1; round <= 4; round++ {
		before := background() // the model fingerprint's probe counts too
		for _, c := range cs {
			tt := s.say(c, fmt.Sprintf("Question %d: which item is the longest?", round))
			if round > 1 {
				checkReused(t, fmt.Sprintf("round %d, session %s (%d background prompt tokens so far)", round, c.id, background()), tt)
			}
		}
		if round == 3 { // extraction is due after 6 messages: let it reach the server and finish
			for deadline := time.Now().Add(30 * time.Second); background() == before && time.Now().Before(deadline); {
				time.Sleep(100 * time.Millisecond)
			}
			s.waitIdle()
		}
	}
	if bg := background(); bg <= 0 {
		t.Fatalf("no background call reached the llama-server (it processed %d prompt tokens beyond the client's); the test did not exercise them", bg)
	} else {
		t.Logf("the sidecar's background calls made the server process %d prompt tokens", bg)
	}
}

// (f) A state saved on one model is never restored into another: the
// llama-server restarts with another model of the same shape (which
// llama.cpp itself would accept) or of another shape (which it refuses);
// the returning session's request succeeds and reuses nothing it saved.
func TestRealEngineRefusesStateFromAnotherModel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other []int // tiny_gguf.py arguments of the second model
	}{
		{"same shape, other weights", []int{256, 4, 4, 2, 512, 2}},
		{"other shape", []int{128, 2, 4, 2, 256, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRealStack(t, 1, llamatest.Model(t))
			doc, _ := realDoc(t, s.llama, 50, 1000)
			a := newConvo("model-a", doc)
			first := s.say(a, "What is the first item?")
			otherDoc, _ := realDoc(t, s.llama, 51, 1000)
			s.say(newConvo("model-b", otherDoc), "What is the first item?") // takes the only slot: a's state is saved
			s.waitIdle()
			s.llama.Kill()
			if err := s.llama.RestartWithModel(context.Background(), llamatest.Model(t, tc.other...)); err != nil {
				t.Fatal(err)
			}
			tt := s.say(a, "And the second?") // fails the test if the request fails
			// Only the chat template's opening can match by chance; reuse of
			// the first model's state shows as cache_n near the old prompt.
			if tt.CacheN > first.Prompt/20 {
				t.Errorf("after a restart on another model the session reused %d tokens of its %d-token state from the first model: %v", tt.CacheN, first.Prompt, tt)
			} else {
				t.Logf("on the other model: %v", tt)
			}
		})
	}
}

// metric returns one of the sidecar's /metrics values (0 when absent).
func (s *realStack) metric(name string) float64 {
	s.t.Helper()
	m, err := workload.ScrapeMetrics(context.Background(), "http://"+s.sc.admin+"/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	v, _ := m.Get(name)
	return v
}

// (g) Predictive preload (issue 24): three sessions take turns on one slot,
// a pause between turns. Once their rhythm is known, the session due next
// is restored while the engine is idle, so each returning session finds its
// KV in the slot: no restore on its request path, its earlier prompt
// reused.
func TestRealEnginePreloadsTheSessionDueNext(t *testing.T) {
	t.Parallel() // mostly pauses between turns: run beside the other real-engine tests
	s := newRealStack(t, 1, llamatest.Model(t), "--extract=false")
	cs := s.convos("preload", 3, 40)
	for round := 1; round <= 3; round++ {
		for _, c := range cs {
			restores, used := s.metric("sidecar_engine_restores_total"), s.metric("sidecar_engine_preloads_used_total")
			preloads := s.metric("sidecar_engine_preloads_total")
			tt := s.say(c, fmt.Sprintf("What is item %d?", round))
			if round == 3 {
				if d := s.metric("sidecar_engine_restores_total") - restores; d != 0 {
					t.Errorf("session %s, round 3: %v restores on its request path, want 0 (preloaded)", c.id, d)
				}
				if d := s.metric("sidecar_engine_preloads_used_total") - used; d != 1 {
					t.Errorf("session %s, round 3: %v preloads used, want 1", c.id, d)
				}
				checkReused(t, "preloaded session "+c.id, tt)
			}
			// The pause between turns: until the next session's state is
			// preloaded (from round 2, once a rhythm is known), or 5 s.
			s.waitIdle()
			for deadline := time.Now().Add(5 * time.Second); round >= 2 && s.metric("sidecar_engine_preloads_total") == preloads && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	if w := s.metric("sidecar_engine_preloads_wasted_total"); w != 0 {
		t.Errorf("%v preloads wasted in a round-robin", w)
	}
}
