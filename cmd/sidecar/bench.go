package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// benchBinary is the program behind `sidecar bench`: the benchmark
// workloads are a second binary (cmd/sidecar-bench) so this one links none
// of their dependencies.
const benchBinary = "sidecar-bench"

// cmdBench implements `sidecar bench ARGS`: it replaces this process with
// the sidecar-bench next to this executable, else the one on PATH, run with
// the same ARGS and this executable in $SIDECAR_BINARY, so the sidecars a
// workload starts are this binary. It returns only when that fails.
func cmdBench(args []string) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar bench:", err)
		return 1
	}
	bin, err := findBench(self, exec.LookPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar bench:", err)
		return 1
	}
	// syscall.Exec keeps duplicate variables (the first wins): replace.
	env := []string{"SIDECAR_BINARY=" + self}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SIDECAR_BINARY=") {
			env = append(env, kv)
		}
	}
	err = syscall.Exec(bin, append([]string{bin}, args...), env)
	fmt.Fprintf(os.Stderr, "sidecar bench: run %s: %v\n", bin, err)
	return 1
}

// findBench answers the sidecar-bench file in self's folder, else what
// lookPath finds, else an error that says how to get one.
func findBench(self string, lookPath func(string) (string, error)) (string, error) {
	p := filepath.Join(filepath.Dir(self), benchBinary)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return p, nil
	}
	if p, err := lookPath(benchBinary); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("the benchmarks are a separate binary, %s, found neither next to %s nor on PATH: "+
		"build it with make build (bin/%s) or go build -o %s ./cmd/sidecar-bench", benchBinary, self, benchBinary,
		filepath.Join(filepath.Dir(self), benchBinary))
}
