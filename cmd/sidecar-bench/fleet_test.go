package main

// A fleet of sidecars on a real redis-server (issue 13), as `sidecar bench
// fleet` runs it. Where redis-server or llama-server is missing the test
// skips, or fails under KVSIDECAR_REQUIRE_REDIS=1 / KVSIDECAR_REQUIRE_LLAMA=1
// (as in CI).

import (
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver/redistest"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// `sidecar bench fleet` with real parts end to end: redis-server (AOF,
// appendfsync always), two replicas each a sidecar before its own
// llama-server, sessions alternating between them, one replica killed
// with SIGKILL, redis-server killed with SIGKILL and restarted, then a
// replica with empty disks serving every session from the store. The
// per-turn recall block is off (--recall-share=0) so the prompt grows by
// exactly what a turn adds, and what a moved turn reprocesses beyond that
// is the fleet's doing. The replica dies once its queue drained
// (--drain-before-kill): a kill right after an answer may lose that turn's
// KV, and this test measures the restore of the last saved one.
func TestFleetRealParts(t *testing.T) {
	redistest.Require(t)
	llamatest.Require(t)
	var r workload.FleetReport
	stderr := runBenchJSON(t, &r, "fleet", "--sessions", "3", "--rounds", "5", "--slots", "1",
		"--doc-tokens", "1500", "--kill-after", "3", "--drain-before-kill", "--redis-restart-after", "4", "--sidecar-arg=--recall-share=0",
		"--sidecar-arg=--extract=false")
	t.Logf("%s", stderr)
	if len(r.RoundStats) != 5 || r.RoundStats[3].Event == "" || r.RoundStats[4].Event != "redis restart" {
		t.Fatalf("rounds: %+v", r.RoundStats)
	}
	s, l := r.Shared, r.Local
	if s.Errors+l.Errors+r.Joiner.Errors != 0 || s.Moved == 0 || s.Moved != l.Moved {
		t.Fatalf("shared %+v, local %+v, joiner %+v", s, l, r.Joiner)
	}
	// Every moved turn of the shared fleet restored the other replica's
	// KV: it reprocessed what it added, plus at most 10% of its prompt.
	if s.Reprocessed > s.NewTokens+s.Prompt/10 {
		t.Errorf("moved turns reprocessed %d tokens; they added %d of %d", s.Reprocessed, s.NewTokens, s.Prompt)
	}
	// The first move lands on a replica that never saw the session: with
	// no shared store it computes the whole prompt.
	r2 := r.RoundStats[1]
	if r2.Local.Reprocessed < r2.Local.Prompt*8/10 || r2.Shared.Reprocessed > r2.Shared.NewTokens+r2.Shared.Prompt/10 {
		t.Errorf("round 2: local reprocessed %d of %d, shared %d (%d new)", r2.Local.Reprocessed, r2.Local.Prompt, r2.Shared.Reprocessed, r2.Shared.NewTokens)
	}
	// The killed replica's sessions go on elsewhere from its last saved
	// KV: what they add, and at most 10% of a cold start.
	if k := r.AfterKill; k.Turns == 0 || k.Ratio > 0.10 || k.Reprocessed > k.NewTokens+k.Prompt/10 {
		t.Errorf("after the kill: %+v", k)
	}
	// After the Redis restart a replica with empty disks serves every
	// session: its history and KV came from the store's AOF.
	if j := r.Joiner; j.Turns != 3 || j.Reprocessed > j.NewTokens+j.Prompt/10 {
		t.Errorf("joiner: %+v", j)
	}
	if h := r.History; h.Turns != 3*6 || h.Kept != h.Turns {
		t.Errorf("history: %+v", h)
	}
}
