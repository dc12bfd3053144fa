package main

// The MCP endpoint through the binary with a real MCP client (issue 24):
// the official TypeScript SDK (test/mcp, @modelcontextprotocol/sdk pinned in
// its package-lock.json) against the sidecar in front of a real llama-server.
// Without node, or without test/mcp/node_modules (npm ci there), the test
// skips, or fails under KVSIDECAR_REQUIRE_NODE=1 (as .ci/run sets).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
)

// mcpClientDir finds node and the installed client test, or skips (fails
// under KVSIDECAR_REQUIRE_NODE=1).
func mcpClientDir(t *testing.T) (node, dir string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "test", "mcp"))
	if err != nil {
		t.Fatal(err)
	}
	node, err = exec.LookPath("node")
	msg := ""
	switch {
	case err != nil:
		msg = "no node on PATH (apt-get install nodejs npm)"
	default:
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
			msg = "the MCP client is not installed (npm ci --prefix test/mcp)"
		}
	}
	if msg != "" {
		if os.Getenv("KVSIDECAR_REQUIRE_NODE") == "1" {
			t.Fatal(msg + "; KVSIDECAR_REQUIRE_NODE=1")
		}
		t.Skip(msg)
	}
	return node, dir
}

// apiTenant is the tenant id the sidecar derives from an API key.
func apiTenant(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "t_" + hex.EncodeToString(sum[:8])
}

// TestMCPRealClient: the official MCP TypeScript client lists
// session_recall and calls it on the sidecar binary: a user's new session
// recalls what the user said in an earlier chat session (through the real
// llama-server), a short session finds its own turns still in the window
// with no memory model (issue 35), other users, keys and callers naming no
// user find nothing, and the design's test plan is measured
// (recall.test.mjs prints it).
func TestMCPRealClient(t *testing.T) {
	node, dir := mcpClientDir(t)
	llama := llamatest.Start(t, llamaserver.Options{Model: llamatest.Model(t), Slots: 1, Threads: 1, Args: []string{"--n-predict", "16"}})
	logPath := filepath.Join(t.TempDir(), "sidecar.log")
	cmd := exec.Command(os.Args[0], "serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--upstream", llama.URL(),
		"--extract=false", "--admin-token", consoleToken)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	sc := startCmd(t, cmd, logPath)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar log ends:\n%s", tail(sc.log(), 4000))
		}
	})
	const key = "sk-mcp-e2e"
	client := openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	say := func(session, user, text string) {
		t.Helper()
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "tiny",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}, MaxTokens: openai.Int(6), Temperature: openai.Float(0)},
			option.WithHeader("X-Session-ID", session), option.WithHeader("X-User-ID", user),
			// Random weights: keep the answer parseable text.
			option.WithJSONSet("grammar", "root ::= [a-z ]+"))
		if err != nil {
			t.Fatalf("%s: %q: %v", session, text, err)
		}
	}
	// A user's chat session through the real llama-server, then a new one.
	say("ada-old", "ada", "My greyhound is called Comet and he loves the beach at Brighton.")
	say("ada-old", "ada", "I am allergic to walnuts and peanuts.")
	say("ada-new", "ada", "Hello again.")
	// A short session of no named user: what it said is still in the
	// window, and the memory model (--extract=false) extracts nothing.
	say("solo", "", "My telescope is named Orion-1 and it sits on the balcony.")
	say("solo", "", "I also bought a red kayak last summer.")
	say("solo", "", "What should I cook tonight?")

	// The plan's sessions: every topic's facts, one user each.
	var plan struct{ Facts []string }
	b, err := os.ReadFile(filepath.Join(dir, "plan.json"))
	if err != nil || json.Unmarshal(b, &plan) != nil || len(plan.Facts) == 0 {
		t.Fatalf("plan.json: %v", err)
	}
	for _, p := range [][2]string{{"plan-continuing", "u-cont"}, {"plan-switching", "u-switch"}} {
		say(p[0], p[1], "hello")
		for _, f := range plan.Facts {
			q := "memories?tenant=" + url.QueryEscape(apiTenant(key)) + "&session=" + url.QueryEscape(p[0])
			if code, b := adminAPI(t, sc.admin, "POST", q, map[string]any{"category": "fact", "text": f, "importance": 1}); code != 200 && code != 201 {
				t.Fatalf("add memory: %d %s", code, b)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, node, "--test", "--test-reporter", "spec", "recall.test.mjs")
	run.Dir = dir
	run.Env = append(os.Environ(),
		"KVSIDECAR_MCP_URL=http://"+sc.addr+"/mcp",
		"KVSIDECAR_MCP_KEY="+key,
		`KVSIDECAR_MCP_CHAT={"user":"ada","old":"ada-old","new":"ada-new","solo":"solo"}`,
		`KVSIDECAR_MCP_PLAN={"continuing":["plan-continuing","u-cont"],"switching":["plan-switching","u-switch"]}`)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("the MCP TypeScript client test failed: %v\n%s", err, out)
	}
	found := false
	for _, l := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(strings.TrimSpace(l), "MCP_PLAN "); ok {
			found = true
			t.Logf("design test plan through the TypeScript client: %s", j)
		}
	}
	if !found || !strings.Contains(string(out), "pass 5") {
		t.Fatalf("the client test did not run its five tests or report the plan:\n%s", out)
	}
	if testing.Verbose() {
		t.Logf("client output:\n%s", out)
	}

	// /metrics counts the calls.
	m := string(getMetrics(t, sc.admin))
	for _, want := range []string{`outcome="full"`, `outcome="reuse"`, `outcome="not_found"`} {
		if !strings.Contains(m, "sidecar_mcp_tool_calls_total{tool=\"session_recall\","+want) {
			t.Fatalf("/metrics lacks the MCP calls (%s)", want)
		}
	}
}
