package main

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestInspectReportsAndQuarantinesCorruptBlocks writes two KV blocks and a
// session through the binary, stops it, flips a byte in one block file and
// checks what `sidecar inspect --json` reports; the next start serves the
// intact block and never the corrupt one.
func TestInspectReportsAndQuarantinesCorruptBlocks(t *testing.T) {
	up := newScriptedUpstream(t)
	dir := t.TempDir()
	sc := startChild(t, nil, "--data-dir", dir, "--upstream", up.URL)
	for _, k := range []string{"a", "b"} {
		req, _ := http.NewRequest(http.MethodPut, "http://"+sc.addr+"/v1/kv/ns/"+k, bytes.NewReader(bytes.Repeat([]byte(k), 4096)))
		req.Header.Set("Authorization", "Bearer inspect")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("put %s: %v %v", k, resp, err)
		}
		resp.Body.Close()
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+sc.addr+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Session-ID", "s")
	req.Header.Set("Authorization", "Bearer inspect")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("chat: %v %v", resp, err)
	}
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-sc.done

	var files []string
	_ = filepath.WalkDir(filepath.Join(dir, "kv", "blocks"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 2 {
		t.Fatalf("archive holds %d files, want 2", len(files))
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(files[0], b, 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "inspect", "--json", dir)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	var r inspectReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("inspect output %s: %v", out, err)
	}
	if r.KV.Blocks != 1 || len(r.KV.Quarantined) != 1 || r.Sessions.Logs != 1 {
		t.Fatalf("inspect report %+v", r)
	}

	sc2 := startChild(t, nil, "--data-dir", dir, "--upstream", up.URL)
	okCount := 0
	for _, k := range []string{"a", "b"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+sc2.addr+"/v1/kv/ns/"+k, nil)
		req.Header.Set("Authorization", "Bearer inspect")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := new(bytes.Buffer)
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case 200:
			if !bytes.Equal(body.Bytes(), bytes.Repeat([]byte(k), 4096)) {
				t.Fatalf("block %s served with wrong bytes", k)
			}
			okCount++
		case 404:
		default:
			t.Fatalf("block %s: %d %s", k, resp.StatusCode, body)
		}
	}
	if okCount != 1 {
		t.Fatalf("%d blocks served after corrupting one of two", okCount)
	}
}

// TestInspectTakesServesFlag: `sidecar inspect --data-dir DIR` reads the
// folder `sidecar serve --data-dir DIR` wrote, as `sidecar inspect DIR`.
func TestInspectTakesServesFlag(t *testing.T) {
	for _, c := range []struct {
		flag string
		args []string
		dir  string
		ok   bool
	}{
		{"", []string{"data"}, "data", true},
		{"data", nil, "data", true},
		{"data", []string{"./data/"}, "./data/", true},
		{"data", []string{"other"}, "", false},
		{"", nil, "", false},
		{"", []string{"a", "b"}, "", false},
	} {
		if dir, ok := inspectDir(c.flag, c.args); dir != c.dir || ok != c.ok {
			t.Errorf("inspectDir(%q, %q) = %q, %v; want %q, %v", c.flag, c.args, dir, ok, c.dir, c.ok)
		}
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "inspect", "--json", "--data-dir", dir)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	out, err := cmd.Output()
	var r inspectReport
	if err != nil || json.Unmarshal(out, &r) != nil || r.Dir != dir {
		t.Fatalf("inspect --data-dir %s: %v\n%s", dir, err, out)
	}
}
