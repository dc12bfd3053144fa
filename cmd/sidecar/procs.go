package main

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"sync/atomic"
	"time"
)

// procsTuner sizes Go's scheduler (GOMAXPROCS) to the sidecar's own CPU
// use. Beside an engine the proxy is mostly idle between requests, and
// there a second P only costs: each request's goroutine is handed between
// threads and CPUs (0.55–0.74 CPU migrations per request at one
// connection, 0.03–0.10 with one P), 41 µs of CPU per request against 33,
// and an added p50 of 2.0–3.2× nginx's under wrk at one connection against
// 1.0–1.5× (docs/BENCHMARKS.md, issue 25). Under load one P caps the
// sidecar at one core. So the tuner starts with what the runtime chose
// (the CPUs, or the cgroup's limit), steps back one P when the process's
// CPU use averaged over about five seconds would fit in one P less at
// procsLowerAt, no sooner than procsHold after its last change, and
// doubles again (up to that maximum) as soon as the use averaged over
// about three windows of procsEvery reaches procsRaiseAt of its Ps: a
// burst of requests is served at two Ps within 60 ms (160 ms after an idle
// spell, procsIdleEvery), and a load near a bound does not flap it. GOMAXPROCS set in the environment fixes the
// count and turns the tuner off. With a CUDA device it keeps at least
// gpu.CopyWays: a KV restore's staging copy on the request path is split
// over that many cores, and comes too soon after an idle spell to wait for
// the tuner (procsFloor).
type procsTuner struct {
	min, max   int
	cur        int
	fast, slow float64 // CPU use, cores: short and long moving averages
	since      int     // windows since the last change
}

const (
	procsEvery = 20 * time.Millisecond
	// procsIdleEvery is the window when the tuner is at its floor and
	// the process was idle (below procsIdle cores): an idle sidecar wakes
	// 10 times a second rather than 50 (0.2% of a core idle at 50), and
	// its first burst waits at most this long more to be seen.
	procsIdleEvery = 100 * time.Millisecond
	procsIdle      = 0.05
	procsRaiseAt   = 0.6
	procsLowerAt   = 0.5
	procsFast      = 3   // windows the fast average weighs
	procsSlow      = 250 // and the slow one
	procsHold      = 250 // windows between a change and a step back
)

// next returns the Ps for the next window, given the cores the process
// used in the last one.
func (t *procsTuner) next(used float64) int {
	t.fast += (used - t.fast) / procsFast
	t.slow += (used - t.slow) / procsSlow
	t.since++
	switch {
	case t.cur < min(t.min, t.max):
		t.cur = min(t.min, t.max)
		t.since = 0
	case t.cur < t.max && t.fast >= procsRaiseAt*float64(t.cur):
		t.cur = min(t.max, 2*t.cur)
		t.slow = max(t.slow, t.fast)
		t.since = 0
	case t.cur > max(1, t.min) && t.since >= procsHold && t.slow <= procsLowerAt*float64(t.cur-1):
		t.cur--
		t.since = 0
	}
	return t.cur
}

// procsFloor is the fewest Ps the tuner leaves (serve raises it for a
// CUDA device).
var procsFloor atomic.Int32

// tuneProcs runs the tuner until ctx ends, when the environment leaves
// GOMAXPROCS to it and the platform reports the process's CPU time.
func tuneProcs(ctx context.Context, log *slog.Logger) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	most := runtime.GOMAXPROCS(0)
	if _, ok := processCPU(); !ok || most <= 1 {
		return
	}
	t := procsTuner{max: most, cur: most}
	timer := time.NewTimer(procsEvery)
	defer timer.Stop()
	lastCPU, _ := processCPU()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-timer.C:
			cpu, _ := processCPU()
			used := (cpu - lastCPU).Seconds() / now.Sub(last).Seconds()
			lastCPU, last = cpu, now
			t.min = int(procsFloor.Load())
			if prev := t.cur; t.next(used) != prev {
				runtime.GOMAXPROCS(t.cur)
				log.Debug("procs tuned to the load", "procs", t.cur, "cores_used", used)
			}
			wait := procsEvery
			if t.cur <= max(1, t.min) && used < procsIdle {
				wait = procsIdleEvery
			}
			timer.Reset(wait)
		}
	}
}
