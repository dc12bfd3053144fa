package main

import (
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// TestProcsTunerFollowsTheLoad: a light load steps the scheduler down one
// P at a time, each no sooner than procsHold after the last change; a
// burst doubles it back within a few windows; a load between the bounds,
// or one whose windows swing around them, moves nothing.
func TestProcsTunerFollowsTheLoad(t *testing.T) {
	run := func(tu *procsTuner, used float64, windows int) (changes []int) {
		for range windows {
			prev := tu.cur
			if tu.next(used) != prev {
				changes = append(changes, tu.cur)
			}
		}
		return changes
	}

	tu := &procsTuner{max: 2, cur: 2}
	// One connection's requests, back to back: 0.45 cores.
	if got := run(tu, 0.45, procsHold-1); len(got) != 0 {
		t.Fatalf("stepped to %v before procsHold", got)
	}
	if got := run(tu, 0.45, 1); len(got) != 1 || got[0] != 1 {
		t.Fatalf("a 0.45-core load at two Ps: %v, want a step to 1", got)
	}
	if got := run(tu, 0.45, 10*procsHold); len(got) != 0 {
		t.Fatalf("a 0.45-core load at one P moved it: %v", got)
	}
	// A burst that needs more than the one P: two Ps within three windows.
	if got := run(tu, 1.0, 3); len(got) != 1 || got[0] != 2 {
		t.Fatalf("a burst at one P: %v, want a step to 2", got)
	}
	// Between the bounds at two Ps: it stays.
	if got := run(tu, 0.55, 10*procsHold); len(got) != 0 {
		t.Fatalf("a 0.55-core load at two Ps moved it: %v", got)
	}
	// Windows that swing around the raise bound, light on average.
	tu = &procsTuner{max: 2, cur: 1}
	for i := range 10 * procsHold {
		used := 0.3
		if i%2 == 0 {
			used = 0.65
		}
		if tu.next(used) != 1 {
			t.Fatalf("window %d: swinging windows of 0.475 cores on average raised it", i)
		}
	}

	// A larger host: doubling up, one step down at a time.
	tu = &procsTuner{max: 8, cur: 1}
	if got := run(tu, 8, 20); len(got) != 3 || got[0] != 2 || got[1] != 4 || got[2] != 8 {
		t.Fatalf("a load of eight cores from one P: %v, want 2, 4, 8", got)
	}
	got := run(tu, 0.1, 20*procsHold)
	want := []int{7, 6, 5, 4, 3, 2, 1}
	if len(got) != len(want) {
		t.Fatalf("an idle host from eight Ps: %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("an idle host from eight Ps: %v, want %v", got, want)
		}
	}
}

// TestProcsTunerKeepsItsFloor: with a floor (a CUDA device's copy ways)
// an idle sidecar steps down to it and no lower, and a floor raised above
// the current count takes effect at the next window.
func TestProcsTunerKeepsItsFloor(t *testing.T) {
	tu := &procsTuner{min: 4, max: 8, cur: 8}
	var last int
	for range 20 * procsHold {
		last = tu.next(0.05)
	}
	if last != 4 {
		t.Fatalf("an idle tuner with floor 4 of 8: %d Ps", last)
	}
	tu = &procsTuner{min: 1, max: 8, cur: 1}
	tu.min = 4
	if n := tu.next(0); n != 4 {
		t.Fatalf("a floor of 4 raised at one P: %d Ps", n)
	}
	tu = &procsTuner{min: 4, max: 2, cur: 1}
	if n := tu.next(0); n != 2 {
		t.Fatalf("a floor above the maximum: %d Ps, want the maximum", n)
	}
}

// TestSidecarSchedulerFollowsItsLoad: an idle sidecar runs on one P (as
// /metrics reports it), and one started with GOMAXPROCS keeps that count.
func TestSidecarSchedulerFollowsItsLoad(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: the runtime already runs one P, nothing to tune")
	}
	// The fixed one first: had it a tuner, it would step down before the
	// other.
	fixed := startChild(t, []string{"GOMAXPROCS=2"}, "--upstream", "http://127.0.0.1:1")
	t0 := time.Now()
	tuned := startChild(t, nil, "--upstream", "http://127.0.0.1:1")
	procs := func(c *child) int {
		resp, err := http.Get("http://" + c.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\d+)$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("no go_sched_gomaxprocs_threads in /metrics:\n%s", b)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	if n := procs(fixed); n != 2 {
		t.Fatalf("GOMAXPROCS=2: %d Ps", n)
	}
	for procs(tuned) != 1 {
		if time.Since(t0) > 60*time.Second {
			t.Fatalf("an idle sidecar still runs %d Ps after a minute", procs(tuned))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(t0); d < procsHold*procsEvery {
		t.Fatalf("stepped down %v after its start, before procsHold", d)
	}
	if n := procs(fixed); n != 2 {
		t.Fatalf("GOMAXPROCS=2, after the other stepped down: %d Ps", n)
	}
}
