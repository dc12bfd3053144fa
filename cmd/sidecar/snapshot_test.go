package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/hctx"
)

// The snapshot commands refuse what they cannot do before calling anyone,
// and check a file whole on both sides of the wire.
func TestSnapshotCommandLine(t *testing.T) {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if r.Header.Get("Authorization") != "Bearer k" || r.Header.Get("X-User-ID") != "ann" || r.URL.EscapedPath() != "/v1/sessions/a%2Fb/snapshot" {
			w.WriteHeader(404)
			w.Write([]byte(`{"error":{"message":"no session","type":"not_found_error","code":"session_not_found"}}`))
			return
		}
		w.Write([]byte("not a snapshot"))
	}))
	defer srv.Close()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.hctx")
	if err := os.WriteFile(good, hctx.Append(nil, hctx.Section{Kind: hctx.KindManifest, Data: []byte(`{"session":"s","memory":{"messages":3}}`)}), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.hctx")
	if err := os.WriteFile(bad, []byte("HCTX and garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"snapshot"}, 2},
		{[]string{"snapshot", "help"}, 0},
		{[]string{"snapshot", "frobnicate"}, 2},
		{[]string{"snapshot", "export", "--url", srv.URL, "-o", filepath.Join(dir, "x")}, 2},                                                        // no --session
		{[]string{"snapshot", "export", "--url", srv.URL, "--session", "s"}, 2},                                                                     // no -o
		{[]string{"snapshot", "export", "--url", "ftp://x", "--session", "s", "-o", "x"}, 2},                                                        // bad URL
		{[]string{"snapshot", "import", "--url", srv.URL, "--session", "s"}, 2},                                                                     // no file
		{[]string{"snapshot", "import", "--url", srv.URL, "--session", "s", bad}, 1},                                                                // damaged: not sent
		{[]string{"snapshot", "export", "--url", srv.URL, "--session", "s", "-o", "-"}, 1},                                                          // 404
		{[]string{"snapshot", "export", "--url", srv.URL, "--session", "a/b", "--api-key", "k", "--user", "ann", "-o", filepath.Join(dir, "y")}, 1}, // a body that is no snapshot
		{[]string{"snapshot", "inspect", good}, 0},
		{[]string{"snapshot", "inspect", "--json", good}, 0},
		{[]string{"snapshot", "inspect", bad}, 1},
	} {
		if got := run(tc.args); got != tc.code {
			t.Errorf("sidecar %q: exit %d, want %d", tc.args, got, tc.code)
		}
	}
	if calls != 2 {
		t.Fatalf("the sidecar was called %d times, want 2 (the exports that got that far)", calls)
	}
	if _, err := os.Stat(filepath.Join(dir, "y")); !os.IsNotExist(err) {
		t.Fatalf("an export that did not check out wrote its file: %v", err)
	}
}
