package main

// The hostile harness (issue 12): the sidecar binary against a
// fault-injecting upstream (bench/harness/faultup) and hostile clients — the
// issue's rows, requests that meet every upstream fault, and random
// methods, paths, headers and bodies — for a bounded time. It asserts no
// 5xx that is the sidecar's fault, no panic or data race in the child's
// output, no goroutine or fd growth, shutdown within its grace, and
// nothing acknowledged lost across a restart and across kill -9.
//
// `make test` runs it for a few seconds; `make test-hostile` for a minute
// with a report (SIDECAR_HOSTILE_DURATION, SIDECAR_HOSTILE_REPORT).
//
// This file holds the harness (the child, its watched figures, the run and
// its report) and TestHostile; the clients are in hostile_clients_test.go,
// the kill -9 durability test in hostile_durability_test.go and the memory
// rows in hostile_memory_test.go.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/faultup"
)

// startFaultUpstream serves a fault-injecting upstream on loopback until
// the test ends and returns it with its base URL.
func startFaultUpstream(t *testing.T, o faultup.Options) (*faultup.Server, string) {
	t.Helper()
	up := faultup.New(o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = up.Serve(ln) }()
	t.Cleanup(func() { _ = up.Close() })
	return up, "http://" + ln.Addr().String()
}

// startProc runs `sidecar serve` on dataDir, its log kept in a file, and
// waits until it listens.
func startProc(t *testing.T, dataDir string, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir}, args...)...)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	return startCmd(t, cmd, filepath.Join(t.TempDir(), "sidecar.log"))
}

// crashes returns the lines of the child's output that show a panic, a
// fatal error or a data race.
func (p *child) crashes() []string {
	var out []string
	for _, l := range strings.Split(p.log(), "\n") {
		if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") || strings.Contains(l, "WARNING: DATA RACE") ||
			strings.Contains(l, `"panic`) {
			out = append(out, l)
		}
	}
	return out
}

// procStats is what the harness watches for growth.
type procStats struct {
	FDs          int   `json:"fds"`
	Goroutines   int   `json:"goroutines"`
	RSSBytes     int64 `json:"rss_bytes"`
	HeapInuse    int64 `json:"heap_inuse_bytes"`
	SessionsHeld int   `json:"sessions_loaded"`
}

func (p *child) stats(t *testing.T) procStats {
	t.Helper()
	var st procStats
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid()))
	if err != nil {
		t.Fatalf("fds: %v", err)
	}
	st.FDs = len(ents)
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid())); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				st.RSSBytes = kb << 10
			}
		}
	}
	if a := p.pprof.Load(); a != nil {
		// A heap profile with gc=1 collects first: HeapInuse is then the
		// live heap, not live plus garbage.
		if resp, err := http.Get("http://" + *a + "/debug/pprof/heap?gc=1"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	m := scrape(t, p.admin)
	st.Goroutines = int(m["go_goroutines"])
	st.HeapInuse = int64(m["go_memstats_heap_inuse_bytes"])
	st.SessionsHeld = int(m["sidecar_memory_sessions_loaded"])
	return st
}

// scrape reads the unlabelled metrics of /metrics.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err == nil {
			m[name] = f
		}
	}
	return m
}

// quiesce waits until the sidecar serves nothing but the scrape itself and
// its goroutine count has settled, then returns its stats.
func (p *child) quiesce(t *testing.T) procStats {
	t.Helper()
	var last procStats
	stable := 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if scrape(t, p.admin)["sidecar_http_in_flight_requests"] > 1 {
			stable = 0
			continue
		}
		st := p.stats(t)
		if os.Getenv("SIDECAR_HOSTILE_DEBUG") != "" {
			t.Logf("quiesce: %+v", st)
		}
		if st.Goroutines == last.Goroutines && st.FDs == last.FDs {
			stable++
		} else {
			stable = 0
		}
		last = st
		if stable >= 3 {
			break
		}
	}
	return last
}

// rawResp is what a raw client saw.
type rawResp struct {
	status  int
	header  http.Header
	body    []byte
	readErr error // the body did not end cleanly (aborted stream)
}

// rawDo sends one request as written and reads the answer.
func rawDo(addr string, req []byte, method string, timeout time.Duration) (*rawResp, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write(req); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := &rawResp{status: resp.StatusCode, header: resp.Header}
	r.body, r.readErr = io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return r, nil
}

func buildRequest(method, target string, hdr [][2]string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n", method, target)
	for _, h := range hdr {
		fmt.Fprintf(&b, "%s: %s\r\n", h[0], h[1])
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(body))
	b.Write(body)
	return b.Bytes()
}

func errorCode(body []byte) string {
	var e struct{ Error struct{ Code string } }
	if json.Unmarshal(body, &e) == nil {
		return e.Error.Code
	}
	return ""
}

// hostileReport is what `make test-hostile` records in docs/BENCHMARKS.md.
type hostileReport struct {
	Duration      string         `json:"duration"`
	Workers       int            `json:"workers"`
	Inputs        map[string]int `json:"inputs_by_kind"`
	Served        int            `json:"requests_served"`
	NoResponse    map[string]int `json:"no_response_by_kind"`
	ByStatus      map[string]int `json:"responses_by_status"`
	FaultsSent    map[string]int `json:"faults_injected"`
	FiveXXByCause map[string]int `json:"5xx_by_cause"`
	Failures      int            `json:"failures"`
	FailureSample []string       `json:"failure_sample,omitempty"`
	Before        procStats      `json:"before"`
	After         procStats      `json:"after"`
	Shutdown      struct {
		Grace      string `json:"grace"`
		OpenStream int    `json:"open_streams"`
		ExitAfter  string `json:"exit_after"`
	} `json:"shutdown"`
	AckedTurns   int   `json:"acked_turns"`
	AckedKVPuts  int   `json:"acked_kv_puts"`
	LostTurns    int   `json:"lost_turns"`
	LostKVBytes  int64 `json:"lost_kv_bytes"`
	CorruptAgree bool  `json:"corrupt_head_get_agree"`
	Crashes      int   `json:"panics_or_races"`
}

// hostileRun collects what the workers saw.
type hostileRun struct {
	seq      atomic.Int64 // names turns and blobs uniquely across runs
	mu       sync.Mutex
	rep      *hostileReport
	failures []string
	turns    []ackedTurn
	blobs    []ackedBlob
}

type ackedTurn struct{ key, session, user, reply string }
type ackedBlob struct {
	key, ns, name string
	data          []byte
}

func (h *hostileRun) fail(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rep.Failures++
	if len(h.failures) < 30 {
		h.failures = append(h.failures, fmt.Sprintf(format, args...))
	}
}

func (h *hostileRun) count(m map[string]int, k string) {
	h.mu.Lock()
	m[k]++
	h.mu.Unlock()
}

// seen records one answer; cause names who answers for a 5xx.
func (h *hostileRun) seen(r *rawResp, cause string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rep.Served++
	h.rep.ByStatus[strconv.Itoa(r.status)]++
	if r.status >= 500 {
		h.rep.FiveXXByCause[cause]++
	}
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

const hostileWorkers = 6

// TestHostile is the harness's main run (see the file comment).
func TestHostile(t *testing.T) {
	if testing.Short() {
		t.Skip("the hostile harness runs the binary for several seconds")
	}
	dur := envDuration("SIDECAR_HOSTILE_DURATION", 6*time.Second)
	tStart := time.Now()
	defer func() { t.Logf("harness wall time %s", time.Since(tStart).Round(time.Millisecond)) }()
	up, upstream := startFaultUpstream(t, faultup.Options{StallFor: 4 * time.Second, HugeBytes: 3 << 20, SlowGap: 30 * time.Millisecond})

	dataDir := t.TempDir()
	args := []string{"--upstream", upstream, "--pprof", "127.0.0.1:0",
		"--upstream-timeout", "1500ms", "--stream-idle-timeout", "1500ms", "--shutdown-timeout", "2s",
		"--max-response-bytes", strconv.Itoa(2 << 20), "--max-body-bytes", strconv.Itoa(1 << 20), "--max-kv-bytes", strconv.Itoa(1 << 20)}
	p := startProc(t, dataDir, args...)

	run := &hostileRun{rep: &hostileReport{Duration: dur.String(), Workers: hostileWorkers,
		Inputs: map[string]int{}, NoResponse: map[string]int{}, ByStatus: map[string]int{}, FiveXXByCause: map[string]int{}}}
	rep := run.rep

	// Warm up with every tenant and session the workers use, so that
	// pools, workers and session logs exist before the baseline.
	warmUp(t, p)
	t.Logf("warmed up after %s", time.Since(tStart).Round(time.Millisecond))
	runWorkers(t, p, run, 1500*time.Millisecond)
	rep.Before = p.quiesce(t)
	t.Logf("baseline after %s", time.Since(tStart).Round(time.Millisecond))

	runWorkers(t, p, run, dur)
	rep.After = p.quiesce(t)
	if path, a := os.Getenv("SIDECAR_HOSTILE_HEAP"), p.pprof.Load(); path != "" && a != nil {
		// The live heap after the run, for `go tool pprof`.
		if resp, err := http.Get("http://" + *a + "/debug/pprof/heap"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_ = os.WriteFile(path, b, 0o644)
		}
	}
	t.Logf("run done after %s", time.Since(tStart).Round(time.Millisecond))
	rep.FaultsSent = map[string]int{}
	for f, n := range up.Counts() {
		rep.FaultsSent[string(f)] = n
	}

	// Shutdown: SIGTERM with endless streams open must end within the
	// grace (2 s) plus the time to close the stores.
	const grace = 2 * time.Second
	rep.Shutdown.Grace = grace.String()
	streams := make(chan error, 4)
	for i := 0; i < cap(streams); i++ {
		ready := make(chan struct{})
		go func() {
			conn, err := net.Dial("tcp", p.addr)
			if err != nil {
				close(ready)
				streams <- err
				return
			}
			defer conn.Close()
			_, _ = conn.Write(buildRequest("POST", "/v1/chat/completions", [][2]string{{"X-Fault", "drip"}, {"Authorization", "Bearer drip"}},
				[]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"go on"}]}`)))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				close(ready)
				streams <- err
				return
			}
			one := make([]byte, 1)
			_, _ = resp.Body.Read(one)
			close(ready)
			b, err := io.ReadAll(resp.Body)
			if err == nil && bytes.Contains(b, []byte("data: [DONE]")) {
				err = fmt.Errorf("an endless stream ended cleanly at shutdown")
			} else {
				err = nil
			}
			streams <- err
		}()
		<-ready
	}
	rep.Shutdown.OpenStream = int(scrape(t, p.admin)["sidecar_http_in_flight_requests"]) - 1
	t0 := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(grace + 20*time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGQUIT) // goroutine dump into the log
		<-p.done
		t.Fatalf("sidecar still running %s after SIGTERM (grace %s); its output:\n%s", time.Since(t0), grace, tail(p.log(), 40000))
	}
	rep.Shutdown.ExitAfter = p.exited.Sub(t0).Round(time.Millisecond).String()
	if os.Getenv("SIDECAR_HOSTILE_DEBUG") != "" {
		t.Logf("shutdown log:\n%s", tail(p.log(), 3000))
	}
	if d := p.exited.Sub(t0); d > grace+5*time.Second {
		run.fail("shutdown took %s with a grace of %s", d, grace)
	}
	for i := 0; i < cap(streams); i++ {
		if err := <-streams; err != nil {
			run.fail("stream at shutdown: %v", err)
		}
	}
	if p.err != nil {
		run.fail("sidecar exit after SIGTERM: %v", p.err)
	}
	crashes := p.crashes()

	// Restart on the same data: everything acknowledged is there.
	p2 := startProc(t, dataDir, args...)
	rep.AckedTurns, rep.AckedKVPuts = len(run.turns), len(run.blobs)
	rep.LostTurns, rep.LostKVBytes = verifyAcked(t, p2.addr, run.turns, run.blobs, -1)

	// A corrupt archive file: HEAD and GET agree (404 both), the rest
	// still reads.
	stop(t, p2)
	crashes = append(crashes, p2.crashes()...)
	if len(run.blobs) > 0 {
		corruptOneArchiveFile(t, filepath.Join(dataDir, "kv"))
		p3 := startProc(t, dataDir, args...)
		lostTurns, lostBytes := verifyAcked(t, p3.addr, nil, run.blobs, 1)
		rep.CorruptAgree = lostTurns == 0 && lostBytes == 0
		if !rep.CorruptAgree {
			run.fail("after corrupting one archive file: HEAD/GET disagree or more than that file was lost")
		}
		stop(t, p3)
		crashes = append(crashes, p3.crashes()...)
	}
	rep.Crashes = len(crashes)

	// Verdicts.
	if rep.LostTurns > 0 || rep.LostKVBytes > 0 {
		run.fail("lost %d acknowledged turns and %d acknowledged KV bytes across a restart", rep.LostTurns, rep.LostKVBytes)
	}
	for _, c := range crashes {
		run.fail("child output: %.300s", c)
	}
	if g := rep.After.Goroutines - rep.Before.Goroutines; g > 2*hostileWorkers+8 {
		run.fail("goroutines grew from %d to %d", rep.Before.Goroutines, rep.After.Goroutines)
	}
	if d := rep.After.FDs - rep.Before.FDs; d > 2*hostileWorkers+8 {
		run.fail("open files grew from %d to %d", rep.Before.FDs, rep.After.FDs)
	}
	rep.FailureSample = run.failures
	writeHostileReport(t, rep)
	if rep.Failures > 0 {
		t.Fatalf("%d failures, first ones:\n%s", rep.Failures, strings.Join(run.failures, "\n"))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func stop(t *testing.T, p *child) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("sidecar did not stop after SIGTERM")
	}
}

func writeHostileReport(t *testing.T, rep *hostileReport) {
	b, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("hostile report:\n%s", b)
	if path := os.Getenv("SIDECAR_HOSTILE_REPORT"); path != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			_ = os.WriteFile(path, b, 0o644)
		}
	}
}

// runWorkers fires hostile requests from hostileWorkers goroutines for d.
func runWorkers(t *testing.T, p *child, run *hostileRun, d time.Duration) {
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for w := 0; w < hostileWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			hw := &hostileWorker{w: w, rng: rng, addr: p.addr, run: run, seq: &run.seq}
			for time.Now().Before(deadline) {
				switch k := rng.IntN(20); {
				case k < 9:
					hw.faultRequest()
				case k < 12:
					hw.rowRequest()
				case k < 13:
					hw.kvPut()
				default:
					hw.fuzzRequest()
				}
			}
		}(w)
	}
	wg.Wait()
}
