package llamaserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
)

func TestFindServerFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "llama-server")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(llamaserver.EnvServer, exe)
	if got, err := llamaserver.FindServer(); err != nil || got != exe {
		t.Fatalf("FindServer = %q, %v", got, err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(llamaserver.EnvServer, plain)
	if _, err := llamaserver.FindServer(); !errors.Is(err, llamaserver.ErrNotFound) {
		t.Fatalf("a non-executable $LLAMA_SERVER: %v", err)
	}
}

func TestFindWalksUpToShared(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "shared", "llama", "bin")
	deep := filepath.Join(root, "repo", "cmd", "sidecar")
	for _, d := range []string{bin, deep} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe := filepath.Join(bin, "llama-server")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "shared", "llama", "tiny_gguf.py")
	if err := os.WriteFile(script, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(llamaserver.EnvServer, "")
	t.Setenv(llamaserver.EnvScript, "")
	t.Chdir(deep)
	p, err := llamaserver.Find()
	if p.Server != exe || p.Script != script {
		t.Fatalf("Find from %s = %+v, %v", deep, p, err)
	}
}

func TestTinyModelIsCachedPerArguments(t *testing.T) {
	p := llamatest.Require(t)
	dir := t.TempDir()
	a, err := llamaserver.TinyModel(p, dir, 64, 2, 2, 1, 128, 1)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	again, err := llamaserver.TinyModel(p, dir, 64, 2, 2, 1, 128, 1)
	if err != nil || again != a {
		t.Fatalf("second call: %q, %v (first %q)", again, err, a)
	}
	if fi2, _ := os.Stat(a); !fi2.ModTime().Equal(fi.ModTime()) {
		t.Fatal("the cached model was written again")
	}
	b, err := llamaserver.TinyModel(p, dir, 64, 2, 2, 1, 128, 2)
	if err != nil {
		t.Fatal(err)
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if b == a || bytes.Equal(ba, bb) || len(ba) != len(bb) {
		t.Fatalf("another seed: %s (%d bytes) vs %s (%d bytes)", b, len(bb), a, len(ba))
	}
	if _, err := llamaserver.TinyModel(p, dir, 0); err == nil {
		t.Fatal("a zero dimension was accepted")
	}
}

// chat sends one small chat request and returns llama.cpp's timings.
func chat(t *testing.T, base, text string) (promptN, cacheN int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"messages":   []map[string]string{{"role": "user", "content": text}},
		"grammar":    "root ::= [a-z ]+",
		"max_tokens": 4, "id_slot": 0, "cache_prompt": true,
	})
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Timings struct {
			PromptN int `json:"prompt_n"`
			CacheN  int `json:"cache_n"`
		} `json:"timings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("chat: HTTP %d, %v", resp.StatusCode, err)
	}
	return out.Timings.PromptN, out.Timings.CacheN
}

func TestStartKillRestart(t *testing.T) {
	s := llamatest.Start(t, llamaserver.Options{Slots: 2, CacheRAMMiB: -1})
	url := s.URL()
	ctx := context.Background()
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 20)
	n, err := s.Tokenize(ctx, text)
	if err != nil || n < 200 {
		t.Fatalf("tokenize: %d, %v", n, err)
	}
	if p, c := chat(t, url, text); p < n || c != 0 {
		t.Fatalf("first request: prompt_n %d cache_n %d (text is %d tokens)", p, c, n)
	}
	if p, c := chat(t, url, text+"more"); c < n*9/10 || p > 60 {
		t.Fatalf("second request reused %d tokens, computed %d", c, p)
	}
	// The slot API writes into the slot folder.
	resp, err := http.Post(url+"/slots/0?action=save", "application/json", strings.NewReader(`{"filename":"s0.bin"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := os.Stat(filepath.Join(s.SlotDir(), "s0.bin")); resp.StatusCode != 200 || err != nil {
		t.Fatalf("slot save: HTTP %d, %v", resp.StatusCode, err)
	}

	s.Kill()
	if s.Running() {
		t.Fatal("running after Kill")
	}
	if _, err := http.Get(url + "/health"); err == nil {
		t.Fatal("a killed server still answers")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.URL() != url || !s.Running() {
		t.Fatalf("restarted at %s (was %s)", s.URL(), url)
	}
	// A fresh process: nothing cached.
	if p, c := chat(t, url, text+"more"); c != 0 || p < n {
		t.Fatalf("after restart: prompt_n %d cache_n %d", p, c)
	}

	other := llamatest.Model(t, 256, 4, 4, 2, 512, 7)
	if err := s.RestartWithModel(ctx, other); err != nil {
		t.Fatal(err)
	}
	resp, err = http.Get(url + "/props")
	if err != nil {
		t.Fatal(err)
	}
	var props struct {
		ModelPath string `json:"model_path"`
	}
	json.NewDecoder(resp.Body).Decode(&props)
	resp.Body.Close()
	if props.ModelPath != other || s.Model() != other {
		t.Fatalf("after RestartWithModel the server runs %q", props.ModelPath)
	}
	s.Stop()
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if !strings.Contains(s.LogTail(1<<20), "=== ") {
		t.Fatal("the log has no start lines")
	}
}

func TestStartFailsWithoutLeavingAProcess(t *testing.T) {
	p := llamatest.Require(t)
	bad := filepath.Join(t.TempDir(), "not-a-model.gguf")
	if err := os.WriteFile(bad, []byte("nonsense"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := llamaserver.Start(context.Background(), llamaserver.Options{Binary: p.Server, Model: bad, StartTimeout: 30 * time.Second})
	if err == nil {
		s.Close()
		t.Fatal("a server with a broken model started")
	}
	if !strings.Contains(err.Error(), "exited before it was healthy") {
		t.Fatalf("err = %v", err)
	}
	if _, err := llamaserver.Start(context.Background(), llamaserver.Options{}); err == nil {
		t.Fatal("no model accepted")
	}
}
