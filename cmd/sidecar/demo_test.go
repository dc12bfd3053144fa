package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/internal/mockup"
)

// lockedBuffer is a bytes.Buffer safe for a logger writing while the test
// reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	addr, closeFn, err := launch.RefusedAddr() // held: no other test's listener takes the port meanwhile
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeFn)
	return addr
}

// serveInProcess runs serve with args (and no environment) until the
// test ends; it returns the address, the log (text) and the hints.
func serveInProcess(t *testing.T, edit func(*serveConfig), args ...string) (addr string, log, hints *lockedBuffer) {
	t.Helper()
	c, err := parseServe(append([]string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--kv-tune=false"}, args...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	log, hints = &lockedBuffer{}, &lockedBuffer{}
	c.hints = hints
	if edit != nil {
		edit(&c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, c, slog.New(slog.NewTextHandler(log, nil)), ready) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("serve stopped before listening: %v\n%s", err, log)
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not listen within 60s\n%s", log)
	}
	return addr, log, hints
}

// hintCommands returns the shell commands of the demo's hints: each line
// that starts with curl, joined with its continuation lines.
func hintCommands(hints string) []string {
	var cmds []string
	var cur string
	for _, line := range strings.Split(hints, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case cur != "":
			cur += " " + line
		case strings.HasPrefix(line, "curl "):
			cur = line
		default:
			continue
		}
		if !strings.HasSuffix(cur, "\\") {
			cmds, cur = append(cmds, cur), ""
		} else {
			cur = strings.TrimSuffix(cur, "\\")
		}
	}
	return cmds
}

// TestDemoWithoutUpstream is `make run` on a machine with no LLM server:
// the first log line says the sidecar runs in demo mode, the hints'
// commands, run as printed, hold a conversation whose second answer shows
// the history the sidecar added and whose memory lists the first turn's
// fact, and the console answers its token.
func TestDemoWithoutUpstream(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("the hints are shell commands: %v", err)
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("the hints run curl (apt-get install curl; .ci/run installs it): %v", err)
	}
	nothing := "http://" + closedAddr(t)
	addr, log, hints := serveInProcess(t, func(c *serveConfig) { c.demoLookAt = nothing }, "--demo")
	first, _, _ := strings.Cut(log.String(), "\n")
	if !strings.Contains(first, "level=WARN") || !strings.Contains(first, "DEMO MODE") || !strings.Contains(first, nothing) {
		t.Errorf("first log line %q: want the demo mode's warning naming %s", first, nothing)
	}
	if strings.Contains(log.String(), "UPSTREAM UNREACHABLE") {
		t.Errorf("the demo warned its own upstream unreachable:\n%s", log)
	}
	cmds := hintCommands(hints.String())
	if len(cmds) != 3 {
		t.Fatalf("%d commands in the hints, want 3 (two chat turns, the memory):\n%s", len(cmds), hints)
	}
	run := func(cmd string) []byte {
		t.Helper()
		out, err := exec.Command(bash, "-c", cmd).Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		return out
	}
	answer := func(out []byte) string {
		t.Helper()
		var r struct {
			Choices []struct{ Message struct{ Content string } }
		}
		if err := json.Unmarshal(out, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("answer %s: %v", out, err)
		}
		return r.Choices[0].Message.Content
	}
	if a := answer(run(cmds[0])); !strings.Contains(a, "I received 1 message") {
		t.Errorf("first answer %q", a)
	}
	a := answer(run(cmds[1]))
	for _, want := range []string{"I received 3 messages", "1. user: My name is Ada and I write Go.", "2. assistant: (an earlier answer", "3. user: Which language"} {
		if !strings.Contains(a, want) {
			t.Errorf("second answer lacks %q: the sidecar did not add the history:\n%s", want, a)
		}
	}
	var mem struct {
		Units []struct{ Category, Content string }
		Focus int
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := json.Unmarshal(run(cmds[2]), &mem); err != nil {
			t.Fatal(err)
		}
		if len(mem.Units) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if mem.Focus != 4 || len(mem.Units) != 1 || mem.Units[0].Category != "fact" || mem.Units[0].Content != "My name is Ada and I write Go." {
		t.Errorf("memory %+v: want the 4 messages in the window and the first turn's fact", mem)
	}
	// The console, on the admin listener: the page at the printed URL, and
	// its API with the printed token.
	_, tok, ok := strings.Cut(hints.String(), "admin token ")
	tok = strings.TrimSpace(tok)
	_, ui, _ := strings.Cut(hints.String(), "in a browser: ")
	ui, _, _ = strings.Cut(ui, " ")
	admin := strings.TrimSuffix(strings.TrimPrefix(ui, "http://"), "/ui/")
	if !ok || tok == "" || ui != consoleURL(admin) || admin == addr {
		t.Fatalf("hints without the console's URL on the admin listener and its token:\n%s", hints)
	}
	for path, auth := range map[string]string{"/ui/": "", "/admin/v1/tenants": "Bearer " + tok} {
		req, _ := http.NewRequest("GET", "http://"+admin+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
	}
}

// TestDemoServesAFoundUpstream: with a server answering where --demo
// looks, the sidecar serves in front of it, as without --demo.
func TestDemoServesAFoundUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := mockup.New(mockup.Options{})
	go func() { _ = up.Serve(ln) }()
	defer up.Close()
	found := "http://" + ln.Addr().String()
	addr, log, hints := serveInProcess(t, func(c *serveConfig) { c.demoLookAt = found }, "--demo")
	if hints.String() != "" || strings.Contains(log.String(), "DEMO MODE") || !strings.Contains(log.String(), "upstream="+found) {
		t.Errorf("with an upstream at %s: log\n%s\nhints %q", found, log, hints)
	}
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(b.String(), "canned answer") {
		t.Errorf("%d %s", resp.StatusCode, b.String())
	}
}

// TestServeWarnsOfAnUnreachableUpstream: an upstream given but not
// answering at start is a warning naming it and the ways out; the sidecar
// serves anyway (the upstream may come up later).
func TestServeWarnsOfAnUnreachableUpstream(t *testing.T) {
	up := "http://" + closedAddr(t)
	_, log, hints := serveInProcess(t, nil, "--upstream", up, "--demo")
	var warn string
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, "UPSTREAM UNREACHABLE") {
			warn = l
		}
	}
	for _, want := range []string{"level=WARN", up, "--upstream", "SIDECAR_UPSTREAM", "make run"} {
		if !strings.Contains(warn, want) {
			t.Errorf("warning %q lacks %q\n%s", warn, want, log)
		}
	}
	if hints.String() != "" || strings.Contains(log.String(), "DEMO MODE") {
		t.Errorf("--upstream given: no demo wanted\n%s%s", log, hints)
	}
}
