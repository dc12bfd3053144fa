package gputest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNoCUDASkipsOrFails runs NoCUDA in a child test process, without and
// with $KVSIDECAR_REQUIRE_GPU=1: a skip, then a failure naming the reason.
func TestNoCUDASkipsOrFails(t *testing.T) {
	if os.Getenv("GPUTEST_CHILD") == "1" {
		NoCUDA(t, "no driver: %s", "libcuda.so.1 missing")
		return
	}
	for _, c := range []struct {
		require string
		fails   bool
		want    string
	}{{"", false, "--- SKIP"}, {"1", true, "--- FAIL"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNoCUDASkipsOrFails$", "-test.v")
		cmd.Env = append(os.Environ(), "GPUTEST_CHILD=1", RequireEnv+"="+c.require)
		out, err := cmd.CombinedOutput()
		if (err != nil) != c.fails || !strings.Contains(string(out), c.want) || !strings.Contains(string(out), "libcuda.so.1 missing") {
			t.Errorf("%s=%q: err %v\n%s", RequireEnv, c.require, err, out)
		}
	}
}
