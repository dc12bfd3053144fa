package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// `sidecar bench scale` end to end on a small run: the sidecar binary
// (sidecarBin), two batches, every figure of a batch filled in.
func TestBenchScaleSmall(t *testing.T) {
	run := func(t *testing.T, o workload.ScaleOptions) *workload.ScaleReport {
		t.Helper()
		o.Batches, o.Clients, o.Returning, o.Dir = []int{12, 12}, 2, 6, t.TempDir()
		o.SidecarCommand = []string{sidecarBin(t), "serve"}
		r, err := workload.RunScale(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Batches) != 2 {
			t.Fatalf("%d batches", len(r.Batches))
		}
		for i, b := range r.Batches {
			if b.Errors != 0 || b.Held != 12*(i+1) || b.NewP50Ms <= 0 || b.HotP50Ms <= 0 || b.ReturningSessions != 6 || b.ReturningP50Ms <= 0 ||
				b.RequestsPerSec <= 0 || b.RSSMB <= 0 || b.OpenFiles <= 0 || b.DiskFiles < b.Held || b.LoadedSessions <= 0 {
				t.Fatalf("batch %d: %+v", i+1, b)
			}
		}
		var out bytes.Buffer
		if err := workload.WriteScaleTable(&out, r); err != nil || !strings.Contains(out.String(), "returning p50/p99 ms") {
			t.Fatalf("table: %v\n%s", err, out.String())
		}
		return r
	}
	t.Run("per-user", func(t *testing.T) {
		r := run(t, workload.ScaleOptions{})
		if r.Users != "own X-User-ID per session" {
			t.Fatalf("users: %q", r.Users)
		}
	})
	t.Run("no-user", func(t *testing.T) { run(t, workload.ScaleOptions{NoUser: true}) })
	t.Run("remote", func(t *testing.T) {
		if _, err := redisserver.Find(); err != nil {
			t.Skip(err)
		}
		r := run(t, workload.ScaleOptions{Remote: true})
		if b := r.Batches[1]; b.RedisBytes <= 0 || b.RedisBytesPerSession <= 0 {
			t.Fatalf("no Redis memory: %+v", b)
		}
	})
}
