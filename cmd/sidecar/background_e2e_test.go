package main

// Issue 20 against the real llama.cpp server: the sidecar's own calls
// (fact extraction here) never delay a client's turn, even on a server
// with one slot and no --n-predict cap, where an uncapped call on a
// random-weight model runs to the context limit.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/cmd/sidecar/internal/llm"
)

// dropInTurns plays a drop-in client (the system message and the newest
// user message only, with a session id) for n turns of max_tokens 8,
// pausing pause after each, and returns each turn's wall time and the
// completion tokens of all turns.
func dropInTurns(t *testing.T, c openai.Client, session string, n int, pause time.Duration) ([]time.Duration, int64) {
	t.Helper()
	var (
		took   []time.Duration
		tokens int64
	)
	for i := range n {
		start := time.Now()
		comp, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "tiny",
			Messages: []openai.ChatCompletionMessageParamUnion{
				openai.SystemMessage("You are a helpful assistant for a travel agency."),
				openai.UserMessage(fmt.Sprintf("Turn %d: my name is Ada and I want to see volcano number %d in spring.", i, i)),
			},
			MaxTokens: openai.Int(8), Temperature: openai.Float(0)},
			option.WithHeader("X-Session-ID", session), option.WithJSONSet("grammar", "root ::= [a-z ]+"))
		d := time.Since(start)
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		// A hang guard, not a speed goal: a turn behind an uncapped
		// background call waited minutes. (20 s was exceeded once on two
		// cores running make test's other groups.)
		if d > time.Minute {
			t.Fatalf("turn %d took %v", i, d)
		}
		took = append(took, d)
		tokens += comp.Usage.CompletionTokens
		time.Sleep(pause)
	}
	return took, tokens
}

// TestRealEngineBackgroundNeverDelaysClient: llama-server -np 1 with no
// --n-predict; the sidecar (engine llamacpp, extraction on) serves a
// drop-in client, first replaying turns back to back, then pausing about a
// second between turns, long enough for the extraction due every 6
// messages to start on the only slot. Each turn is answered in about the
// time it takes direct (a client request takes the slot from an extraction
// call; the quiet period before one starts grows with the clients'
// pauses), and every background call generates at most its max_tokens.
// The same client straight to the server gives the direct figures.
func TestRealEngineBackgroundNeverDelaysClient(t *testing.T) {
	t.Parallel() // mostly the clients' pauses: run beside the other real-engine tests
	// A model slow enough that an uncapped call holds the slot for tens
	// of seconds (about 160 tokens/s on one thread), like the issue's.
	model := llamatest.Model(t, 512, 4, 4, 4, 1408)
	llama := llamatest.Start(t, llamaserver.Options{Model: model, Slots: 1, CacheRAMMiB: -1, Threads: 1})
	const turns = 8

	direct := openai.NewClient(option.WithBaseURL(llama.URL()+"/v1/"), option.WithMaxRetries(0))
	directReplay, _ := dropInTurns(t, direct, "direct-replay", turns, 0)
	directPaused, _ := dropInTurns(t, direct, "direct-paused", turns, time.Second)

	for _, eng := range []string{"llamacpp", "generic"} {
		t.Run(eng, func(t *testing.T) { backgroundNeverDelays(t, llama, eng, turns, directReplay, directPaused) })
	}
}

// backgroundNeverDelays drives the drop-in client through a sidecar with
// the engine connector eng in front of llama (one slot, no --n-predict).
func backgroundNeverDelays(t *testing.T, llama *llamaserver.Server, eng string, turns int, directReplay, directPaused []time.Duration) {
	llamaAddr := strings.TrimPrefix(llama.URL(), "http://")
	predictedBefore := metric(t, llamaAddr, "llamacpp:tokens_predicted_total")
	s := &realStack{t: t, llama: llama, dataDir: t.TempDir(), log: filepath.Join(t.TempDir(), "sidecar.log")}
	s.args = []string{"--upstream", llama.URL(), "--data-dir", s.dataDir, "--engine", eng}
	if eng == "llamacpp" {
		s.args = append(s.args, "--llamacpp-slot-dir", llama.SlotDir(), "--llamacpp-slots", "1")
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("BGDEBUG") != "" {
			b, _ := os.ReadFile(s.log)
			t.Logf("sidecar log ends:\n%s", tail(string(b), 4000))
		}
	})
	s.startSidecar()
	replay, replayTokens := dropInTurns(t, s.client, "replay", turns, 0)
	replayWaits := metric(t, s.sc.admin, "sidecar_engine_client_waits_total")
	paused, pausedTokens := dropInTurns(t, s.client, "paused", turns, time.Second)

	// Let the background work finish: the server idle for 3 s running.
	for quiet, deadline := 0, time.Now().Add(60*time.Second); quiet < 30; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the llama-server was still busy 60 s after the last turn")
		}
		if metric(t, llamaAddr, "llamacpp:requests_processing")+metric(t, llamaAddr, "llamacpp:requests_deferred") > 0 {
			quiet = 0
		} else {
			quiet++
		}
	}
	bgCalls := metric(t, s.sc.admin, "sidecar_engine_background_calls_total")
	bgTokens := metric(t, llamaAddr, "llamacpp:tokens_predicted_total") - predictedBefore - float64(replayTokens+pausedTokens)
	maxTokens := metric(t, llamaAddr, "llamacpp:n_tokens_max")
	t.Logf("per-turn wall time, back to back: direct %v", directReplay)
	t.Logf("                                 sidecar %v (client waits on background work: %v)", replay, replayWaits)
	t.Logf("per-turn wall time, 1 s pauses:   direct %v", directPaused)
	t.Logf("                                 sidecar %v", paused)
	t.Logf("background calls %v, generating %v tokens; cancelled for a client %v; client waits %v; largest slot use %v tokens",
		bgCalls, bgTokens, metric(t, s.sc.admin, "sidecar_engine_background_cancelled_total"),
		metric(t, s.sc.admin, "sidecar_engine_client_waits_total"), maxTokens)
	if bgCalls == 0 {
		t.Fatal("no background call reached the server: the test did not exercise them")
	}
	// Every background call is capped (the largest cap is the facts one):
	// together they generated at most the cap each, and no request ran to
	// the slot's 4,096-token context as an uncapped one does.
	if bgTokens > bgCalls*llm.FactsMaxTokens {
		t.Errorf("%v background calls generated %v tokens: more than %d each", bgCalls, bgTokens, llm.FactsMaxTokens)
	}
	if maxTokens >= 4000 {
		t.Errorf("a request filled the slot's context (%v tokens): a background call ran uncapped", maxTokens)
	}
}
