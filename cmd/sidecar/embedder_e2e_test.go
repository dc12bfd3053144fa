package main

// End-to-end test of --embedder upstream (issue 21) against the real
// llama.cpp server of ../shared/llama with --embeddings: the tiny model's
// vectors are real, if meaningless, so what is tested is the path (the
// sidecar embeds through the engine's /v1/embeddings, seen by a recording
// proxy), batching by session, recall still working with real vectors, and
// restarts of the engine, with the same model and with one of another
// dimension, that fail no client turn. Skips without llama-server unless
// KVSIDECAR_REQUIRE_LLAMA=1.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/bench/harness/recordup"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// embedStack is a llama-server serving chat and embeddings, a recording
// proxy in front of it, and the sidecar with --embedder upstream.
type embedStack struct {
	t      *testing.T
	llama  *llamaserver.Server
	rec    *recordup.Proxy
	sc     *child
	client openai.Client
	turns  int
}

func newEmbedStack(t *testing.T) *embedStack {
	t.Helper()
	llama := llamatest.Start(t, llamaserver.Options{Slots: 2, Threads: 2,
		// Mean pooling: the tiny model has none of its own, and
		// /v1/embeddings refuses pooling "none".
		Args: []string{"--embeddings", "--pooling", "mean", "--n-predict", "32"}})
	// The proxy closes idle keep-alive connections after 1 s, before the
	// embedder's own 2 s: pooled connections go stale as with a real
	// server's 5 s against longer client pools.
	rec, err := recordup.Start(recordup.Options{Upstream: llama.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	logPath := filepath.Join(t.TempDir(), "sidecar.log")
	cmd := exec.Command(os.Args[0], "serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--upstream", rec.URL(),
		"--embedder", "upstream", "--window-tokens", "300", "--recall-share", "0.25", "--extract=false",
		// Two cores run the engine, its embeddings and this test: a
		// query's embedding may wait for a batch of documents' here.
		"--embedding-query-timeout", "10s")
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	cmd.SysProcAttr = launch.SysProcAttr()
	c := startCmd(t, cmd, logPath)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar log ends:\n%s", tail(c.log(), 4000))
		}
	})
	return &embedStack{t: t, llama: llama, rec: rec, sc: c,
		client: openai.NewClient(option.WithBaseURL("http://"+c.addr+"/v1/"), option.WithAPIKey("sk-emb"), option.WithMaxRetries(0))}
}

// say sends the next user message of c, a drop-in client's conversation
// (the whole history every turn); any error fails the test.
func (s *embedStack) say(c *convo, text string) {
	s.t.Helper()
	c.msgs = append(c.msgs, openai.UserMessage(text))
	comp, err := s.client.Chat.Completions.New(context.Background(),
		openai.ChatCompletionNewParams{Model: "tiny", Messages: c.msgs, MaxTokens: openai.Int(6), Temperature: openai.Float(0)},
		option.WithHeader("X-Session-ID", c.id), option.WithJSONSet("user", c.id), option.WithJSONSet("grammar", "root ::= [a-z ]+"))
	if err != nil {
		s.t.Fatalf("session %s, turn %q: %v", c.id, text, err)
	}
	c.msgs = append(c.msgs, openai.AssistantMessage(comp.Choices[0].Message.Content))
	s.turns++
}

// quiet waits until the sidecar's background indexing is done: no request
// in flight at the proxy and the sidecar's embedding calls unchanged for
// half a second. Bounded by 60 s.
func (s *embedStack) quiet() {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	last, still := -1.0, 0
	for still < 5 {
		if time.Now().After(deadline) {
			s.t.Fatal("the sidecar still embedding after 60 s")
		}
		time.Sleep(100 * time.Millisecond)
		busy := false
		for _, r := range s.rec.Requests() {
			busy = busy || r.End.IsZero()
		}
		calls := s.metric("sidecar_embedder_calls_total")
		if busy || calls != last {
			last, still = calls, 0
			continue
		}
		still++
	}
}

func (s *embedStack) metric(name string) float64 {
	s.t.Helper()
	m, err := workload.ScrapeMetrics(context.Background(), "http://"+s.sc.admin+"/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	v, ok := m.Get(name)
	if !ok {
		s.t.Fatalf("/metrics has no %s", name)
	}
	return v
}

// embeddings returns the inputs of every /v1/embeddings request so far.
func (s *embedStack) embeddings() [][]string {
	s.t.Helper()
	var out [][]string
	for _, r := range s.rec.Requests() {
		if r.Path != "/v1/embeddings" {
			continue
		}
		var b struct{ Input []string }
		if err := json.Unmarshal(r.Body, &b); err != nil {
			s.t.Fatalf("embeddings request %d: %v: %s", r.Seq, err, r.Body)
		}
		if r.Status != 200 && !r.End.IsZero() {
			s.t.Logf("embeddings request %d answered %d", r.Seq, r.Status)
		}
		out = append(out, b.Input)
	}
	return out
}

// recalled checks that the newest chat prompt of session id held a recall
// block (one sent this turn or kept from an earlier one) that contains
// want.
func (s *embedStack) recalled(id, want, what string) {
	s.t.Helper()
	reqs := s.rec.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		r := reqs[i]
		// The session by the body's user field (each conversation is one
		// end user), which reaches the engine as the client sent it.
		var b struct {
			User     string
			Messages json.RawMessage
		}
		if r.Path != "/v1/chat/completions" || json.Unmarshal(r.Body, &b) != nil || b.User != id {
			continue
		}
		for _, m := range promptMessages(s.t, b.Messages) {
			if isRecallBlock(m.Role, m.Content) && strings.Contains(m.Content, want) {
				return
			}
		}
		s.t.Errorf("%s: %q not recalled; the engine's prompt: %s", what, want, tail(string(b.Messages), 3000))
		return
	}
	s.t.Fatalf("no chat request of %s reached the engine", id)
}

func TestRealEngineEmbedderUpstream(t *testing.T) {
	t.Parallel() // waits on the engine and its restarts: run beside the other real-engine tests
	s := newEmbedStack(t)
	alice := newConvo("alice", "You are a helpful assistant.")
	bob := newConvo("bob", "You are a helpful assistant.")
	s.say(alice, "alpha: my favourite volcano is Krakatoa in Indonesia")
	s.say(bob, "bravo: my favourite river is the Danube in Vienna")
	fill := func(from, n int) {
		for i := from; i < from+n; i++ {
			s.say(alice, fmt.Sprintf("alpha %d: the garden needs water, the tomatoes grow slowly this year", i))
			s.say(bob, fmt.Sprintf("bravo %d: the train to work was late again, the platform was full", i))
		}
	}
	fill(0, 10)
	s.quiet()

	// The fact left the window; recall finds it with the engine's vectors.
	s.say(alice, "alpha: is Krakatoa still active?")
	s.recalled("alice", "Krakatoa in Indonesia", "the evicted fact")
	if n := s.metric("sidecar_memory_recall_by_words_total"); n != 0 {
		t.Errorf("%v recalls by words while the endpoint answered", n)
	}
	sent := s.embeddings()
	if len(sent) == 0 || s.metric("sidecar_embedder_embedded_total") == 0 {
		t.Fatalf("the sidecar never called /v1/embeddings (%d requests)", len(sent))
	}
	// One session's texts a request: never alice's and bob's together.
	for i, in := range sent {
		a, b := 0, 0
		for _, x := range in {
			a += strings.Count(x, "alpha")
			b += strings.Count(x, "bravo")
		}
		if a > 0 && b > 0 {
			t.Errorf("embeddings request %d carries texts of two end users: %q", i, in)
		}
	}
	s.logCost("first 23 turns")

	// The engine restarts (same model): pooled connections die with it.
	s.rec.DropConns()
	if err := s.llama.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	fill(10, 3)
	s.quiet()
	s.say(alice, "alpha: how tall is Krakatoa?")
	s.recalled("alice", "Krakatoa in Indonesia", "after the engine restarted")
	if n := s.metric("sidecar_embedder_space_changes_total"); n != 0 {
		t.Errorf("%v space changes after a restart with the same model", n)
	}

	// The engine comes back with a model of another dimension.
	s.rec.DropConns()
	if err := s.llama.RestartWithModel(context.Background(), llamatest.Model(t, 128, 2, 2, 2, 512)); err != nil {
		t.Fatal(err)
	}
	reembedFrom := len(s.embeddings())
	fill(13, 3)
	s.quiet()
	s.say(alice, "alpha: what was the weather like today?")
	s.say(bob, "bravo: is the Danube long?")
	s.quiet()
	if d, c := s.metric("sidecar_embedder_dimension"), s.metric("sidecar_embedder_space_changes_total"); d != 128 || c != 1 {
		t.Errorf("after the model change: dimension %v, space changes %v", d, c)
	}
	s.say(alice, "alpha: when did Krakatoa erupt?")
	s.recalled("alice", "Krakatoa in Indonesia", "after the model changed")
	if !strings.Contains(s.sc.log(), "vector space changed") {
		t.Error("no warning about the new vector space")
	}
	// The session's index was embedded again, in requests of its own.
	reembedded := 0
	for _, in := range s.embeddings()[reembedFrom:] {
		reembedded += len(in)
	}
	if reembedded < 10 {
		t.Errorf("%d texts embedded after the model changed: the indexes were not re-embedded", reembedded)
	}
	s.logCost(fmt.Sprintf("all %d turns", s.turns))
}

// logCost logs what embedding cost the client turns so far.
func (s *embedStack) logCost(what string) {
	s.t.Helper()
	req, sec := s.metric("sidecar_embedder_requests_total"), s.metric("sidecar_embedder_request_seconds_total")
	texts, hits := s.metric("sidecar_embedder_texts_total"), s.metric("sidecar_embedder_cache_hits_total")
	// Labelled series are summed: every turn's prepare time.
	pSum, pN := s.metric("sidecar_memory_prepare_seconds_sum"), s.metric("sidecar_memory_prepare_seconds_count")
	full, byWords := s.metric("sidecar_memory_full_recalls_total"), s.metric("sidecar_memory_recall_by_words_total")
	s.t.Logf("%s: %d turns, %.0f embeddings requests (%.2f a turn), %.1f ms a request, %.1f ms of requests a turn; %.0f texts, %.0f from the cache; %.0f full recalls, %.0f by words; memory prepared a turn in %.1f ms on average",
		what, s.turns, req, req/float64(s.turns), 1000*sec/max(req, 1), 1000*sec/float64(s.turns), texts, hits, full, byWords, 1000*pSum/max(pN, 1))
}
