package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `sidecar bench ARGS` runs the sidecar-bench it finds (here a script on
// PATH) with the same ARGS, its stdout, stderr and exit status, and tells
// it which sidecar binary to start: this one.
func TestBenchRunsSidecarBench(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho \"args: $*\"\necho \"sidecar: $SIDECAR_BINARY\"\necho oops >&2\nexit 3\n"
	if err := os.WriteFile(filepath.Join(dir, "sidecar-bench"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "bench", "sessions", "--json", "--sidecar-arg=--extract=false")
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1", "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"SIDECAR_BINARY=/elsewhere/sidecar") // replaced, not kept beside
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exit: %v, want status 3\n%s", err, stderr.String())
	}
	self, _ := filepath.EvalSymlinks(os.Args[0])
	want := "args: sessions --json --sidecar-arg=--extract=false\nsidecar: "
	if !strings.HasPrefix(string(out), want) || strings.TrimSpace(stderr.String()) != "oops" {
		t.Fatalf("stdout %q, stderr %q", out, stderr.String())
	}
	if got := strings.TrimSpace(strings.TrimPrefix(string(out), want)); got != self {
		t.Errorf("SIDECAR_BINARY=%q, want this binary %q", got, self)
	}
}

// Without a sidecar-bench, `sidecar bench` says what is missing and how to
// build it.
func TestBenchWithoutSidecarBench(t *testing.T) {
	cmd := exec.Command(os.Args[0], "bench", "kv")
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1", "PATH="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, stderr.String())
	}
	for _, want := range []string{"sidecar-bench", "make build", "./cmd/sidecar-bench"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("message lacks %q: %s", want, stderr.String())
		}
	}
}

// A sidecar-bench beside the sidecar binary comes before the one on PATH;
// a file there that is not executable does not count.
func TestFindBench(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "sidecar")
	onPath := func(name string) (string, error) { return "/on/path/" + name, nil }
	if got, err := findBench(self, onPath); err != nil || got != "/on/path/sidecar-bench" {
		t.Fatalf("%q, %v", got, err)
	}
	next := filepath.Join(dir, "sidecar-bench")
	if err := os.WriteFile(next, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := findBench(self, onPath); got != "/on/path/sidecar-bench" {
		t.Fatalf("not executable, yet %q", got)
	}
	if err := os.Chmod(next, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := findBench(self, onPath); err != nil || got != next {
		t.Fatalf("%q, %v; want %q", got, err, next)
	}
}
