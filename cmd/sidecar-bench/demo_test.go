package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
)

// TestDemoLlama runs `sidecar bench demo-llama` (make demo-llama) as a
// user does: it starts a real llama-server and the sidecar, and its story
// shows Alice's KV restored by the sidecar when she returns (llama.cpp
// reusing most of her prompt) and her first conversation recalled into
// her new one.
func TestDemoLlama(t *testing.T) {
	llamatest.Require(t)
	cmd := benchCommand(t, "demo-llama")
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err != nil {
		t.Fatalf("demo-llama: %v\n%s", err, out)
	}
	_, back, ok := strings.Cut(out, "[5] Alice comes back")
	back, recall, ok2 := strings.Cut(back, "[6] ")
	if !ok || !ok2 {
		t.Fatalf("the story lacks steps 5 and 6:\n%s", out)
	}
	m := regexp.MustCompile(`engine:  (\d+) prompt tokens computed, (\d+) reused`).FindStringSubmatch(back)
	if m == nil {
		t.Fatalf("step 5 has no engine line:\n%s", out)
	}
	computed, _ := strconv.Atoi(m[1])
	reused, _ := strconv.Atoi(m[2])
	if reused <= computed || !regexp.MustCompile(`restored the session's saved KV into a slot .*\(restores [1-9]|preloads [1-9]`).MatchString(back) {
		t.Errorf("step 5: %d computed, %d reused; want the restored conversation reused, most of the prompt:\n%s", computed, reused, out)
	}
	if !strings.Contains(recall, "| - user, another session: Hi, I am Alice. I keep bees") {
		t.Errorf("step 6 does not show Alice's first conversation recalled:\n%s", out)
	}
	if !strings.Contains(out, "Demo done in") {
		t.Errorf("no end line:\n%s", out)
	}
}
