package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
)

// sidecarBinaryEnv names the environment variable holding the sidecar
// binary the workloads start. `sidecar bench` sets it to its own
// executable, so `bin/sidecar bench sessions` measures bin/sidecar.
const sidecarBinaryEnv = "SIDECAR_BINARY"

// sidecarBinary finds the sidecar binary to start, as findSidecar says,
// for this process.
func sidecarBinary() (string, error) {
	exe, _ := os.Executable()
	return findSidecar(os.Getenv(sidecarBinaryEnv), exe, exec.LookPath)
}

// findSidecar answers env (the value of $SIDECAR_BINARY) when it is set,
// else a `sidecar` file in exe's folder, else what lookPath finds for
// "sidecar", else an error that says how to provide one.
func findSidecar(env, exe string, lookPath func(string) (string, error)) (string, error) {
	if env != "" {
		return env, nil
	}
	if exe != "" {
		p := filepath.Join(filepath.Dir(exe), "sidecar")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := lookPath("sidecar"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no sidecar binary to start: set $%s, or put sidecar next to %s or on PATH (make build builds both into bin/)", sidecarBinaryEnv, exe)
}

// sidecarCommand is the command line that starts a sidecar (the binary,
// then serve), for the workloads' SidecarCommand options.
func sidecarCommand() ([]string, error) {
	bin, err := sidecarBinary()
	if err != nil {
		return nil, err
	}
	return []string{bin, "serve"}, nil
}

// startDefaultSidecar runs `sidecar serve` with its defaults on a free
// loopback port before upstream, its data in dir, then extra (flags given
// after --), and returns once GET /healthz answers 200. Its log goes to
// log. SIDECAR_* variables of this environment are blanked for it: the
// flags given here are all it is told, as when bench memory ran serve in
// its own process. The caller stops it.
func startDefaultSidecar(ctx context.Context, upstream, dir string, extra []string, log io.Writer) (*launch.Process, error) {
	bin, err := sidecarBinary()
	if err != nil {
		return nil, err
	}
	var env []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "SIDECAR_") {
			env = append(env, name+"=")
		}
	}
	return launch.Start(ctx, launch.Options{
		Name: "bench: sidecar", Binary: bin,
		Args: func(port int) []string {
			return append([]string{"serve", "--listen", "127.0.0.1:" + strconv.Itoa(port), "--upstream", upstream,
				"--data-dir", dir}, extra...)
		},
		Env: env, Output: log,
		Ready: launch.HTTPReady("/healthz"), ReadyName: "answering /healthz", BindError: "address already in use",
	})
}
