package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

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

// isRecallBlock reports whether a prompt message is the sidecar's recall
// block.
func isRecallBlock(role, content string) bool {
	return role == "system" && strings.HasPrefix(content, "Memory recalled for the next message")
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
		// The newest user message is always last; a recall block sits
		// right before a user message (this turn's, or an earlier one's,
		// kept in the transcript where it was sent).
		if last := cur[len(cur)-1]; last.Role != "user" || last.Content != userText(n+1) {
			t.Fatalf("turn %d ends with %+v", n+1, last)
		}
		for i, m := range cur[1 : len(cur)-1] {
			if isRecallBlock(m.Role, m.Content) && cur[i+2].Role != "user" {
				t.Fatalf("turn %d: recall block at %d, not right before a user message", n+1, i+1)
			}
		}
		// Prompts only grow: until the next overflow, the previous prompt,
		// its recall block included, is where the new one starts, byte for
		// byte.
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

// TestDropInClientRecallsAcrossSessions drives openai-go as most clients of
// a memory layer do: system message plus newest message, no mode header.
// The sidecar keeps the conversation, recalls an early fact next to the
// newest message once it left a small window, recalls it in a new session
// of the same user (X-User-ID), never for another API key, and makes its
// own background calls with the session's model.
func TestDropInClientRecallsAcrossSessions(t *testing.T) {
	up := newScriptedUpstream(t)
	sc := startChild(t, nil, "--upstream", up.URL, "--window-tokens", "2048", "--recall-share", "0.15")
	client := func(key, session, user string) openai.Client {
		return openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey(key),
			option.WithHeader("X-Session-ID", session), option.WithHeader("X-User-ID", user), option.WithMaxRetries(0))
	}
	ctx := context.Background()
	send := func(c openai.Client, text string) []struct{ Role, Content string } {
		t.Helper()
		if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are terse."), openai.UserMessage(text)}}); err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		return promptMessages(t, up.prompts[len(up.prompts)-1])
	}
	a := client("sk-ada", "trip", "ada")
	send(a, "My passport number is XK-2291 and it expires in March.")
	for i := 0; i < 40; i++ {
		p := send(a, fmt.Sprintf("Packing note %d: bring item number %d, a %s bag, and %d spare batteries for the camera.", i, i*37%101, []string{"red", "blue", "green"}[i%3], i%5))
		if i == 0 && len(p) < 4 {
			t.Fatalf("the second drop-in request did not carry the conversation: %d messages", len(p))
		}
	}
	p := send(a, "What is my passport number?")
	last, block := p[len(p)-1], p[len(p)-2]
	if last.Content != "What is my passport number?" || !isRecallBlock(block.Role, block.Content) || !strings.Contains(block.Content, "XK-2291") {
		t.Fatalf("the early fact is not recalled next to the question: %+v", p[len(p)-2:])
	}
	for _, m := range p[1 : len(p)-2] {
		if strings.Contains(m.Content, "XK-2291") {
			t.Fatal("the fact is still in the window; the test does not exercise recall")
		}
	}

	// A new session of the same user, later.
	var cross string
	waitUntil(t, func() bool {
		p := send(client("sk-ada", fmt.Sprint("visa-", time.Now().UnixNano()), "ada"), "When does my passport expire?")
		cross = p[len(p)-2].Content
		return strings.Contains(cross, "XK-2291")
	})
	if !strings.Contains(cross, "another session") {
		t.Fatalf("cross-session memory not marked: %s", cross)
	}
	// Another API key with the same user id sees nothing of it.
	p = send(client("sk-eve", "visa", "ada"), "What is my passport number?")
	for _, m := range p {
		if strings.Contains(m.Content, "XK-2291") {
			t.Fatalf("another tenant recalls ada's memory: %+v", m)
		}
	}
	up.mu.Lock()
	models := append([]string(nil), up.bgModel...)
	up.mu.Unlock()
	if len(models) == 0 {
		t.Fatal("no background extraction call was made")
	}
	for _, m := range models {
		if m != "gpt-4o-mini" {
			t.Fatalf("a background call used model %q, not the session's", m)
		}
	}
}
