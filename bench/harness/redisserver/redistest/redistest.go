// Package redistest has the test helpers around redisserver: Require finds
// redis-server (skipping, or failing in CI, when it is absent), Start runs
// one for the length of a test.
package redistest

import (
	"context"
	"os"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
)

// RequireEnv, set to 1 (as .ci/run does), turns Require's skip into a
// failure: CI always runs the tests against a real Redis.
const RequireEnv = "KVSIDECAR_REQUIRE_REDIS"

// Require returns the path of redis-server. When it is missing the test is
// skipped with the reason, or fails when $KVSIDECAR_REQUIRE_REDIS is 1.
func Require(t testing.TB) string {
	t.Helper()
	p, err := redisserver.Find()
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("redis-server required ($%s=1): %v", RequireEnv, err)
		}
		t.Skipf("no redis-server (apt-get install redis-server, or $%s=1 to fail instead): %v", RequireEnv, err)
	}
	return p
}

// Start runs a redis-server (after Require) that the test's cleanup
// closes; when the test failed the cleanup logs the end of the server's
// log first.
func Start(t testing.TB, o redisserver.Options) *redisserver.Server {
	t.Helper()
	if o.Binary == "" {
		o.Binary = Require(t)
	}
	s, err := redisserver.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("redis-server %s log ends:\n%s", s.Addr(), s.LogTail(2000))
		}
		s.Close()
	})
	return s
}
