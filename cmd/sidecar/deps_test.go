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
