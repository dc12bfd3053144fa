package main

// Context snapshots end to end (issue 24): two sidecars, each with its own
// data folder and its own llama-server (the same tiny model), a
// conversation on the first, `sidecar snapshot export` and `import` as a
// user runs them, and the next turn on the second sidecar: llama.cpp's own
// timings say it reprocessed only the new tokens (the KV came along), and
// the stored history and memory are the same on both.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
)

// runCLI runs `sidecar ARGS` (this test binary as the sidecar) and returns
// its stdout, stderr and exit status.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	cmd.SysProcAttr = launch.SysProcAttr()
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("sidecar %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// sessionJSON is GET path on the sidecar s for the session's end user,
// without the fields that differ between two sidecars by nature (when it
// was last written there, the engine's slot).
func sessionJSON(t *testing.T, s *realStack, path, user string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+s.sc.addr+path, nil)
	req.Header.Set("Authorization", "Bearer sk-real")
	req.Header.Set("X-User-ID", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	delete(v, "updated_at")
	delete(v, "engine")
	out, _ := json.Marshal(v)
	return string(out)
}

func TestRealEngineSnapshotMovesSession(t *testing.T) {
	t.Parallel() // two stacks of its own: run beside the other real-engine tests
	model := llamatest.Model(t)
	a := newRealStack(t, 2, model)
	b := newRealStack(t, 2, model)
	doc, _ := realDoc(t, a.llama, 60, 1500)
	c := newConvo("moved", doc)
	for _, q := range []string{"What is the first item?", "And the second?", "Which items mention copper?"} {
		a.say(c, q)
	}
	a.waitIdle()

	file := filepath.Join(t.TempDir(), "moved.hctx")
	common := []string{"--api-key", "sk-real", "--user", c.id, "--session", c.id, "--json"}
	out, errOut, code := runCLI(t, append([]string{"snapshot", "export", "--url", "http://" + a.sc.addr, "-o", file}, common...)...)
	if code != 0 {
		t.Fatalf("export: exit %d: %s", code, errOut)
	}
	var exp struct {
		Bytes    int
		MS       float64
		Manifest struct {
			Memory struct{ Messages, Records int }
			Engine *struct{ States, Tokens, Bytes int }
		}
	}
	if err := json.Unmarshal([]byte(out), &exp); err != nil || exp.Manifest.Engine == nil || exp.Manifest.Engine.States == 0 || exp.Manifest.Memory.Messages != 7 {
		t.Fatalf("export printed %s (%v)", out, err)
	}
	out, errOut, code = runCLI(t, append([]string{"snapshot", "import", "--url", "http://" + b.sc.addr, file}, common...)...)
	if code != 0 {
		t.Fatalf("import: exit %d: %s", code, errOut)
	}
	var imp struct {
		MS     float64
		Result struct {
			Engine *struct{ States, Tokens int }
			Note   string
		}
	}
	if err := json.Unmarshal([]byte(out), &imp); err != nil || imp.Result.Engine == nil || imp.Result.Engine.States != exp.Manifest.Engine.States || imp.Result.Note != "" {
		t.Fatalf("import printed %s (%v)", out, err)
	}
	t.Logf("snapshot of a %d-message conversation: %d bytes (%d KV states, %d tokens, %d bytes of slot files); export %.1f ms, import %.1f ms",
		exp.Manifest.Memory.Messages, exp.Bytes, exp.Manifest.Engine.States, exp.Manifest.Engine.Tokens, exp.Manifest.Engine.Bytes, exp.MS, imp.MS)

	// The same history and memory on both.
	for _, p := range []string{"/v1/sessions/" + c.id, "/v1/sessions/" + c.id + "/memory"} {
		if ja, jb := sessionJSON(t, a, p, c.id), sessionJSON(t, b, p, c.id); ja != jb {
			t.Fatalf("%s differs:\nA %s\nB %s", p, ja, jb)
		}
	}

	// The next turn on B reprocesses what the same turn on A does: only
	// its new tokens.
	cb := &convo{id: c.id, msgs: slices.Clone(c.msgs), lastPrompt: c.lastPrompt}
	onA := a.say(c, "And the third?")
	onB := b.say(cb, "And the third?")
	t.Logf("next turn on A: %v; on B after the import: %v", onA, onB)
	if onB.Prompt != onA.Prompt || onB.PromptN > onA.PromptN+8 || onB.CacheN < onA.CacheN-8 {
		t.Fatalf("on B the next turn reprocessed %d tokens (cache_n %d), on A %d (cache_n %d)", onB.PromptN, onB.CacheN, onA.PromptN, onA.CacheN)
	}
	checkReused(t, "the moved session's next turn", onB)

	// A snapshot of another model is refused by a sidecar whose engine
	// runs another, and a damaged one by any: nothing is written.
	other := newRealStack(t, 2, llamatest.Model(t, 256, 4, 4, 2, 512, 2))
	_, errOut, code = runCLI(t, append([]string{"snapshot", "import", "--url", "http://" + other.sc.addr, file}, common...)...)
	if code != 1 || !strings.Contains(errOut, "409 snapshot_other_model") {
		t.Fatalf("import into another model: exit %d: %s", code, errOut)
	}
	raw, _ := os.ReadFile(file)
	raw[len(raw)/2] ^= 0x10
	req, _ := http.NewRequest(http.MethodPut, "http://"+other.sc.addr+"/v1/sessions/"+c.id+"/snapshot", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer sk-real")
	req.Header.Set("X-User-ID", c.id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "snapshot_corrupt") {
		t.Fatalf("a damaged snapshot: %d %s", resp.StatusCode, body)
	}
	req, _ = http.NewRequest(http.MethodGet, "http://"+other.sc.addr+"/v1/sessions/"+c.id, nil)
	req.Header.Set("Authorization", "Bearer sk-real")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 404 {
		t.Fatalf("a refused import left a session: %v %v", resp.StatusCode, err)
	}
	if err := os.WriteFile(file, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runCLI(t, "snapshot", "inspect", file); code != 1 || !strings.Contains(errOut, "damaged") {
		t.Fatalf("inspect of a damaged file: exit %d: %s", code, errOut)
	}
}
