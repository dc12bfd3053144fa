package workload

// The real-engine demo (make demo-llama): a llama-server with the tiny
// model, the sidecar with --engine llamacpp in front of it, and a scripted
// conversation of three people over two slots, each step printed as a user
// reads it: what was said, what llama-server computed and reused, the KV
// the sidecar restored, and the memory it recalled into a new session's
// prompt (read from what reached the engine, through a recording proxy).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/recordup"
	"github.com/kvsidecar/kvsidecar/memory"
)

// DemoOptions configure RunLlamaDemo.
type DemoOptions struct {
	// LlamaServer and Model as RealParts' (empty: the llama-server found,
	// the tiny model).
	LlamaServer, Model string
	// SidecarCommand runs the sidecar, e.g. {bin/sidecar, "serve"}.
	// Required.
	SidecarCommand []string
	// Dir keeps the servers' logs, slots and the sidecar's data. Empty: a
	// temporary folder, removed afterwards.
	Dir string
	// Out receives the demo's story. Required.
	Out io.Writer
}

// demoKey is the demo app's one API key.
const demoKey = "sk-demo-app"

// demoGrammar keeps the tiny model's random output to lowercase words:
// its random weights otherwise emit bytes that are not UTF-8, which
// llama-server refuses with a 500 (a real model needs none).
const demoGrammar = "root ::= [a-z ]+"

// demoSlotTokens is each slot's context: past the tiny model's trained
// 4,096 (the server caps a slot there unless told otherwise), since its
// byte-level vocabulary spends a token per character.
const demoSlotTokens = 16384

// demoStep is one turn of the script.
type demoStep struct {
	title, session, user, text string
	// show: what to print after the answer.
	restore, recall bool
}

var demoScript = []demoStep{
	{title: "Alice starts a conversation", session: "alice-1", user: "alice",
		text: "Hi, I am Alice. I keep bees on a roof in Lyon and I sell the honey at the Sunday market."},
	{title: "Alice goes on", session: "alice-1", user: "alice", text: "This year I have twelve hives, and the lavender honey sold best."},
	{title: "Bob starts another conversation, in the engine's second slot", session: "bob-1", user: "bob",
		text: "Bob here. I repair old bicycles in a workshop near the station."},
	{title: "Carol starts a third: the engine has two slots, so Alice's slot goes to her", session: "carol-1", user: "carol",
		text: "Carol speaking. I study volcanoes and next month I fly to Iceland."},
	{title: "Alice comes back to her conversation", session: "alice-1", user: "alice",
		text: "How many hives did I say I have?", restore: true},
	{title: "Alice opens a new conversation: the sidecar recalls her first one", session: "alice-2", user: "alice",
		text: "Where do I sell my honey?", recall: true},
}

// RunLlamaDemo runs the demo, printing it to o.Out.
func RunLlamaDemo(ctx context.Context, o DemoOptions) error {
	if len(o.SidecarCommand) == 0 || o.Out == nil {
		return errors.New("bench: demo: SidecarCommand and Out are required")
	}
	p := RealParts{LlamaServer: o.LlamaServer, Model: o.Model}
	if err := p.resolveModel("demo"); err != nil {
		return err
	}
	dir := o.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "kvsidecar-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	w := o.Out
	fmt.Fprintf(w, "kvsidecar in front of a real llama.cpp server\n\n")
	t0 := time.Now()
	llama, err := llamaserver.Start(ctx, llamaserver.Options{
		Binary: p.LlamaServer, Model: p.Model, Slots: 2, CacheRAMMiB: -1, Ctx: 2 * demoSlotTokens,
		// A slot of 16K byte tokens is about 2,500 cl100k tokens, the
		// window the sidecar fills (its recall block gets 8% of it).
		Args:    []string{"--grammar", demoGrammar, "--override-kv", fmt.Sprintf("llama.context_length=int:%d", demoSlotTokens)},
		SlotDir: filepath.Join(dir, "slots"), LogFile: filepath.Join(dir, "llama-server.log"),
	})
	if err != nil {
		return err
	}
	defer llama.Close()
	rec, err := recordup.Start(recordup.Options{Upstream: llama.URL(), IdleTimeout: engineIdleClose})
	if err != nil {
		return err
	}
	defer rec.Close()
	sc, err := startSidecar(ctx, o.SidecarCommand, nil, nil, rec.URL(), llama, filepath.Join(dir, "sidecar"))
	if err != nil {
		return err
	}
	defer sc.close()
	fmt.Fprintf(w, "  llama-server  %s   model %s (tiny, random weights: its words are nonsense,\n", llama.URL(), filepath.Base(p.Model))
	fmt.Fprintf(w, "                but prompt processing, slots and KV are the real engine's); 2 slots, its RAM prompt cache off\n")
	fmt.Fprintf(w, "  sidecar       %s   --engine llamacpp: saves a slot's KV after each turn and restores it\n", sc.url())
	fmt.Fprintf(w, "                when its session returns; keeps each session's memory (started in %.1f s)\n", time.Since(t0).Seconds())
	fmt.Fprintf(w, "  logs          %s\n", dir)
	fmt.Fprintf(w, "\nEvery client below sends only its newest message, with an API key, X-Session-ID and X-User-ID.\n")

	client := &http.Client{Timeout: 2 * time.Minute}
	for i, st := range demoScript {
		fmt.Fprintf(w, "\n[%d] %s (session %s, user %s)\n", i+1, st.title, st.session, st.user)
		fmt.Fprintf(w, "    you:     %s\n", st.text)
		seen := rec.Len()
		reply, timings, err := demoTurn(ctx, client, sc.url(), st)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "    model:   %s\n", oneLineCut(reply, 90))
		fmt.Fprintf(w, "    engine:  %d prompt tokens computed, %d reused from its KV cache\n", timings.PromptN, timings.CacheN)
		if st.restore {
			es, err := demoEngineStats(ctx, client, sc.url(), st.session)
			if err != nil {
				return err
			}
			how := "on request"
			if es.Restores == 0 && es.Preloads > 0 {
				how = "ahead of the request (predictive preload)"
			}
			fmt.Fprintf(w, "    sidecar: restored the session's saved KV into a slot %s (restores %d, preloads %d, saves %d):\n",
				how, es.Restores, es.Preloads, es.Saves)
			fmt.Fprintf(w, "             llama-server alone, its slot taken and no RAM cache, would have computed all %d tokens\n",
				timings.PromptN+timings.CacheN)
		}
		if st.recall {
			block := demoRecallBlock(rec.Requests()[seen:], st.session)
			if block == "" {
				fmt.Fprintf(w, "    sidecar: recalled nothing for this question\n")
				continue
			}
			fmt.Fprintf(w, "    sidecar: added to the prompt llama-server received (read through a recording proxy):\n")
			for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
				fmt.Fprintf(w, "             | %s\n", oneLineCut(line, 140))
			}
		}
	}
	fmt.Fprintf(w, "\nWhat the sidecar keeps: curl -s %s/v1/sessions -H 'Authorization: Bearer %s' lists the sessions;\n", sc.url(), demoKey)
	fmt.Fprintf(w, "/v1/sessions/alice-1 the history with its tiers and engine stats, /v1/sessions/alice-1/memory the memory.\n")
	fmt.Fprintf(w, "Demo done in %.1f s; everything it started is stopped.\n", time.Since(t0).Seconds())
	return nil
}

// demoTimings are the llama.cpp timings of one answer.
type demoTimings struct {
	CacheN  int `json:"cache_n"`
	PromptN int `json:"prompt_n"`
}

// demoTurn sends one step's message and returns the answer and its
// timings.
func demoTurn(ctx context.Context, c *http.Client, base string, st demoStep) (string, demoTimings, error) {
	body, _ := json.Marshal(map[string]any{"model": "tiny", "max_tokens": 12,
		"messages": []map[string]string{{"role": "user", "content": st.text}}})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", demoTimings{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+demoKey)
	req.Header.Set("X-Session-ID", st.session)
	req.Header.Set("X-User-ID", st.user)
	resp, err := c.Do(req)
	if err != nil {
		return "", demoTimings{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", demoTimings{}, fmt.Errorf("bench: demo: %s: %d %s", st.session, resp.StatusCode, b)
	}
	var r struct {
		Choices []struct {
			Message struct{ Content string }
		}
		Timings demoTimings
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) == 0 {
		return "", demoTimings{}, fmt.Errorf("bench: demo: answer %s: %v", b, err)
	}
	return r.Choices[0].Message.Content, r.Timings, nil
}

// demoEngine is the engine part of GET /v1/sessions/{id}.
type demoEngine struct {
	Restores, Preloads, Saves int64
}

func demoEngineStats(ctx context.Context, c *http.Client, base, session string) (demoEngine, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/sessions/"+session, nil)
	if err != nil {
		return demoEngine{}, err
	}
	req.Header.Set("Authorization", "Bearer "+demoKey)
	resp, err := c.Do(req)
	if err != nil {
		return demoEngine{}, err
	}
	defer resp.Body.Close()
	var v struct{ Engine demoEngine }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return demoEngine{}, fmt.Errorf("bench: demo: session %s: %w", session, err)
	}
	return v.Engine, nil
}

// demoRecallBlock finds, in the requests that reached the engine, the
// session's chat request and returns the recall block it carried ("" when
// none).
func demoRecallBlock(reqs []recordup.Request, session string) string {
	for i := len(reqs) - 1; i >= 0; i-- {
		r := reqs[i]
		if r.Method != "POST" || !strings.HasSuffix(r.Path, "/chat/completions") || r.Header.Get("X-Session-ID") != session {
			continue
		}
		var body struct {
			Messages []struct{ Role, Content string }
		}
		if json.Unmarshal(r.Body, &body) != nil {
			continue
		}
		for _, m := range body.Messages {
			if strings.HasPrefix(m.Content, memory.RecallBlockPrefix) {
				return m.Content
			}
		}
		return ""
	}
	return ""
}

// oneLineCut is s on one line, cut to n runes.
func oneLineCut(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
