package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The serving binary links nothing only a benchmark needs: no package under
// bench/ (the workloads of bench/workload, the launchers and test servers of
// bench/harness), and none of the modules the reference KV computer brings
// (gorgonia's tensor, gonum, arrow, protobuf). `sidecar bench` is a separate
// binary, cmd/sidecar-bench.
func TestServingBinaryLinksNoBenchmarkCode(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool, to list the binary's packages: %v", err)
	}
	out, err := exec.Command(gotool, "list", "-deps", "github.com/kvsidecar/kvsidecar/cmd/sidecar").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	banned := []string{"github.com/kvsidecar/kvsidecar/bench/", "gorgonia.org/", "gonum.org/",
		"github.com/apache/arrow/", "google.golang.org/protobuf/", "github.com/golang/protobuf/", "github.com/gogo/protobuf/"}
	pkgs := strings.Fields(string(out))
	for _, p := range pkgs {
		for _, b := range banned {
			if strings.HasPrefix(p+"/", b) {
				t.Errorf("cmd/sidecar links %s", p)
			}
		}
	}
	if len(pkgs) < 100 {
		t.Fatalf("go list -deps listed %d packages: %q", len(pkgs), out)
	}
}

// TestWiredOnlyInCmd: the admin listener (package admin) and the RESP
// store (package respstore) are wired in cmd/ alone: no package outside
// cmd/ (tests aside) imports admin, and none but admin, for the types of
// the console's RESP page, imports respstore; admin and proxy stand beside
// each other, neither importing the other.
func TestWiredOnlyInCmd(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool, to list the imports: %v", err)
	}
	const mod = "github.com/kvsidecar/kvsidecar/"
	out, err := exec.Command(gotool, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, imports := f[0], f[1:]
		if strings.HasPrefix(pkg, mod+"cmd/") {
			continue
		}
		seen++
		for _, imp := range imports {
			switch {
			case imp == mod+"admin":
				t.Errorf("%s imports admin: only cmd/ wires it", pkg)
			case imp == mod+"respstore" && pkg != mod+"admin":
				t.Errorf("%s imports respstore: only cmd/ wires it (and admin reads its Stats)", pkg)
			case imp == mod+"proxy" && pkg == mod+"admin":
				t.Errorf("admin imports proxy: it reaches the proxy through interfaces of its own")
			}
		}
	}
	if seen < 20 {
		t.Fatalf("go list listed %d packages outside cmd/: %q", seen, out)
	}
}
