package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// TestBenchServeRealLlamaDirectAndThroughSidecar runs `sidecar bench
// serve` (this test binary as sidecar-bench) against the real llama-server of
// ../shared/llama, direct and through the sidecar binary in front of it,
// in a concurrency sweep: every request of every run completes on both
// paths, the engine's cached prompt tokens come back through the sidecar
// as they do direct, and the sidecar kept each conversation as a session.
func TestBenchServeRealLlamaDirectAndThroughSidecar(t *testing.T) {
	llama := llamatest.Start(t, llamaserver.Options{Slots: 2, Threads: 1, Args: []string{"--n-predict", "64"}})
	addr := startSidecar(t, "--upstream", llama.URL())
	plot := filepath.Join(t.TempDir(), "serve.svg")
	const convs, turns = 3, 3
	cmd := benchCommand(t, "serve",
		"--target", "direct="+llama.URL(), "--target", "sidecar=http://"+addr+"/v1",
		"--conversations", "3", "--turns", "3", "--system-words", "60", "--max-tokens", "6",
		"--extra-body", `{"grammar":"root ::= [a-z ]+"}`, "--api-key", "sk-bench",
		"--concurrency", "1,2", "--json", "--quiet", "--plot", plot)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench serve: %v\n%s", err, stderr.String())
	}
	var rep workload.ServeReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bench serve --json: %v\n%s", err, stdout.String())
	}
	if len(rep.Runs) != 4 || rep.Requests != convs*turns {
		t.Fatalf("%d runs of %d requests, want 4 of %d", len(rep.Runs), rep.Requests, convs*turns)
	}
	for _, r := range rep.Runs {
		name := r.Target + " at " + concText(r.MaxConcurrency)
		if r.Completed != convs*turns || r.Failed != 0 {
			t.Errorf("%s: %d completed, %d failed: %q", name, r.Completed, r.Failed, r.Errors)
			continue
		}
		if r.TTFT.Median <= 0 || r.E2EL.Median < r.TTFT.Median || r.ITL.Median <= 0 || r.OutputThroughput <= 0 {
			t.Errorf("%s: TTFT %+v, E2EL %+v, ITL %+v, %.1f output tokens/s", name, r.TTFT, r.E2EL, r.ITL, r.OutputThroughput)
		}
		if r.TotalOutputTokens < int64(convs*turns) || r.TotalOutputTokens > int64(convs*turns*6) {
			t.Errorf("%s: %d output tokens for %d requests of max_tokens 6", name, r.TotalOutputTokens, convs*turns)
		}
		// Every turn after the first extends its conversation's prompt:
		// llama-server reports the reused prefix, through the sidecar too.
		if r.CachedReported != convs*turns || r.TotalCachedTokens <= 0 || r.CachedShare <= 0.2 {
			t.Errorf("%s: cached tokens %d reported by %d requests, share %.2f", name, r.TotalCachedTokens, r.CachedReported, r.CachedShare)
		}
	}
	m, err := workload.ScrapeMetrics(context.Background(), "http://"+workload.AdminAddr(addr)+"/metrics") // its own, on the admin listener
	if err != nil {
		t.Fatal(err)
	}
	// Two runs through the sidecar, plus its test request.
	if n, _ := m.Get("sidecar_memory_turns_total"); n < 2*convs*turns {
		t.Errorf("the sidecar recorded %v turns of sessions, want at least %d", n, 2*convs*turns)
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !strings.Contains(string(svg), "<svg") || !strings.Contains(string(svg), "sidecar") {
		t.Errorf("plot: %v", err)
	}
}

// TestBenchServeRefusesBadFlags: bad flags are errors before any request.
func TestBenchServeRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--target", "127.0.0.1:8000"},
		{"--target", "http://127.0.0.1:1", "--extra-body", "[1]"},
		{"--target", "http://127.0.0.1:1", "--concurrency", "1,x"},
		{"--target", "http://127.0.0.1:1", "stray"},
	} {
		if err := benchServe(args); err == nil {
			t.Errorf("bench serve %q: no error", args)
		}
	}
}

func concText(c int) string {
	if c == 0 {
		return "no cap"
	}
	return "concurrency " + strconv.Itoa(c)
}

func TestBenchProxyTargetFlag(t *testing.T) {
	var f targetsFlag
	for _, v := range []string{"direct=127.0.0.1:1", "sidecar-session=127.0.0.1:2,metrics,session,pid=10,pid=11"} {
		if err := f.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if f[0].Addr != "127.0.0.1:1" || f[0].Session || f[0].MetricsAddr != "" || len(f[0].PIDs) != 0 {
		t.Errorf("%+v", f[0])
	}
	if s := f[1]; s.Name != "sidecar-session" || s.Addr != "127.0.0.1:2" || s.MetricsAddr != "127.0.0.1:1002" || !s.Session || !slices.Equal(s.PIDs, []int{10, 11}) {
		t.Errorf("%+v", s)
	}
	for _, bad := range []string{"x", "=h:1", "a=", "a=h:1,pid=x", "a=h:1,what"} {
		if err := f.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
