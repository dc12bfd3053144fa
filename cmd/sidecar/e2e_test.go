package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// promptMessages decodes an upstream prompt into role/content pairs.
func promptMessages(t *testing.T, raw json.RawMessage) []struct{ Role, Content string } {
	t.Helper()
	var m []struct{ Role, Content string }
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("prompt %s: %v", raw, err)
	}
	return m
}

// TestFiftyTurnsPrefixStableAndSurvivesRestart drives a full-history client
// (openai-go) through 50 turns against the running binary with a window
// small enough to overflow, then restarts the sidecar on the same data dir.
func TestFiftyTurnsPrefixStableAndSurvivesRestart(t *testing.T) {
	up := newScriptedUpstream(t)
	dataDir := t.TempDir()
	args := []string{"--upstream", up.URL, "--data-dir", dataDir, "--window-tokens", "4096"}
	sc := startChild(t, nil, args...)
	const system = "You are a helpful assistant who remembers details."
	newClient := func(addr string) openai.Client {
		return openai.NewClient(option.WithBaseURL("http://"+addr+"/v1/"), option.WithAPIKey("sk-e2e"),
			option.WithHeader("X-Session-ID", "e2e-session"), option.WithMaxRetries(0))
	}
	client := newClient(sc.addr)
	ctx := context.Background()
	history := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system)}
	userText := func(n int) string {
		return fmt.Sprintf("Turn %d: note that item %d is stored in drawer %d; it is made of material number %d and weighs %d grams. "+
			"It was bought on day %d from shop %d, it is painted colour %d, and it belongs to project %d of team %d.", n, n, n*7%13, n*31%17, n*97%1000, n*3%28, n*5%11, n*13%9, n*17%23, n%4)
	}
	for n := 1; n <= 50; n++ {
		history = append(history, openai.UserMessage(userText(n)))
		comp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o", Messages: history})
		if err != nil {
			t.Fatalf("turn %d: %v", n, err)
		}
		history = append(history, openai.AssistantMessage(comp.Choices[0].Message.Content))
	}

	up.mu.Lock()
	prompts := append([]json.RawMessage(nil), up.prompts...)
	up.mu.Unlock()
	if len(prompts) != 50 {
		t.Fatalf("upstream saw %d prompts", len(prompts))
	}
	extended, evictedSeen := 0, false
	for n := 1; n < len(prompts); n++ {
		cur := promptMessages(t, prompts[n])
		// The client's system message always leads, byte for byte.
		if cur[0].Role != "system" || cur[0].Content != system {
			t.Fatalf("turn %d starts with %+v", n+1, cur[0])
		}
		// The newest user message is always last.
		if last := cur[len(cur)-1]; last.Role != "user" || last.Content != userText(n+1) {
			t.Fatalf("turn %d ends with %+v", n+1, last)
		}
		// Prefix stability: until the next overflow, a prompt extends the
		// previous one; the memory block right after the system message
		// changes only when turns leave the window.
		if strings.HasPrefix(string(prompts[n]), strings.TrimSuffix(string(prompts[n-1]), "]")) {
			extended++
		}
		if len(cur) < 2*(n+1) {
			evictedSeen = true
		}
	}
	if !evictedSeen {
		t.Fatal("the window never overflowed; the test does not exercise eviction")
	}
	if extended < 40 {
		t.Fatalf("only %d of 49 prompts extend the previous one byte for byte", extended)
	}
	t.Logf("%d of 49 prompts extend the previous prompt byte for byte", extended)

	// Old turns left the window but are kept and retrievable.
	var view struct {
		Messages []struct{ Role, Content, Tier string }
	}
	getSession := func(addr string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/sessions/e2e-session", nil)
		req.Header.Set("Authorization", "Bearer sk-e2e")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("session view: %d", resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(&view); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, func() bool { getSession(sc.addr); return len(view.Messages) == 101 })
	if m := view.Messages[1]; m.Content != userText(1) || m.Tier == "focus" {
		t.Fatalf("turn 1 after overflow: %+v", m)
	}

	// Restart on the same data dir: the session is all there.
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-sc.done
	sc2 := startChild(t, nil, args...)
	getSession(sc2.addr)
	if len(view.Messages) != 101 || view.Messages[1].Content != userText(1) || view.Messages[100].Role != "assistant" {
		t.Fatalf("after restart: %d messages", len(view.Messages))
	}
	// An append-only client continues from what the sidecar kept.
	appendClient := openai.NewClient(option.WithBaseURL("http://"+sc2.addr+"/v1/"), option.WithAPIKey("sk-e2e"),
		option.WithHeader("X-Session-ID", "e2e-session"), option.WithHeader("X-Session-Mode", "append"), option.WithMaxRetries(0))
	if _, err := appendClient.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4o", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is in drawer 3?")},
	}); err != nil {
		t.Fatal(err)
	}
	up.mu.Lock()
	last := promptMessages(t, up.prompts[len(up.prompts)-1])
	up.mu.Unlock()
	if last[0].Content != system || last[len(last)-1].Content != "What is in drawer 3?" || len(last) < 10 {
		t.Fatalf("append-mode prompt after restart has %d messages: %+v", len(last), last[0])
	}
}
