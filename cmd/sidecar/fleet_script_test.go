package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver/redistest"
)

// freePorts returns n loopback ports nothing listens on (closed again:
// another process may take one meanwhile, which the script reports).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// fleetScript is scripts/fleet.sh with the tiny model (no MODEL argument),
// this test binary as the sidecar, on ports, its data under a folder
// given relative to the repository (as FLEET_DIR's default is).
func fleetScript(t *testing.T, ports []int) (*exec.Cmd, io.Reader) {
	t.Helper()
	p := llamatest.Require(t)
	redistest.Require(t)
	for _, tool := range []string{"bash", "curl", "redis-cli"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("scripts/fleet.sh needs %s: %v", tool, err)
		}
	}
	rel := filepath.Join("out", fmt.Sprintf("fleet-test-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(filepath.Join("../..", rel)) })
	cmd := exec.Command("bash", "scripts/fleet.sh")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1", "SIDECAR="+os.Args[0], "LLAMA_SERVER="+p.Server, "LLAMA_TINY_GGUF="+p.Script,
		"FLEET_DIR="+rel, "START_TIMEOUT=90", "REDIS_PORT="+strconv.Itoa(ports[0]),
		fmt.Sprintf("LLAMA_PORTS=%d %d", ports[1], ports[2]), fmt.Sprintf("SIDECAR_PORTS=%d %d", ports[3], ports[4]),
		fmt.Sprintf("ADMIN_PORTS=%d %d", ports[5], ports[6]))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever is left of the group
	})
	return cmd, out
}

// TestFleetScriptComesUpAndStops: make fleet's script with its defaults
// (but the ports: free ones) brings Redis, two llama-servers and two
// sidecars up; a session written through one sidecar is read through the
// other; SIGTERM stops every process.
func TestFleetScriptComesUpAndStops(t *testing.T) {
	t.Parallel() // waits on five processes: run beside the real-engine tests
	ports := freePorts(t, 7)
	cmd, out := fleetScript(t, ports)
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var seen []string
	deadline := time.After(3 * time.Minute)
	for up := false; !up; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("scripts/fleet.sh ended before the fleet was up: %v\n%s", cmd.Wait(), strings.Join(seen, "\n"))
			}
			seen = append(seen, l)
			up = strings.HasPrefix(l, "fleet up:")
		case <-deadline:
			t.Fatalf("no fleet up within 3 minutes:\n%s", strings.Join(seen, "\n"))
		}
	}
	a, b := fmt.Sprintf("http://127.0.0.1:%d", ports[3]), fmt.Sprintf("http://127.0.0.1:%d", ports[4])
	req, _ := http.NewRequest("POST", a+"/v1/chat/completions", strings.NewReader(`{"model":"tiny","max_tokens":4,"messages":[{"role":"user","content":"hello fleet"}]}`))
	req.Header.Set("Authorization", "Bearer sk-fleet")
	req.Header.Set("X-Session-ID", "fleet-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("chat through the first sidecar: %d %s", resp.StatusCode, body)
	}
	var v struct {
		Messages []struct{ Role, Content string }
	}
	waitUntil(t, func() bool {
		return getSession(t, b, "sk-fleet", "fleet-1", &v) == 200 && len(v.Messages) == 2
	})
	if v.Messages[0].Content != "hello fleet" {
		t.Errorf("the second sidecar reads %+v", v.Messages)
	}
	// Each sidecar's own metrics on the admin port the script gave it.
	for _, p := range ports[5:7] {
		if m := metricsText(t, fmt.Sprintf("127.0.0.1:%d", p)); !strings.Contains(m, "sidecar_http_request_bytes_total") {
			t.Errorf("no sidecar metrics on admin port %d", p)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("scripts/fleet.sh did not stop within 60s of SIGTERM")
	}
	for _, p := range ports {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p), time.Second); err == nil {
			c.Close()
			t.Errorf("port %d still answers after the script stopped", p)
		}
	}
}

// TestFleetScriptRefusesATakenPort: with a port held by another process
// (here one that answers /healthz and /readyz, as a sidecar would), the
// script stops at once, naming the port, and never says the fleet is up.
func TestFleetScriptRefusesATakenPort(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"status":"ok"}`) }))
	defer other.Close()
	taken := other.Listener.Addr().(*net.TCPAddr).Port
	ports := freePorts(t, 7)
	ports[4] = taken
	cmd, out := fleetScript(t, ports)
	b, _ := io.ReadAll(out)
	err := cmd.Wait()
	if err == nil || strings.Contains(string(b), "fleet up") || !strings.Contains(string(b), fmt.Sprintf("port %d on 127.0.0.1 is taken", taken)) {
		t.Fatalf("with port %d taken: %v\n%s", taken, err, b)
	}
}

// getSession reads GET /v1/sessions/{id} into v and returns the status.
func getSession(t *testing.T, base, key, id string, v any) int {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/v1/sessions/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("session %s: %v", b, err)
		}
	}
	return resp.StatusCode
}
