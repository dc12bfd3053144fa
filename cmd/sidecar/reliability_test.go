package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// metric returns the value of an unlabelled metric of the running sidecar.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestSIGTERMEndsWithinGraceDuringTokenization reproduces issue 12 rows 1
// and 2 against the binary: a 30 MB one-word message (tokenized in
// quadratic time on main, holding the session) kept the process alive
// after SIGTERM. Now the count stops and the process exits within its
// grace.
func TestSIGTERMEndsWithinGraceDuringTokenization(t *testing.T) {
	up := newScriptedUpstream(t)
	sc := startChild(t, nil, "--upstream", up.URL, "--shutdown-timeout", "3s", "--window-tokens", "100000000", "--extract=false")
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": strings.Repeat("a", 30<<20)}}})
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+sc.addr+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("X-Session-ID", "word")
		req.Header.Set("Authorization", "Bearer k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	waitUntil(t, func() bool { return metric(t, sc.admin, "sidecar_http_in_flight_requests") >= 2 }) // it and /metrics
	start := time.Now()
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sc.done:
	case <-time.After(30 * time.Second): // liveness: grace 3 s
		t.Fatal("the sidecar did not exit after SIGTERM")
	}
	t.Logf("exited %v after SIGTERM (grace 3s)", time.Since(start).Round(time.Millisecond))
	if code := <-answered; code != 0 && code != http.StatusServiceUnavailable {
		t.Fatalf("the request in flight got %d", code)
	}
}

// TestSessionsUnderUlimit1024 reproduces issue 12 row 11 against the
// binary: under `ulimit -n 1024` a third of the requests past ~1,000
// sessions skipped memory ("too many open files") while clients got 200.
// Now open logs follow the limit and no request skips memory.
func TestSessionsUnderUlimit1024(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("ulimit through sh")
	}
	up := newScriptedUpstream(t)
	dataDir := t.TempDir()
	cmd := exec.Command("sh", "-c", `ulimit -n 1024 && exec "$0" "$@"`, os.Args[0], "serve", "--listen", "127.0.0.1:0",
		"--data-dir", dataDir, "--upstream", up.URL, "--extract=false")
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	sc := startCmd(t, cmd, "")
	const sessions, workers = 2000, 16
	var mu sync.Mutex
	codes := map[int]int{}
	jobs := make(chan int)
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				req, _ := http.NewRequest(http.MethodPost, "http://"+sc.addr+"/v1/chat/completions",
					strings.NewReader(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello %d"}]}`, i)))
				req.Header.Set("X-Session-ID", fmt.Sprintf("s%d", i))
				req.Header.Set("Authorization", "Bearer k")
				code := 0
				if resp, err := client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		}()
	}
	for i := range sessions {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if codes[200] != sessions {
		t.Fatalf("answers %v", codes)
	}
	if n := metric(t, sc.admin, "sidecar_memory_bypassed_total"); n != 0 {
		t.Fatalf("%v requests skipped memory", n)
	}
	if n := metric(t, sc.admin, "sidecar_memory_turns_total"); n != sessions {
		t.Fatalf("%v turns went through memory, want %d", n, sessions)
	}
	if open, max := metric(t, sc.admin, "sidecar_memory_open_files"), metric(t, sc.admin, "sidecar_memory_open_files_max"); open > max || max != 256 {
		t.Fatalf("open logs %v, bound %v (want 256 under ulimit 1024)", open, max)
	}
}
