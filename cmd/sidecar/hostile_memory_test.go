package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/faultup"
)

// The issue 12 rows that live in session memory, against the binary.

// TestHostileMemoryRows reproduces against the binary the issue 12 rows
// that live in session memory and are not covered by reliability_test.go
// (rows 2 and 11 are): a long word, a one-word reply followed by another
// turn and SIGTERM, a damaged log record, duplicate units.
func TestHostileMemoryRows(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	up, upstream := startFaultUpstream(t, faultup.Options{LongWordBytes: 100 << 10})
	chat := func(t *testing.T, addr string, hdr [][2]string, body string, timeout time.Duration) *rawResp {
		t.Helper()
		t0 := time.Now()
		r, err := rawDo(addr, buildRequest("POST", "/v1/chat/completions", append(hdr, [2]string{"Content-Type", "application/json"}), []byte(body)), "POST", timeout)
		if err != nil {
			t.Fatalf("no answer within %s: %v", time.Since(t0).Round(time.Millisecond), err)
		}
		return r
	}
	session := func(id string) [][2]string {
		return [][2]string{{"Authorization", "Bearer mem"}, {"X-Session-ID", id}}
	}
	longWord := func(n int) string { return strings.Repeat("a", n) }

	// Time limits below only catch the quadratic behaviour (minutes on
	// main); linear counting takes well under a second.
	t.Run("row 1: a 400 KB word is counted in bounded time", func(t *testing.T) {
		p := startProc(t, t.TempDir(), "--upstream", upstream, "--window-tokens", "2000000")
		for _, body := range []string{
			fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, longWord(400<<10)),
			fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat("漢字", 400<<10/6)),
		} {
			t0 := time.Now()
			r := chat(t, p.addr, session("long"), body, 30*time.Second)
			if r.status >= 500 {
				t.Fatalf("%d %.200s", r.status, r.body)
			}
			t.Logf("answered %d in %s", r.status, time.Since(t0).Round(time.Millisecond))
		}
		if r := chat(t, p.addr, session("long"), `{"model":"m","messages":[{"role":"user","content":"still there?"}]}`, 10*time.Second); r.status != 200 {
			t.Fatalf("the session is stuck: %d", r.status)
		}
	})
	t.Run("row 3: a 400 KB one-word reply costs bounded time, before and after the answer", func(t *testing.T) {
		up.SetLongWordBytes(400 << 10)
		defer up.SetLongWordBytes(100 << 10)
		p := startProc(t, t.TempDir(), "--upstream", upstream, "--shutdown-timeout", "2s")
		for _, stream := range []bool{false, true} {
			id := fmt.Sprint("reply-", stream)
			t0 := time.Now()
			r := chat(t, p.addr, append(session(id), [2]string{"X-Fault", "long-word"}),
				fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"say it"}]}`, stream), 30*time.Second)
			if r.status != 200 || r.readErr != nil || len(r.body) < 400<<10 {
				t.Fatalf("stream=%v: %d %v, %d bytes", stream, r.status, r.readErr, len(r.body))
			}
			if r := chat(t, p.addr, append(session(id), [2]string{"X-Session-Mode", "append"}), `{"model":"m","messages":[{"role":"user","content":"and?"}]}`, 30*time.Second); r.status != 200 {
				t.Fatalf("next turn: %d", r.status)
			}
			t.Logf("stream=%v: both turns in %s", stream, time.Since(t0).Round(time.Millisecond))
		}
		t0 := time.Now()
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Fatal("still running 10 s after SIGTERM with a 2 s grace")
		}
		t.Logf("exited %s after SIGTERM", time.Since(t0).Round(time.Millisecond))
	})
	t.Run("row 9: one damaged record costs that record only", func(t *testing.T) {
		dir := t.TempDir()
		p := startProc(t, dir, "--upstream", upstream, "--extract=false")
		for i := 0; i < 20; i++ {
			if r := chat(t, p.addr, append(session("damaged"), [2]string{"X-Session-Mode", "append"}),
				fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"message number %d"}]}`, i), 10*time.Second); r.status != 200 {
				t.Fatalf("turn %d: %d", i, r.status)
			}
		}
		stop(t, p)
		var logs []string
		_ = filepath.WalkDir(filepath.Join(dir, "sessions"), func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && !strings.Contains(path, "quarantine") && strings.HasSuffix(path, ".log") {
				if fi, _ := d.Info(); fi != nil && fi.Size() > 2000 {
					logs = append(logs, path)
				}
			}
			return nil
		})
		if len(logs) != 1 {
			t.Fatalf("want the one session log, found %q", logs)
		}
		b, _ := os.ReadFile(logs[0])
		i := bytes.Index(b[len(b)/2:], []byte("message number")) + len(b)/2
		b[i+3] ^= 0x20
		_ = os.WriteFile(logs[0], b, 0o644)
		p = startProc(t, dir, "--upstream", upstream, "--extract=false")
		var v struct {
			Messages []struct{ Role, Content string }
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.addr+"/v1/sessions/damaged", nil)
		req.Header.Set("Authorization", "Bearer mem")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = json.Unmarshal(body, &v)
		if resp.StatusCode != 200 || len(v.Messages) < 39 {
			t.Fatalf("after one flipped byte: %d, %d of 40 messages kept", resp.StatusCode, len(v.Messages))
		}
		if r := chat(t, p.addr, append(session("damaged"), [2]string{"X-Session-Mode", "append"}), `{"model":"m","messages":[{"role":"user","content":"next"}]}`, 10*time.Second); r.status != 200 {
			t.Fatalf("chat after damage: %d", r.status)
		}
		if m := scrape(t, p.admin); m["sidecar_memory_bypassed_total"] != 0 {
			t.Fatalf("memory bypassed %v times", m["sidecar_memory_bypassed_total"])
		}
	})
	t.Run("row 12: identical requests make no duplicate units", func(t *testing.T) {
		p := startProc(t, t.TempDir(), "--upstream", upstream, "--extract=false")
		msgs := `{"role":"user","content":"tell me about the weather in spring"}`
		for i := 0; i < 50; i++ {
			if r := chat(t, p.addr, session("same"), `{"model":"m","messages":[`+msgs+`]}`, 10*time.Second); r.status != 200 {
				t.Fatalf("request %d: %d", i, r.status)
			}
		}
		var v struct{ Units []struct{ Content string } }
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.addr+"/v1/sessions/same/memory", nil)
		req.Header.Set("Authorization", "Bearer mem")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		seen := map[string]bool{}
		for _, u := range v.Units {
			if u.Content == "" || seen[u.Content] {
				t.Fatalf("%d units, duplicate or empty: %q", len(v.Units), u.Content)
			}
			seen[u.Content] = true
		}
	})
}
