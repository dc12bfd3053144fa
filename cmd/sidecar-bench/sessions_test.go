package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// `sidecar bench sessions` runs end to end as a user runs it: it starts
// both llama-servers and the sidecar binary, kills the sidecar with
// SIGKILL between rounds, and prints one JSON object and an SVG.
func TestBenchSessionsRuns(t *testing.T) {
	llamatest.Require(t)
	plot := filepath.Join(t.TempDir(), "sessions.svg")
	var r workload.SessionsReport
	stderr := runBenchJSON(t, &r, "sessions", "--sessions", "3", "--rounds", "2", "--slots", "1",
		"--doc-tokens", "400", "--cache-ram", "-1", "--sidecar-restart-after", "1", "--plot", plot)
	if len(r.RoundStats) != 2 || r.RoundStats[1].Event != "sidecar restart" || len(r.Notes) == 0 || !strings.Contains(r.Notes[0], "SIGKILL") {
		t.Fatalf("report: %+v", r)
	}
	for _, rs := range r.RoundStats {
		for _, side := range []workload.SessionsSide{rs.Direct, rs.Sidecar} {
			if side.Turns != 3 || side.Errors != 0 || side.PromptTokens != side.Reprocessed+side.Cached || side.TTFTP50Ms <= 0 {
				t.Fatalf("round %d: %+v\n%s", rs.Round, side, stderr)
			}
		}
	}
	// Three 400-token documents, one slot and no RAM cache: the direct client
	// computes every prompt in full, both rounds.
	for _, rs := range r.RoundStats {
		if d := rs.Direct; d.Reprocessed < 3*400 || d.Reprocessed < d.PromptTokens*8/10 || d.EngineReprocessed < d.Reprocessed {
			t.Fatalf("round %d direct: %+v", rs.Round, d)
		}
	}
	if rs := r.RoundStats[1]; rs.Floor <= 0 || rs.Floor >= 0.5 || rs.Ratio != float64(rs.Sidecar.Reprocessed)/float64(rs.Direct.Reprocessed) {
		t.Fatalf("round 2 ratio %.3f, floor %.3f", rs.Ratio, rs.Floor)
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !strings.Contains(string(svg), "after sidecar restart") {
		t.Fatalf("plot: %v\n%s", err, svg)
	}
}
