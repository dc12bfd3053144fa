package main

// The hostile harness (issue 12): the sidecar binary against a
// fault-injecting upstream (internal/faultup) and hostile clients — the
// issue's rows, requests that meet every upstream fault, and random
// methods, paths, headers and bodies — for a bounded time. It asserts no
// 5xx that is the sidecar's fault, no panic or data race in the child's
// output, no goroutine or fd growth, shutdown within its grace, and
// nothing acknowledged lost across a restart and across kill -9.
//
// `make test` runs it for a few seconds; `make test-hostile` for a minute
// with a report (SIDECAR_HOSTILE_DURATION, SIDECAR_HOSTILE_REPORT).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvsidecar/kvsidecar/internal/faultup"
)

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
	m := scrape(t, p.addr)
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
		if scrape(t, p.addr)["sidecar_http_in_flight_requests"] > 1 {
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
	up := faultup.New(faultup.Options{StallFor: 4 * time.Second, HugeBytes: 3 << 20, SlowGap: 30 * time.Millisecond})
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = up.Serve(uln) }()
	t.Cleanup(func() { _ = up.Close() })
	upstream := "http://" + uln.Addr().String()

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
	rep.Shutdown.OpenStream = int(scrape(t, p.addr)["sidecar_http_in_flight_requests"]) - 1
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

type hostileWorker struct {
	w    int
	rng  *rand.Rand
	addr string
	run  *hostileRun
	seq  *atomic.Int64
}

// faultRequest sends a well-formed chat or completions request that meets
// one upstream fault and checks the outcome a client must see.
func (hw *hostileWorker) faultRequest() {
	rng := hw.rng
	f := faultup.All[rng.IntN(len(faultup.All))]
	stream := rng.IntN(2) == 0
	chat := rng.IntN(5) > 0
	n := hw.seq.Add(1)
	user := fmt.Sprintf("w%d says hello number %d", hw.w, n)
	hdr := [][2]string{{"X-Fault", string(f)}, {"Content-Type", "application/json"}}
	key, session := "", ""
	switch rng.IntN(4) {
	case 0: // stateless
	case 1: // anonymous with a session id: stateless too
		hdr = append(hdr, [2]string{"X-Session-ID", "anon"})
	default: // a tenant's session, owned by this worker
		key, session = fmt.Sprintf("key-%d", hw.w%3), fmt.Sprintf("w%d-s%d", hw.w, rng.IntN(3))
		hdr = append(hdr, [2]string{"Authorization", "Bearer " + key}, [2]string{"X-Session-ID", session}, [2]string{"X-Session-Mode", "append"})
	}
	path, body := "/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, user)
	if !chat {
		path, body = "/v1/completions", fmt.Sprintf(`{"model":"m","stream":%v,"prompt":%q}`, stream, user)
	}
	kind := fmt.Sprintf("fault %s stream=%v", f, stream)
	hw.run.count(hw.run.rep.Inputs, "upstream fault")
	r, err := rawDo(hw.addr, buildRequest("POST", path, hdr, []byte(body)), "POST", 30*time.Second)
	if err != nil {
		hw.run.count(hw.run.rep.NoResponse, "upstream fault")
		hw.run.fail("%s: no answer: %v", kind, err)
		return
	}
	want := faultup.Expect(f, stream)
	cause := "sidecar"
	code := errorCode(r.body)
	switch {
	case r.header.Get("X-Faultup") != "":
		cause = "upstream status passed through (injected)"
	case want == faultup.Broken && (strings.HasPrefix(code, "upstream_") || code == "upstream_timeout"):
		cause = "upstream fault (injected): " + code
	}
	hw.run.seen(r, cause)
	if r.status >= 500 && cause == "sidecar" {
		hw.run.fail("%s: %d %.200s", kind, r.status, r.body)
		return
	}
	switch want {
	case faultup.Clean:
		if r.status != 200 || r.readErr != nil {
			hw.run.fail("%s: want a whole answer, got %d %v %.200q", kind, r.status, r.readErr, r.body)
			return
		}
		if stream && !bytes.HasSuffix(r.body, []byte("data: [DONE]\n\n")) {
			hw.run.fail("%s: stream did not end with [DONE]: %.300q", kind, r.body)
			return
		}
		if session != "" && chat {
			reply := "the quick brown fox"
			if f == faultup.HugeEvent {
				return // a 2 MiB reply: checked by content elsewhere
			}
			hw.run.mu.Lock()
			hw.run.turns = append(hw.run.turns, ackedTurn{key, session, user, reply})
			hw.run.mu.Unlock()
		}
	case faultup.Broken:
		if r.status == 200 {
			if r.readErr == nil || !stream || !bytes.Contains(r.body, []byte("event: error")) || bytes.Contains(r.body, []byte("data: [DONE]")) {
				hw.run.fail("%s: a broken upstream reached the client as %d (read error %v): %.300q", kind, r.status, r.readErr, r.body)
			}
			return
		}
		if r.status != 502 && r.status != 504 || !strings.HasPrefix(code, "upstream_") {
			hw.run.fail("%s: want 502/504 upstream_*, got %d %.200s", kind, r.status, r.body)
		}
	case faultup.Passed:
		wantStatus := map[faultup.Fault]int{faultup.Status500: 500, faultup.Status429: 429}[f]
		if wantStatus == 0 {
			wantStatus = 200
		}
		if r.status != wantStatus {
			hw.run.fail("%s: want the upstream's %d, got %d %.200s", kind, wantStatus, r.status, r.body)
		}
	}
}

// kvPut stores a random blob under the worker's tenant and remembers it
// once acknowledged.
func (hw *hostileWorker) kvPut() {
	rng := hw.rng
	data := make([]byte, 2*(1+rng.IntN(32<<10)))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	key, ns, name := fmt.Sprintf("key-%d", hw.w%3), "ns"+strconv.Itoa(hw.w), fmt.Sprintf("blk/%d", hw.seq.Add(1))
	hw.run.count(hw.run.rep.Inputs, "kv put")
	r, err := rawDo(hw.addr, buildRequest("PUT", "/v1/kv/"+ns+"/"+name, [][2]string{{"Authorization", "Bearer " + key}, {"X-KV-Dtype", "f16"},
		{"X-KV-Shape", strconv.Itoa(len(data) / 2)}}, data), "PUT", 30*time.Second)
	if err != nil {
		hw.run.count(hw.run.rep.NoResponse, "kv put")
		hw.run.fail("kv put: %v", err)
		return
	}
	hw.run.seen(r, "sidecar")
	if r.status != 201 {
		hw.run.fail("kv put: %d %.200s", r.status, r.body)
		return
	}
	hw.run.mu.Lock()
	hw.run.blobs = append(hw.run.blobs, ackedBlob{key, ns, name, data})
	hw.run.mu.Unlock()
}

// rowRequest sends one of the reproductions and checks it.
func (hw *hostileWorker) rowRequest() {
	rng := hw.rng
	auth := [2]string{"Authorization", "Bearer key-rows"}
	type check func(r *rawResp) string
	want4xx := func(r *rawResp) string {
		if r.status < 400 || r.status >= 500 || bytes.Contains(r.body, []byte("fault upstream")) {
			return fmt.Sprintf("want a 4xx from the sidecar, got %d %.200s", r.status, r.body)
		}
		return ""
	}
	wantStatus := func(s int) check {
		return func(r *rawResp) string {
			if r.status != s {
				return fmt.Sprintf("want %d, got %d %.200s", s, r.status, r.body)
			}
			return ""
		}
	}
	cases := []struct {
		row          string
		method, path string
		hdr          [][2]string
		body         string
		check        check
	}{
		{"5", "PUT", "/v1/kv/%2e%2e/key", [][2]string{auth}, "ab", want4xx},
		{"5", "PUT", "/v1/kv/ns/../../etc/passwd", [][2]string{auth}, "ab", want4xx},
		{"5", "GET", "/v1/sessions/../../etc/passwd", [][2]string{auth}, "", want4xx},
		{"5", "DELETE", "/v1//kv/ns/key", [][2]string{auth}, "", want4xx},
		{"5", "GET", "/v1/pool%2F..%2Fx", [][2]string{auth}, "", want4xx},
		{"5", "GET", "/v1/sessions", [][2]string{auth}, "", want4xx},
		{"7", "GET", "/v1/sessions/w0-s0", nil, "", wantStatus(401)},
		{"7", "DELETE", "/v1/sessions/w1-s0", [][2]string{{"Authorization", "Bearer"}}, "", wantStatus(401)},
		{"7", "GET", "/v1/pool", [][2]string{{"Authorization", ""}}, "", wantStatus(401)},
		{"7", "GET", "/v1/kv/ns0/blk%2F1", nil, "", wantStatus(401)},
		{"8", "PUT", "/v1/kv/ns/shape", [][2]string{auth, {"X-KV-Shape", "1099511627776,16777216"}}, "", wantStatus(400)},
		{"8", "PUT", "/v1/kv/ns/shape", [][2]string{auth, {"X-KV-Dtype", "f16"}, {"X-KV-Shape", "1099511627776,16777216"}}, "", wantStatus(400)},
		{"4", "POST", "/v1/chat/completions", [][2]string{auth, {"X-Fault", "stop"}, {"X-Session-ID", "rows-stop"}},
			`{"stream":true,"messages":[{"role":"user","content":"cut me"}]}`, func(r *rawResp) string {
				if r.readErr == nil || !bytes.Contains(r.body, []byte("upstream_stream_incomplete")) {
					return fmt.Sprintf("a stream without [DONE] ended as %d %v %.200q", r.status, r.readErr, r.body)
				}
				return ""
			}},
	}
	c := cases[rng.IntN(len(cases))]
	hw.run.count(hw.run.rep.Inputs, "issue row "+c.row)
	r, err := rawDo(hw.addr, buildRequest(c.method, c.path, c.hdr, []byte(c.body)), c.method, 30*time.Second)
	if err != nil {
		hw.run.count(hw.run.rep.NoResponse, "issue row "+c.row)
		hw.run.fail("row %s %s %s: no answer: %v", c.row, c.method, c.path, err)
		return
	}
	hw.run.seen(r, "sidecar")
	if msg := c.check(r); msg != "" {
		hw.run.fail("row %s %s %s: %s", c.row, c.method, c.path, msg)
	}
}

var (
	fuzzMethods  = []string{"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS", "TRACE", "get", "PROPFIND", "X"}
	fuzzPrefixes = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/sessions/", "/v1/kv/",
		"/v1/pool", "/v1/pool/", "/v1/", "/v1", "/", "/healthz", "/readyz", "/metrics", "/v2/x", "*", "http://h/v1/models", "/v1/files/"}
	fuzzSegments = []string{"", "a", "ns", "k", "..", ".", "%2e%2e", "%2E", "%2F", "%2f..%2f", "%00", "%", "%zz", "%ff", "é", "%C3%A9",
		"memory", "kv", "sessions", "fz-s0", ";x", "a?b=c", "#f", "\\..\\", "~", strings.Repeat("a", 300), strings.Repeat("%41", 200)}
	// Header values by name. Authorization and session ids come from
	// short lists so that the sessions a run touches are the ones warmUp
	// opens first (each loaded session holds its log open). None is a
	// session whose turns the workers check ("w*-s*"): the fuzz may
	// delete what it names.
	fuzzAuth     = []string{"", "Bearer", "Bearer ", "Bearer key-0", "Bearer key-1", "Basic dTpw", "bearer\tkey-0"}
	fuzzSessions = []string{"", "..", ".", "fz-s0", "é ☃", "a/b", strings.Repeat("s", 256), strings.Repeat("s", 257), "x\x01y", "pk0"}
	fuzzHeaders  = map[string][]string{
		"X-Session-Mode":    {"", "append", "full", "garbage"},
		"X-KV-Dtype":        {"", "f16", "bf16", "q8", "f32", "f64", "F16"},
		"X-KV-Shape":        {"", "1,2,3", "-1", "0", "1099511627776,16777216", "9223372036854775807", "4,", ",", "1,1,1,1,1,1,1,1,1,1"},
		"Content-Type":      {"", "application/json", "text/plain", "multipart/form-data; boundary=x", "application/octet-stream"},
		"Accept-Encoding":   {"gzip", "br", "identity", "*"},
		"Range":             {"bytes=0-1", "bytes=-5", "x"},
		"X-Forwarded-For":   {"1.2.3.4", strings.Repeat("v", 2000)},
		"Cookie":            {"a=b", "é\u00a0"},
		"Expect":            {"100-continue"},
		"Transfer-Encoding": {"chunked", "gzip"},
		"Upgrade":           {"websocket", "h2c"},
	}
	fuzzHeaderNames = []string{"X-Session-Mode", "X-KV-Dtype", "X-KV-Shape", "Content-Type", "Accept-Encoding", "Range",
		"X-Forwarded-For", "Cookie", "Expect", "Transfer-Encoding", "Upgrade"}
)

// warmUp sends one chat request for every tenant and session id the
// workers use, so session logs are open before the baseline is taken.
func warmUp(t *testing.T, p *child) {
	t.Helper()
	var ids []string
	for _, id := range fuzzSessions {
		ids = append(ids, id, "pk0", "pk1", "pk2", "rows-stop")
	}
	for w := 0; w < hostileWorkers; w++ {
		for i := 0; i < 3; i++ {
			ids = append(ids, fmt.Sprintf("w%d-s%d", w, i))
		}
	}
	for _, auth := range append(fuzzAuth, "Bearer key-2", "Bearer key-rows") {
		for _, id := range ids {
			if id == "" || strings.ContainsRune(id, 1) || len(id) > 256 {
				continue
			}
			hdr := [][2]string{{"Authorization", auth}, {"X-Session-ID", id}, {"X-Session-Mode", "append"}}
			r, err := rawDo(p.addr, buildRequest("POST", "/v1/chat/completions", hdr, []byte(`{"model":"m","messages":[{"role":"user","content":"warm up"}]}`)), "POST", 30*time.Second)
			if err != nil || r.status != 200 {
				t.Fatalf("warm-up %q %q: %v %+v", auth, id, err, r)
			}
		}
	}
}

// fuzzRequest fires a random request; the sidecar must answer without a
// 5xx of its own and without hanging. malformed requests (bad request
// line, bad headers) may be refused by closing the connection.
func (hw *hostileWorker) fuzzRequest() {
	rng := hw.rng
	method := fuzzMethods[rng.IntN(len(fuzzMethods))]
	path := fuzzPrefixes[rng.IntN(len(fuzzPrefixes))]
	for i := rng.IntN(4); i > 0; i-- {
		if !strings.HasSuffix(path, "/") {
			path += "/"
		}
		path += fuzzSegments[rng.IntN(len(fuzzSegments))]
	}
	malformed := strings.ContainsAny(path, " \\#") || path == ""
	var hdr [][2]string
	if rng.IntN(4) > 0 {
		hdr = append(hdr, [2]string{"Authorization", fuzzAuth[rng.IntN(len(fuzzAuth))]})
	}
	if rng.IntN(2) == 0 {
		hdr = append(hdr, [2]string{"X-Session-ID", fuzzSessions[rng.IntN(len(fuzzSessions))]})
	}
	for i := rng.IntN(4); i > 0; i-- {
		name := fuzzHeaderNames[rng.IntN(len(fuzzHeaderNames))]
		vals := fuzzHeaders[name]
		if name == "Transfer-Encoding" || name == "Expect" || name == "Upgrade" {
			malformed = true // framing this raw client does not follow
		}
		hdr = append(hdr, [2]string{name, vals[rng.IntN(len(vals))]})
	}
	body := fuzzBody(rng)
	if rng.IntN(50) == 0 {
		body = bytes.Repeat([]byte("x"), 1<<20+rng.IntN(1000)) // over the body limit
		malformed = true                                       // the server may close before reading it all
	}
	hw.run.count(hw.run.rep.Inputs, "fuzz")
	timeout := 30 * time.Second
	if malformed {
		// The sidecar may rightly wait for body bytes this client never
		// sends (chunked framing, 100-continue): no answer is no failure.
		timeout = 3 * time.Second
	}
	r, err := rawDo(hw.addr, buildRequest(method, path, hdr, body), method, timeout)
	if err != nil {
		hw.run.count(hw.run.rep.NoResponse, "fuzz")
		if !malformed {
			hw.run.fail("fuzz %s %.200q %.300q: no answer: %v", method, path, hdr, err)
		}
		return
	}
	hw.run.seen(r, "sidecar")
	if r.status >= 500 {
		hw.run.fail("fuzz %s %.200q %.300q body %.100q: %d %.300s", method, path, hdr, body, r.status, r.body)
	}
}

// fuzzBody returns a random body: a chat request (valid or mutated),
// JSON of the wrong shape, or random bytes.
func fuzzBody(rng *rand.Rand) []byte {
	switch rng.IntN(6) {
	case 0:
		return nil
	case 1:
		b := make([]byte, rng.IntN(512))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	case 2:
		return []byte([]string{`[]`, `{}`, `null`, `"x"`, `{"messages":null}`, `{"messages":{}}`, `{"messages":[null]}`,
			`{"messages":[{"role":5}]}`, `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, `{"value":1}`,
			strings.Repeat("[", 20000), `{"stream":true,"messages":[{"role":"user","content":"x"}],"n":3}`,
			`{"prompt":[1,2,3]}`, `{"input":""}`, `{"model":"` + strings.Repeat("m", 5000) + `"}`}[rng.IntN(15)])
	}
	var msgs []string
	for i := rng.IntN(30); i >= 0; i-- {
		role := []string{"user", "assistant", "system", "tool", "developer", "", "USER"}[rng.IntN(7)]
		var content string
		switch rng.IntN(4) {
		case 0:
			content = strconv.Quote(strings.Repeat("word ", rng.IntN(200)))
		case 1:
			content = `[{"type":"text","text":"part"},{"type":"image_url","image_url":{"url":"data:x"}}]`
		case 2:
			content = "null"
		default:
			content = strconv.Quote(fmt.Sprintf("hello %d é ☃ %s", rng.IntN(1000), strings.Repeat("x", rng.IntN(1500))))
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":%s}`, role, content))
	}
	b := []byte(fmt.Sprintf(`{"model":"m","stream":%v,"messages":[%s],"prompt_cache_key":"pk%d"}`, rng.IntN(2) == 0, strings.Join(msgs, ","), rng.IntN(3)))
	if rng.IntN(3) == 0 && len(b) > 0 { // mutate
		for i := rng.IntN(4) + 1; i > 0; i-- {
			switch j := rng.IntN(len(b)); rng.IntN(3) {
			case 0:
				b[j] = byte(rng.Uint32())
			case 1:
				b = b[:j]
			default:
				b = append(b[:j], append([]byte(`"},{`), b[j:]...)...)
			}
			if len(b) == 0 {
				break
			}
		}
	}
	return b
}

// verifyAcked reads every acknowledged turn and blob from a (restarted)
// sidecar. It returns the turns missing and the blob bytes lost; with
// allowMissing ≥ 0, exactly that many blobs may answer 404 to both HEAD and
// GET (files the test corrupted on purpose).
func verifyAcked(t *testing.T, addr string, turns []ackedTurn, blobs []ackedBlob, allowMissing int) (lostTurns int, lostBytes int64) {
	t.Helper()
	type view struct {
		Messages []struct {
			Role, Content string
			Partial       bool
		}
	}
	bySession := map[[2]string][]ackedTurn{}
	for _, tn := range turns {
		k := [2]string{tn.key, tn.session}
		bySession[k] = append(bySession[k], tn)
	}
	for k, ts := range bySession {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/sessions/"+k[1], nil)
		req.Header.Set("Authorization", "Bearer "+k[0])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var v view
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = json.Unmarshal(b, &v)
		for _, tn := range ts {
			found := false
			for i := 0; i+1 < len(v.Messages); i++ {
				if v.Messages[i].Role == "user" && v.Messages[i].Content == tn.user {
					m := v.Messages[i+1]
					found = m.Role == "assistant" && m.Content == tn.reply && !m.Partial
					break
				}
			}
			if !found {
				lostTurns++
				if lostTurns <= 5 {
					t.Errorf("acknowledged turn lost: session %s/%s user %q (status %d)", k[0], k[1], tn.user, resp.StatusCode)
				}
			}
		}
	}
	missing := 0
	for _, bl := range blobs {
		url := "http://" + addr + "/v1/kv/" + bl.ns + "/" + bl.name
		head, _ := http.NewRequest(http.MethodHead, url, nil)
		head.Header.Set("Authorization", "Bearer "+bl.key)
		hr, err := http.DefaultClient.Do(head)
		if err != nil {
			t.Fatal(err)
		}
		hr.Body.Close()
		get, _ := http.NewRequest(http.MethodGet, url, nil)
		get.Header.Set("Authorization", "Bearer "+bl.key)
		gr, err := http.DefaultClient.Do(get)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(gr.Body)
		gr.Body.Close()
		switch {
		case gr.StatusCode == 200 && hr.StatusCode == 200 && bytes.Equal(got, bl.data) && hr.ContentLength == int64(len(bl.data)):
		case allowMissing >= 0 && gr.StatusCode == 404 && hr.StatusCode == 404:
			missing++
		default:
			lostBytes += int64(len(bl.data))
			t.Errorf("acknowledged blob %s/%s: HEAD %d (length %d), GET %d with %d bytes (want %d)",
				bl.ns, bl.name, hr.StatusCode, hr.ContentLength, gr.StatusCode, len(got), len(bl.data))
		}
	}
	if allowMissing >= 0 && missing != allowMissing {
		t.Errorf("%d blobs missing, want %d", missing, allowMissing)
		lostBytes++
	}
	return lostTurns, lostBytes
}

// corruptOneArchiveFile flips one payload byte of one archive file.
func corruptOneArchiveFile(t *testing.T, dir string) {
	t.Helper()
	var files []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.Contains(p, "quarantine") && !strings.HasSuffix(p, ".tmp") {
			if fi, _ := d.Info(); fi != nil && fi.Size() > 256 {
				files = append(files, p)
			}
		}
		return nil
	})
	if len(files) == 0 {
		t.Fatal("no archive file to corrupt")
	}
	sort.Strings(files)
	f := files[len(files)/2]
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-16] ^= 0xa5
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHostileAckedTurnsSurviveKill9: clients run chat turns (streamed and
// not, through openai-go) and KV PUTs; the sidecar is killed with SIGKILL
// the moment a reply is acknowledged, then restarted on the same data:
// every acknowledged turn's reply is in GET /v1/sessions/{id} and every
// acknowledged blob reads byte for byte (issue 12 row 15).
func TestHostileAckedTurnsSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary through kill -9 and restarts")
	}
	up := faultup.New(faultup.Options{})
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = up.Serve(uln) }()
	t.Cleanup(func() { _ = up.Close() })
	dataDir := t.TempDir()
	args := []string{"--upstream", "http://" + uln.Addr().String()}
	rounds := 3
	var turns []ackedTurn
	var blobs []ackedBlob
	for round := 0; round < rounds; round++ {
		p := startProc(t, dataDir, args...)
		var (
			mu     sync.Mutex
			killed atomic.Bool
			acks   int
			wg     sync.WaitGroup
		)
		// kill ends the process right after an acknowledgement, once
		// enough turns went through.
		ack := func(tn *ackedTurn, bl *ackedBlob) {
			mu.Lock()
			defer mu.Unlock()
			if killed.Load() {
				return // acknowledged after the kill: cannot be
			}
			if tn != nil {
				turns = append(turns, *tn)
			}
			if bl != nil {
				blobs = append(blobs, *bl)
			}
			acks++
			if tn != nil && acks >= 20 {
				killed.Store(true)
				_ = p.cmd.Process.Kill()
			}
		}
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				key := fmt.Sprintf("k%d", w%2)
				session := fmt.Sprintf("r%d-w%d", round, w)
				client := openai.NewClient(option.WithBaseURL("http://"+p.addr+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0),
					option.WithHeader("X-Session-ID", session), option.WithHeader("X-Session-Mode", "append"))
				rng := rand.New(rand.NewPCG(uint64(w), uint64(round)))
				for i := 0; !killed.Load(); i++ {
					user := fmt.Sprintf("round %d worker %d turn %d", round, w, i)
					params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(user)}}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					var reply string
					var err error
					if rng.IntN(2) == 0 {
						s := client.Chat.Completions.NewStreaming(ctx, params)
						for s.Next() {
							if len(s.Current().Choices) > 0 {
								reply += s.Current().Choices[0].Delta.Content
							}
						}
						err = s.Err()
					} else {
						var c *openai.ChatCompletion
						if c, err = client.Chat.Completions.New(ctx, params); err == nil && len(c.Choices) > 0 {
							reply = c.Choices[0].Message.Content
						}
					}
					cancel()
					if err == nil {
						ack(&ackedTurn{key, session, user, reply}, nil)
					}
					if i%3 == 0 && !killed.Load() {
						data := make([]byte, 2*(1+rng.IntN(16<<10)))
						for j := range data {
							data[j] = byte(rng.Uint32())
						}
						name := fmt.Sprintf("r%d/w%d/%d", round, w, i)
						req, _ := http.NewRequest(http.MethodPut, "http://"+p.addr+"/v1/kv/crash/"+name, bytes.NewReader(data))
						req.Header.Set("Authorization", "Bearer "+key)
						if resp, err := http.DefaultClient.Do(req); err == nil {
							resp.Body.Close()
							if resp.StatusCode == 201 {
								ack(nil, &ackedBlob{key, "crash", name, data})
							}
						}
					}
				}
			}(w)
		}
		wg.Wait()
		<-p.done
		if c := p.crashes(); len(c) > 0 {
			t.Fatalf("child output: %q", c)
		}
	}
	p := startProc(t, dataDir, args...)
	lostTurns, lostBytes := verifyAcked(t, p.addr, turns, blobs, -1)
	t.Logf("kill -9 ×%d: %d acknowledged turns, %d acknowledged blobs; lost %d turns, %d bytes", rounds, len(turns), len(blobs), lostTurns, lostBytes)
	if lostTurns > 0 || lostBytes > 0 {
		t.Fatalf("lost %d acknowledged turns and %d bytes across kill -9", lostTurns, lostBytes)
	}
}

// TestHostileMemoryRows reproduces against the binary the issue 12 rows
// that live in session memory and are not covered by reliability_test.go
// (rows 2 and 11 are): a long word, a one-word reply followed by another
// turn and SIGTERM, a damaged log record, duplicate units.
func TestHostileMemoryRows(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	up := faultup.New(faultup.Options{LongWordBytes: 100 << 10})
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = up.Serve(uln) }()
	t.Cleanup(func() { _ = up.Close() })
	upstream := "http://" + uln.Addr().String()
	chat := func(t *testing.T, addr string, hdr [][2]string, body string, timeout time.Duration) *rawResp {
		t.Helper()
		t0 := time.Now()
		r, err := rawDo(addr, buildRequest("POST", "/v1/chat/completions", append(hdr, [2]string{"Content-Type", "application/json"}), []byte(body)), "POST", timeout)
		if err != nil {
			t.Fatalf("no answer within %s: %v", time.Since(t0).Round(time.Millisecond), err)
		}
		return r
	}
	session := func(id string) [][2]string {
		return [][2]string{{"Authorization", "Bearer mem"}, {"X-Session-ID", id}}
	}
	longWord := func(n int) string { return strings.Repeat("a", n) }

	// Time limits below only catch the quadratic behaviour (minutes on
	// main); linear counting takes well under a second.
	t.Run("row 1: a 400 KB word is counted in bounded time", func(t *testing.T) {
		p := startProc(t, t.TempDir(), "--upstream", upstream, "--window-tokens", "2000000")
		for _, body := range []string{
			fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, longWord(400<<10)),
			fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat("漢字", 400<<10/6)),
		} {
			t0 := time.Now()
			r := chat(t, p.addr, session("long"), body, 30*time.Second)
			if r.status >= 500 {
				t.Fatalf("%d %.200s", r.status, r.body)
			}
			t.Logf("answered %d in %s", r.status, time.Since(t0).Round(time.Millisecond))
		}
		if r := chat(t, p.addr, session("long"), `{"model":"m","messages":[{"role":"user","content":"still there?"}]}`, 10*time.Second); r.status != 200 {
			t.Fatalf("the session is stuck: %d", r.status)
		}
	})
	t.Run("row 3: a 400 KB one-word reply costs bounded time, before and after the answer", func(t *testing.T) {
		up.SetLongWordBytes(400 << 10)
		defer up.SetLongWordBytes(100 << 10)
		p := startProc(t, t.TempDir(), "--upstream", upstream, "--shutdown-timeout", "2s")
		for _, stream := range []bool{false, true} {
			id := fmt.Sprint("reply-", stream)
			t0 := time.Now()
			r := chat(t, p.addr, append(session(id), [2]string{"X-Fault", "long-word"}),
				fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"say it"}]}`, stream), 30*time.Second)
			if r.status != 200 || r.readErr != nil || len(r.body) < 400<<10 {
				t.Fatalf("stream=%v: %d %v, %d bytes", stream, r.status, r.readErr, len(r.body))
			}
			if r := chat(t, p.addr, append(session(id), [2]string{"X-Session-Mode", "append"}), `{"model":"m","messages":[{"role":"user","content":"and?"}]}`, 30*time.Second); r.status != 200 {
				t.Fatalf("next turn: %d", r.status)
			}
			t.Logf("stream=%v: both turns in %s", stream, time.Since(t0).Round(time.Millisecond))
		}
		t0 := time.Now()
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Fatal("still running 10 s after SIGTERM with a 2 s grace")
		}
		t.Logf("exited %s after SIGTERM", time.Since(t0).Round(time.Millisecond))
	})
	t.Run("row 9: one damaged record costs that record only", func(t *testing.T) {
		dir := t.TempDir()
		p := startProc(t, dir, "--upstream", upstream, "--extract=false")
		for i := 0; i < 20; i++ {
			if r := chat(t, p.addr, append(session("damaged"), [2]string{"X-Session-Mode", "append"}),
				fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"message number %d"}]}`, i), 10*time.Second); r.status != 200 {
				t.Fatalf("turn %d: %d", i, r.status)
			}
		}
		stop(t, p)
		var logs []string
		_ = filepath.WalkDir(filepath.Join(dir, "sessions"), func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && !strings.Contains(path, "quarantine") && strings.HasSuffix(path, ".log") {
				if fi, _ := d.Info(); fi != nil && fi.Size() > 2000 {
					logs = append(logs, path)
				}
			}
			return nil
		})
		if len(logs) != 1 {
			t.Fatalf("want the one session log, found %q", logs)
		}
		b, _ := os.ReadFile(logs[0])
		i := bytes.Index(b[len(b)/2:], []byte("message number")) + len(b)/2
		b[i+3] ^= 0x20
		_ = os.WriteFile(logs[0], b, 0o644)
		p = startProc(t, dir, "--upstream", upstream, "--extract=false")
		var v struct {
			Messages []struct{ Role, Content string }
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.addr+"/v1/sessions/damaged", nil)
		req.Header.Set("Authorization", "Bearer mem")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = json.Unmarshal(body, &v)
		if resp.StatusCode != 200 || len(v.Messages) < 39 {
			t.Fatalf("after one flipped byte: %d, %d of 40 messages kept", resp.StatusCode, len(v.Messages))
		}
		if r := chat(t, p.addr, append(session("damaged"), [2]string{"X-Session-Mode", "append"}), `{"model":"m","messages":[{"role":"user","content":"next"}]}`, 10*time.Second); r.status != 200 {
			t.Fatalf("chat after damage: %d", r.status)
		}
		if m := scrape(t, p.addr); m["sidecar_memory_bypassed_total"] != 0 {
			t.Fatalf("memory bypassed %v times", m["sidecar_memory_bypassed_total"])
		}
	})
	t.Run("row 12: identical requests make no duplicate units", func(t *testing.T) {
		p := startProc(t, t.TempDir(), "--upstream", upstream, "--extract=false")
		msgs := `{"role":"user","content":"tell me about the weather in spring"}`
		for i := 0; i < 50; i++ {
			if r := chat(t, p.addr, session("same"), `{"model":"m","messages":[`+msgs+`]}`, 10*time.Second); r.status != 200 {
				t.Fatalf("request %d: %d", i, r.status)
			}
		}
		var v struct{ Units []struct{ Content string } }
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.addr+"/v1/sessions/same/memory", nil)
		req.Header.Set("Authorization", "Bearer mem")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		seen := map[string]bool{}
		for _, u := range v.Units {
			if u.Content == "" || seen[u.Content] {
				t.Fatalf("%d units, duplicate or empty: %q", len(v.Units), u.Content)
			}
			seen[u.Content] = true
		}
	})
}
