// Package gputest has the one helper the CUDA tests share: NoCUDA skips a
// test where no usable CUDA device is found, saying why, or fails it when
// $KVSIDECAR_REQUIRE_GPU is 1 (as scripts/gpu-test.sh sets on a GPU host),
// so that a GPU test that could not run is never counted as a pass there.
// Only tests import it; it imports nothing of this module (package gpu's
// own tests use it).
package gputest

import (
	"fmt"
	"os"
	"testing"
)

// RequireEnv, set to 1, turns NoCUDA's skip into a failure.
const RequireEnv = "KVSIDECAR_REQUIRE_GPU"

// NoCUDA ends t for the reason given (why CUDA is unusable here): a skip,
// or a failure when $KVSIDECAR_REQUIRE_GPU is 1.
func NoCUDA(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("a usable CUDA device is required ($%s=1): %s", RequireEnv, why)
	}
	t.Skipf("no usable CUDA on this host (set $%s=1 to fail instead): %s", RequireEnv, why)
}
