package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKVTraceRecordsAccesses: with SIDECAR_KV_TRACE set, the KV store's
// accesses through the KV API land in the file as they happen (the
// process is killed, not stopped), keys hashed.
func TestKVTraceRecordsAccesses(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "kv.trace")
	sc := startChild(t, []string{"SIDECAR_KV_TRACE=" + trace}, "--upstream", "http://127.0.0.1:1")
	do := func(method, key string, body []byte) int {
		req, _ := http.NewRequest(method, "http://"+sc.addr+"/v1/kv/llama/"+key, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer trace")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := do(http.MethodPut, "secret-session-name", make([]byte, 64)); s != http.StatusCreated {
		t.Fatalf("PUT: %d", s)
	}
	if s := do(http.MethodGet, "secret-session-name", nil); s != http.StatusOK {
		t.Fatalf("GET: %d", s)
	}
	if s := do(http.MethodGet, "missing", nil); s != http.StatusNotFound {
		t.Fatalf("GET missing: %d", s)
	}
	if err := sc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-sc.done
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var ops []string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 4 || len(f[1]) != 16 {
			t.Fatalf("line %q", l)
		}
		ops = append(ops, f[0]+" "+f[2]+" "+f[3])
	}
	// The PUT's value is the blob and its small header; the GET is served
	// from memory; the miss has no size.
	if len(ops) != 3 || !strings.HasPrefix(ops[0], "p ") || !strings.HasPrefix(ops[1], "g ") ||
		strings.HasSuffix(ops[1], " none") || ops[2] != "g 0 none" || lines[0][2:18] != lines[1][2:18] {
		t.Fatalf("trace:\n%s", b)
	}
	if bytes.Contains(b, []byte("secret")) {
		t.Fatal("the trace holds a key as it is")
	}
}
