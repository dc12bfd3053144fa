package launch_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
)

// The test binary doubles as the server: with LAUNCH_TEST=listen it
// accepts connections on the port in its last argument until killed; with
// LAUNCH_TEST=exit it writes a line and exits at once.
func TestMain(m *testing.M) {
	switch os.Getenv("LAUNCH_TEST") {
	case "exit":
		os.Stderr.WriteString("broken on purpose\n")
		os.Exit(3)
	case "listen":
		ln, err := net.Listen("tcp", "127.0.0.1:"+os.Args[len(os.Args)-1])
		if err != nil {
			os.Stderr.WriteString("bind: " + err.Error() + "\n")
			os.Exit(1)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			c.Close()
		}
	}
	os.Exit(m.Run())
}

func dials(_ context.Context, addr string) error {
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
	}
	return err
}

// options runs this binary in mode; ports records the port of each start.
func options(t *testing.T, mode string, ports *[]int) launch.Options {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "server.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return launch.Options{
		Name: "testserver", Binary: os.Args[0], Env: []string{"LAUNCH_TEST=" + mode},
		Output: f, LogPath: logPath, Ready: dials, BindError: "bind",
		Args: func(port int) []string {
			*ports = append(*ports, port)
			return []string{"-test.run=^$", strconv.Itoa(port)}
		},
	}
}

func TestStartKillRestartClose(t *testing.T) {
	var ports []int
	p, err := launch.Start(context.Background(), options(t, "listen", &ports))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.Running() || dials(context.Background(), p.Addr()) != nil {
		t.Fatal("not serving after Start")
	}
	p.Kill()
	if p.Running() {
		t.Fatal("running after Kill")
	}
	if err := p.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !p.Running() || len(ports) != 2 || ports[0] != ports[1] || p.Addr() != "127.0.0.1:"+strconv.Itoa(ports[0]) {
		t.Fatalf("running %v, ports %v, addr %s: a restart keeps the port", p.Running(), ports, p.Addr())
	}
	if n := strings.Count(p.LogTail(1<<20), "=== "); n != 2 {
		t.Fatalf("%d start lines in the log, want 2", n)
	}
	p.Stop()
	if p.Running() {
		t.Fatal("running after Stop")
	}
	p.Close()
	if err := p.Restart(context.Background()); err == nil || !strings.Contains(err.Error(), "after Close") {
		t.Fatalf("restart after Close: %v", err)
	}
}

func TestStartFailsWithTheLog(t *testing.T) {
	var ports []int
	_, err := launch.Start(context.Background(), options(t, "exit", &ports))
	if err == nil || !strings.Contains(err.Error(), "testserver: exited before it was ready") || !strings.Contains(err.Error(), "broken on purpose") {
		t.Fatalf("err = %v", err)
	}
	if _, err := launch.Start(context.Background(), launch.Options{Name: "x"}); err == nil {
		t.Fatal("options without Binary, Args and Ready accepted")
	}
}

func TestHTTPReady(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.Error(w, "loading", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	if err := launch.HTTPReady("/health")(context.Background(), addr); err != nil {
		t.Fatalf("200: %v", err)
	}
	if err := launch.HTTPReady("/other")(context.Background(), addr); err == nil || !strings.Contains(err.Error(), "HTTP 503") {
		t.Fatalf("503: %v", err)
	}
}

// TestRestartTrustsOnlyItsOwnChild: when another process took the port
// while the child was down, the answer on that port is not the child's; the
// restart fails with the child's bind error instead of reporting it ready.
func TestRestartTrustsOnlyItsOwnChild(t *testing.T) {
	var ports []int
	p, err := launch.Start(context.Background(), options(t, "listen", &ports))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Kill()
	foreign, err := net.Listen("tcp", p.Addr())
	if err != nil {
		t.Fatalf("take the port: %v", err)
	}
	defer foreign.Close()
	err = p.Restart(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "bind") {
		t.Fatalf("restart onto a port another process holds: %v; log:\n%s", err, p.LogTail(4096))
	}
}

// A connection to RefusedAddr is refused until it is closed, and no
// listener can take its port meanwhile.
func TestRefusedAddr(t *testing.T) {
	addr, closeFn, err := launch.RefusedAddr()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Fatalf("a connection to %s was accepted", addr)
		}
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("a listener took %s while it was held", addr)
	}
	closeFn()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the port is not free after close: %v", err)
	}
	ln.Close()
}
