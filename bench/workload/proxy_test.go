package workload

import (
	"net"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/mockup"
)

func TestParseStat(t *testing.T) {
	// comm may hold spaces and parentheses: fields count from the last ')'.
	line := "4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 3 0 100 1000000 200 18446744073709551615\n"
	ticks, ppid, err := parseStat([]byte(line))
	if err != nil || ticks != 325 || ppid != 17 {
		t.Fatalf("ticks %d, ppid %d, err %v; want 325, 17", ticks, ppid, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 x S 1 2 3 4 5 6 7 8 9 10 11 12 13"} {
		if _, _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestProcCPUCountsChildren(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep binary:", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if kids := childPIDs(os.Getpid()); !slices.Contains(kids, cmd.Process.Pid) {
		t.Errorf("children %v lack %d", kids, cmd.Process.Pid)
	}
	if _, err := procCPU([]int{0, cmd.Process.Pid, 1 << 30}); err != nil { // a pid that is gone counts zero
		t.Fatal(err)
	}
}

// TestRunProxyPathsAndLevels runs the load against the scripted upstream
// over loopback: a pass-through path (no API key, no session) and a
// session path (session ids, one per SessionTurns requests of a client),
// each concurrency its own level, every figure filled in.
func TestRunProxyPathsAndLevels(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := mockup.New(mockup.Options{StreamEvents: 4, KeepPrompts: true})
	go func() { _ = up.Serve(ln) }()
	defer up.Close()
	addr := ln.Addr().String()
	rep, err := RunProxy(ProxyOptions{
		Targets: []ProxyTarget{
			{Name: "direct", Addr: addr},
			{Name: "session", Addr: addr, Session: true, PIDs: []int{os.Getpid()}},
		},
		Requests: 4000, StreamRequests: 400, Concurrency: []int{1, 4}, Rounds: 2, Warmup: 10, SessionTurns: 5,
		UpstreamPIDs: []int{0},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Levels) != 2 || rep.Levels[0].Concurrency != 1 || rep.Levels[1].Concurrency != 4 {
		t.Fatalf("levels %+v", rep.Levels)
	}
	for _, lv := range rep.Levels {
		for _, p := range lv.Paths {
			if p.Requests != 4000 || p.Errors != 0 || p.StreamRequests != 400 || p.StreamErrors != 0 {
				t.Errorf("c=%d %s: %d requests (%d errors), %d streamed (%d errors)", lv.Concurrency, p.Name, p.Requests, p.Errors, p.StreamRequests, p.StreamErrors)
			}
			if p.RPS <= 0 || p.StreamRPS <= 0 || p.P50Ms <= 0 || p.StreamTTFEP50 <= 0 || p.StreamTTLEP50 < p.StreamTTFEP50 {
				t.Errorf("c=%d %s: %+v", lv.Concurrency, p.Name, p)
			}
		}
		if d := lv.Paths[0]; d.AddedP50Ms != 0 || d.AddedTTLEP50 != 0 || d.CPUPer10K != 0 {
			t.Errorf("direct is the baseline, without pids: %+v", d)
		}
		if s := lv.Paths[1]; !s.Session || s.CPUPer10K <= 0 || s.StreamCPUPer10K <= 0 {
			t.Errorf("session path: session %v, CPU s/10K %v and %v streamed", s.Session, s.CPUPer10K, s.StreamCPUPer10K)
		}
		if lv.UpstreamCPUPer10K <= 0 || lv.LoadCPUPer10K <= 0 {
			t.Errorf("upstream CPU %v, load generator CPU %v", lv.UpstreamCPUPer10K, lv.LoadCPUPer10K)
		}
	}
	// Pass-through requests carry no session: the mock counts them apart.
	direct := 2 * (10 + 4000 + 400)
	if bg := up.BackgroundCalls()["mock"]; bg != direct {
		t.Errorf("%d requests without a session, want the direct path's %d", bg, direct)
	}
	// Each client of the session path starts a session every 5 requests:
	// the session path sent as many requests as the direct one, in 5
	// batches per level (warm-up, 2 rounds each streamed or not) of 1 and
	// 4 clients, each client's last session possibly short.
	sessions := up.Sessions()
	if lo, hi := direct/5, direct/5+5*(1+4); sessions < lo || sessions > hi {
		t.Errorf("%d sessions, want %d to %d", sessions, lo, hi)
	}
	if _, err := RunProxy(ProxyOptions{Targets: []ProxyTarget{{Name: "a", Addr: addr, PIDs: []int{7}}, {Name: "b", Addr: addr, PIDs: []int{7}}}}); err == nil {
		t.Error("a pid charged to two targets was accepted")
	}
}
