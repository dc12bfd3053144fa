package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// realServer is a llama-server from ../shared/llama started for a test.
type realServer struct {
	t     *testing.T
	bin   string
	model string
	slots string
	port  int
	np    int
	extra []string
	cmd   *exec.Cmd
	url   string
	logf  string
}

func findShared(t *testing.T) (bin, gen string) {
	t.Helper()
	if b := os.Getenv("LLAMA_SERVER"); b != "" {
		bin = b
	}
	dir, _ := os.Getwd()
	for range 6 {
		cand := filepath.Join(dir, "..", "shared", "llama")
		if _, err := os.Stat(filepath.Join(cand, "tiny_gguf.py")); err == nil {
			if bin == "" {
				bin = filepath.Join(cand, "bin", "llama-server")
			}
			gen = filepath.Join(cand, "tiny_gguf.py")
			break
		}
		dir = filepath.Dir(dir)
	}
	if _, err := os.Stat(bin); bin == "" || err != nil || gen == "" {
		if os.Getenv("KVSIDECAR_REQUIRE_LLAMA") == "1" {
			t.Fatalf("llama-server or tiny_gguf.py not found (bin %q gen %q) and KVSIDECAR_REQUIRE_LLAMA=1", bin, gen)
		}
		t.Skipf("llama-server not found (set LLAMA_SERVER or provide ../shared/llama)")
	}
	return bin, gen
}

func genModel(t *testing.T, gen string, args ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "m.gguf")
	cmd := exec.Command("python3", append([]string{gen, out}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tiny_gguf: %v: %s", err, b)
	}
	return out
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startReal(t *testing.T, bin, model, slots string, np int, extra ...string) *realServer {
	s := &realServer{t: t, bin: bin, model: model, slots: slots, port: freePort(t), np: np, extra: extra, logf: filepath.Join(t.TempDir(), "llama.log")}
	s.url = fmt.Sprintf("http://127.0.0.1:%d", s.port)
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *realServer) start() {
	args := []string{"-m", s.model, "--host", "127.0.0.1", "--port", fmt.Sprint(s.port), "-c", fmt.Sprint(4096 * s.np), "-np", fmt.Sprint(s.np),
		"--slot-save-path", s.slots, "--no-jinja", "--chat-template", "chatml", "--reasoning-format", "none", "-t", "2"}
	args = append(args, s.extra...)
	f, _ := os.OpenFile(s.logf, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = f, f
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if r, err := http.Get(s.url + "/health"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(s.logf)
	s.t.Fatalf("llama-server did not start: %s", b)
}

func (s *realServer) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

var words = strings.Fields("the a of and to in is you that it he was for on are as with his they at be this have from or one had by word but not what all were we when your can said there use each which she do how their if will up other about out many then them these so some her would make like him into time has look two more write go see number no way could people my than first water been call who oil its now find long down day did get come made may part")

func document(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()
}

type convo struct {
	tenant, session string
	msgs            []map[string]string
}

func (c *convo) body(q string) []byte {
	c.msgs = append(c.msgs, map[string]string{"role": "user", "content": q})
	b, _ := json.Marshal(map[string]any{"model": "tiny", "messages": c.msgs, "max_tokens": 8, "grammar": "root ::= [a-z ]+", "temperature": 0})
	return b
}

// turn sends the conversation's next question through c and returns the
// engine's timings.
func turn(t *testing.T, c Connector, url string, cv *convo, q string) Timings {
	t.Helper()
	req := &Request{Tenant: cv.tenant, SessionID: cv.session, Model: "tiny", Body: cv.body(q)}
	body, err := c.Before(context.Background(), req)
	if err != nil {
		t.Fatalf("before: %v", err)
	}
	res, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		c.After(context.Background(), req, &Response{})
		t.Fatal(err)
	}
	out, _ := io.ReadAll(res.Body)
	res.Body.Close()
	c.After(context.Background(), req, &Response{Status: res.StatusCode, Body: out})
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, out)
	}
	var r struct {
		Choices []struct {
			Message map[string]string `json:"message"`
		} `json:"choices"`
	}
	_ = json.Unmarshal(out, &r)
	if len(r.Choices) > 0 {
		cv.msgs = append(cv.msgs, map[string]string{"role": "assistant", "content": r.Choices[0].Message["content"]})
	}
	tm, _ := ParseTimings(out)
	return tm
}

func TestRealScratch(t *testing.T) {
	bin, gen := findShared(t)
	model := genModel(t, gen)
	slots := t.TempDir()
	srv := startReal(t, bin, model, slots, 2, "--cache-ram", "8")
	cache, err := kv.Open(kv.Options{Store: tiers.Options{Dir: t.TempDir()}, MaxBlobBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	c, err := NewLlamaCPP(LlamaCPPOptions{BaseURL: srv.url, SlotDir: slots, Slots: 2, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var cvs []*convo
	for i := range 4 {
		cvs = append(cvs, &convo{tenant: "t", session: fmt.Sprint("s", i), msgs: []map[string]string{{"role": "system", "content": document(uint64(i), 1200)}}})
	}
	for round := range 3 {
		for i, cv := range cvs {
			tm := turn(t, c, srv.url, cv, fmt.Sprintf("question %d of round %d", i, round))
			t.Logf("round %d session %d: cache_n %d prompt_n %d prompt_ms %.1f", round, i, tm.CacheN, tm.PromptN, tm.PromptMs)
		}
	}
	st := c.Stats()
	t.Logf("stats %+v", st)
}
