package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// When the test binary runs with SIDECAR_BENCH_TEST_MAIN=1 it is
// sidecar-bench itself: tests run workloads as users run them, in a child
// process.
func TestMain(m *testing.M) {
	if os.Getenv("SIDECAR_BENCH_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// built is the sidecar binary the tests start, built once by sidecarBin.
var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// sidecarBin returns the path of the sidecar binary (cmd/sidecar), built
// on first use with the race detector when this test binary has it. The
// workloads start it as they start bin/sidecar.
func sidecarBin(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		gotool, err := exec.LookPath("go")
		if err != nil {
			built.err = fmt.Errorf("the go tool, to build the sidecar: %w", err)
			return
		}
		if built.dir, built.err = os.MkdirTemp("", "sidecar-bench-test-"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "sidecar")
		args := []string{"build", "-o", built.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command(gotool, append(args, "github.com/kvsidecar/kvsidecar/cmd/sidecar")...).CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("go build ./cmd/sidecar: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// benchCommand is sidecar-bench ARGS as a child process (this test binary
// as sidecar-bench), starting the sidecar of sidecarBin.
func benchCommand(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SIDECAR_BENCH_TEST_MAIN=1", sidecarBinaryEnv+"="+sidecarBin(t))
	cmd.SysProcAttr = launch.SysProcAttr()
	return cmd
}

// runBenchJSON runs `sidecar bench WHAT ARGS --json` as a user does (this
// test binary as sidecar-bench), decodes its report into r and returns what
// it wrote on stderr (its progress lines).
func runBenchJSON(t *testing.T, r any, what string, args ...string) string {
	t.Helper()
	cmd := benchCommand(t, append(append([]string{what}, args...), "--json")...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench %s: %v\n%s", what, err, stderr.String())
	}
	if err := json.Unmarshal(out, r); err != nil {
		t.Fatalf("bench %s --json printed %q: %v", what, tail(string(out), 300), err)
	}
	return stderr.String()
}

// startSidecar runs the sidecar of sidecarBin (`serve` on a free loopback
// port, data in a temporary folder, then args) and returns its address
// once /healthz answers. The test's cleanup stops it.
func startSidecar(t *testing.T, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "sidecar.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p, err := launch.Start(context.Background(), launch.Options{
		Name: "sidecar", Binary: sidecarBin(t),
		Args: func(port int) []string {
			return append([]string{"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--data-dir", filepath.Join(dir, "data")}, args...)
		},
		Output: f, LogPath: logPath,
		Ready: launch.HTTPReady("/healthz"), BindError: "address already in use",
	})
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		f.Close()
	})
	return p.Addr()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// The documented command, end to end: `sidecar bench ARGS` (the sidecar
// binary) runs sidecar-bench (this test binary, found on PATH) with ARGS,
// and tells it which sidecar to start: bench scale starts that binary.
func TestSidecarBenchForwardsToThisBinary(t *testing.T) {
	sc := sidecarBin(t)
	pathDir := t.TempDir()
	if err := os.Symlink(os.Args[0], filepath.Join(pathDir, "sidecar-bench")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(sc, "bench", "scale", "--batches", "4", "--turns", "1", "--clients", "2", "--returning", "-1",
		"--dir", dir, "--json")
	cmd.Env = append(os.Environ(), "SIDECAR_BENCH_TEST_MAIN=1", "PATH="+pathDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		sidecarBinaryEnv+"=") // the forward sets it, not this test
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sidecar bench scale: %v\n%s", err, tail(stderr.String(), 4000))
	}
	var r workload.ScaleReport
	if err := json.Unmarshal(out, &r); err != nil || len(r.Batches) != 1 || r.Batches[0].Held != 4 || r.Batches[0].Errors != 0 {
		t.Fatalf("report %+v (%v):\n%s", r, err, out)
	}
	// The sidecar the workload started is the binary that forwarded.
	if log, err := os.ReadFile(filepath.Join(dir, "sidecar.log")); err != nil || !strings.Contains(string(log), ": "+sc+" serve --listen") {
		t.Errorf("the workload did not start %s (%v):\n%s", sc, err, tail(string(log), 2000))
	}
}

func TestFindSidecar(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "sidecar-bench")
	found := func(name string) (string, error) { return "/on/path/" + name, nil }
	missing := func(string) (string, error) { return "", errors.New("not found") }
	check := func(env string, lookPath func(string) (string, error), want string) {
		t.Helper()
		got, err := findSidecar(env, exe, lookPath)
		if want == "" {
			if err == nil || !strings.Contains(err.Error(), sidecarBinaryEnv) || !strings.Contains(err.Error(), "make build") {
				t.Errorf("env %q: %q, %v; want a clear error", env, got, err)
			}
			return
		}
		if err != nil || got != want {
			t.Errorf("env %q: %q, %v; want %q", env, got, err, want)
		}
	}
	check("", missing, "")
	check("", found, "/on/path/sidecar")
	check("/my/sidecar", missing, "/my/sidecar")
	// A sidecar beside sidecar-bench comes before PATH; a file that is
	// not executable does not count.
	next := filepath.Join(dir, "sidecar")
	if err := os.WriteFile(next, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("", found, "/on/path/sidecar")
	if err := os.Chmod(next, 0o755); err != nil {
		t.Fatal(err)
	}
	check("", found, next)
	check("/my/sidecar", found, "/my/sidecar")
}
