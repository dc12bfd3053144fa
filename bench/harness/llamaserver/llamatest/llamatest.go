// Package llamatest has the test helpers around llamaserver: Require finds
// the real llama-server (skipping, or failing in CI, when it is absent),
// Model makes a tiny model, Start runs a server for the length of a test.
package llamatest

import (
	"context"
	"os"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
)

// RequireEnv, set to 1 (as .ci/run does), turns Require's skip into a
// failure: CI always runs the real-engine tests.
const RequireEnv = "KVSIDECAR_REQUIRE_LLAMA"

// Require returns the paths of llama-server, tiny_gguf.py and python3. When
// one is missing the test is skipped with the reason, or fails when
// $KVSIDECAR_REQUIRE_LLAMA is 1.
func Require(t testing.TB) llamaserver.Paths {
	t.Helper()
	p, err := llamaserver.Find()
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("real llama.cpp server required ($%s=1): %v", RequireEnv, err)
		}
		t.Skipf("no real llama.cpp server (set $%s, or $%s=1 to fail instead): %v", llamaserver.EnvServer, RequireEnv, err)
	}
	return p
}

// Model returns a cached tiny model made with args (see
// llamaserver.TinyModel), after Require.
func Model(t testing.TB, args ...int) string {
	t.Helper()
	p := Require(t)
	m, err := llamaserver.TinyModel(p, "", args...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Start runs a llama-server (after Require) that the test's cleanup
// closes; when the test failed the cleanup logs the end of the server's
// log first.
func Start(t testing.TB, o llamaserver.Options) *llamaserver.Server {
	t.Helper()
	p := Require(t)
	if o.Binary == "" {
		o.Binary = p.Server
	}
	if o.Model == "" {
		o.Model = Model(t)
	}
	s, err := llamaserver.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("llama-server %s log ends:\n%s", s.URL(), s.LogTail(3000))
		}
		s.Close()
	})
	return s
}
