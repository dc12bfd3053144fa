package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// stateCall makes a call to a state API with an API key.
func stateCall(t *testing.T, method, url, key, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestL4MergesThroughTheBinary: the scripted model extracts eight facts
// from a conversation, past --l4-threshold; asked to merge each cluster,
// it answers a merge that keeps every keyword (English), one that loses a
// few and still passes (Chinese), and one that loses most. The first two
// replace their facts and carry their fidelity figures in the memory API;
// the third is refused and its facts stay; /metrics counts each outcome.
func TestL4MergesThroughTheBinary(t *testing.T) {
	up := newScriptedUpstream(t)
	var served atomic.Bool
	keep := "The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes clusters daily."
	lossy := "用户的猫叫汤姆，喜欢吃金枪鱼、三文鱼和沙丁鱼，住在柏林。"
	up.bg = func(prompt string) string {
		switch {
		case strings.Contains(prompt, "Known facts:") && served.CompareAndSwap(false, true):
			return strings.Join([]string{
				"[ADD] The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes.",
				"[ADD] The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes daily.",
				"[ADD] The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes clusters.",
				"[ADD] 用户的猫叫汤姆，喜欢吃金枪鱼，住在柏林。",
				"[ADD] 用户的猫叫汤姆，喜欢吃三文鱼，住在柏林。",
				"[ADD] 用户的猫叫汤姆，喜欢吃沙丁鱼，住在柏林。",
				"[ADD] The user flies to Tokyo with Japan Airlines every March.",
				"[ADD] The user flies to Tokyo with Japan Airlines every March for work.",
				"[ADD] The user flies to Tokyo with Japan Airlines every March to see family.",
			}, "\n")
		case strings.HasPrefix(prompt, "You keep an assistant's long-term memory"):
			switch {
			case strings.Contains(prompt, "api_server"):
				return "[MERGE] " + keep
			case strings.Contains(prompt, "汤姆"):
				return "[MERGE] " + lossy
			case strings.Contains(prompt, "Tokyo"):
				return "[MERGE] The user travels."
			}
		}
		return "[SKIP]"
	}
	sc := startChild(t, nil, "--upstream", up.URL, "--l4-threshold", "5", "--review=false")
	c := openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey("sk-l4"),
		option.WithHeader("X-Session-ID", "l4"), option.WithMaxRetries(0))
	for _, m := range []string{"I deploy the api_server on Kubernetes.", "我的猫叫汤姆。", "I fly to Tokyo every March."} {
		if _, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "tiny",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(m)}}); err != nil {
			t.Fatal(err)
		}
	}
	type unit struct {
		ID, Content, Category string
		Merged                *struct {
			From             []string
			Similarity       float64
			KeywordRetention float64 `json:"keyword_retention"`
			Fidelity         float64
			LostKeywords     []string `json:"lost_keywords"`
		}
	}
	var facts map[string]unit
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, b := stateCall(t, http.MethodGet, "http://"+sc.addr+"/v1/sessions/l4/memory", "sk-l4", "")
		var v struct{ Units []unit }
		if code != 200 || json.Unmarshal(b, &v) != nil {
			t.Fatalf("memory: %d %s", code, b)
		}
		facts = map[string]unit{}
		for _, u := range v.Units {
			if u.Category == "fact" {
				facts[u.Content] = u
			}
		}
		if _, ok := facts[lossy]; ok && len(facts) == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no compression within 20 s: %+v", facts)
		}
		time.Sleep(20 * time.Millisecond)
	}
	k, l := facts[keep], facts[lossy]
	if k.Merged == nil || len(k.Merged.From) != 3 || k.Merged.KeywordRetention != 1 || len(k.Merged.LostKeywords) != 0 || k.Merged.Fidelity < 0.5 {
		t.Fatalf("kept merge %+v", k.Merged)
	}
	if l.Merged == nil || strings.Join(l.Merged.LostKeywords, ",") != "喜欢吃三文鱼,喜欢吃沙丁鱼" || l.Merged.Fidelity < 0.5 || l.Merged.KeywordRetention >= 1 {
		t.Fatalf("lossy merge %+v", l.Merged)
	}
	for _, suffix := range []string{"every March.", "every March for work.", "every March to see family."} {
		if _, ok := facts["The user flies to Tokyo with Japan Airlines "+suffix]; !ok {
			t.Fatalf("the refused merge's fact %q is gone: %+v", suffix, facts)
		}
	}
	// The refused merge leaves the facts as they were: its count may land
	// just after the kept ones show.
	wants := []string{`sidecar_memory_l4_merges_total{outcome="kept"} 2`, `sidecar_memory_l4_merges_total{outcome="rejected"} 1`,
		`sidecar_memory_l4_facts_merged_total 6`, `sidecar_memory_background_calls_total{kind="l4_merge"} 3`}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		metrics := metricsText(t, sc.admin)
		var missing []string
		for _, want := range wants {
			if !strings.Contains(metrics, want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q after 20 s", missing)
		}
	}
}

func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestSharedPoolThroughTheBinary: a client follows its key's pool with an
// event stream while another writes it; a chat request with X-Pool-Prefix
// shows the entries in its stable block, newest first, and one without it
// shows nothing; on SIGTERM the stream ends with a reset.
func TestSharedPoolThroughTheBinary(t *testing.T) {
	up := newScriptedUpstream(t)
	sc := startChild(t, nil, "--upstream", up.URL, "--extract=false")
	base := "http://" + sc.addr
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/pool/events?prefix=team/", nil)
	req.Header.Set("Authorization", "Bearer sk-pool")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("event stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	event := func() string {
		t.Helper()
		for {
			var b strings.Builder
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("stream: %v after %q", err, b.String())
				}
				if line == "\n" {
					break
				}
				b.WriteString(line)
			}
			if ev := b.String(); !strings.HasPrefix(ev, ":") {
				return ev
			}
		}
	}
	if ev := event(); !strings.Contains(ev, "event: ready") {
		t.Fatalf("first event %q", ev)
	}
	for _, w := range [][2]string{{"team%2Fgoal", `{"value":"Ship on Friday."}`}, {"team%2Fowner", `{"value":"Ada"}`}, {"misc", `{"value":1}`}} {
		if code, b := stateCall(t, http.MethodPut, base+"/v1/pool/"+w[0], "sk-pool", w[1]); code != 200 {
			t.Fatalf("put: %d %s", code, b)
		}
	}
	if ev := event(); !strings.Contains(ev, "id: 1\nevent: put\n") || !strings.Contains(ev, `"key":"team/goal"`) {
		t.Fatalf("event %q", ev)
	}
	if ev := event(); !strings.Contains(ev, "id: 2\nevent: put\n") || !strings.Contains(ev, `"value":"Ada"`) {
		t.Fatalf("event %q", ev)
	}
	chat := func(hdr ...option.RequestOption) string {
		t.Helper()
		c := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1/"), option.WithAPIKey("sk-pool"),
			option.WithHeader("X-Session-ID", "pool"), option.WithMaxRetries(0)}, hdr...)...)
		if _, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "tiny",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("What is the plan?")}}); err != nil {
			t.Fatal(err)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		return string(up.prompts[len(up.prompts)-1])
	}
	got := chat(option.WithHeader("X-Pool-Prefix", "team/"))
	want := `[SHARED:team/owner] Ada\n[SHARED:team/goal] Ship on Friday.\n`
	if !strings.Contains(got, want) || strings.Contains(got, "SHARED:misc") {
		t.Fatalf("prompt %s lacks %s", got, want)
	}
	if got := chat(); strings.Contains(got, "SHARED") {
		t.Fatalf("the pool without the header: %s", got)
	}
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ev := event(); !strings.Contains(ev, "event: reset") || !strings.Contains(ev, "shutdown") {
		t.Fatalf("at shutdown %q", ev)
	}
	<-sc.done
}
