package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
	"github.com/kvsidecar/kvsidecar/memory"
)

func TestParseContextError(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		body   string
		ok     bool
		want   ctxError
	}{
		{"llama.cpp", 400, `{"error":{"code":400,"message":"request (7054 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":7054,"n_ctx":2048}}`, true, ctxError{nCtx: 2048, nPrompt: 7054}},
		{"vllm", 400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 4500 tokens (4000 in the messages, 500 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}`, true, ctxError{nCtx: 4096, nPrompt: 4000}},
		{"openai", 400, `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, true, ctxError{nCtx: 8192, nPrompt: 9000}},
		{"sglang", 400, `{"object":"error","message":"The input (5000 tokens) is longer than the model's context length (4096 tokens).","type":"BadRequestError"}`, true, ctxError{nCtx: 4096, nPrompt: 5000}},
		{"no numbers", 400, `{"error":{"message":"prompt is too long","code":"context_length_exceeded"}}`, true, ctxError{}},
		{"another 400", 400, `{"error":{"message":"'messages' must be an array","type":"invalid_request_error"}}`, false, ctxError{}},
		{"a 500 about context", 500, `{"error":{"message":"maximum context length is 10 tokens"}}`, false, ctxError{}},
	} {
		got, ok := parseContextError(c.status, []byte(c.body))
		if ok != c.ok || got != c.want {
			t.Errorf("%s: got %+v %v, want %+v %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestEngineCtxLimit(t *testing.T) {
	for _, c := range []struct {
		e         engineCtx
		maxTokens int
		want      int
	}{
		{engineCtx{}, 0, 0},              // unknown: memory's own limit
		{engineCtx{nCtx: 4096}, 0, 3461}, // ratio unknown: 1
		{engineCtx{nCtx: 4096, ratio: 5}, 0, 692},
		{engineCtx{nCtx: 4096, ratio: 5}, 100, 720},
		{engineCtx{nCtx: 4096, ratio: 5}, 100000, 366}, // the reply's room is at most half
		{engineCtx{nCtx: 4096, ratio: 5, cap: 200}, 0, 200},
		{engineCtx{cap: 300}, 0, 300},
		{engineCtx{nCtx: 16, ratio: 5}, 0, 1},
	} {
		if got := c.e.limit(c.maxTokens); got != c.want {
			t.Errorf("%+v max_tokens %d: %d, want %d", c.e, c.maxTokens, got, c.want)
		}
	}
}

// byteEngine is a scripted engine whose tokenizer counts one token a byte
// (as a byte-level vocabulary does: several times what cl100k counts) and
// whose context holds nCtx of them; over it, chat answers llama.cpp's 400.
type byteEngine struct {
	*httptest.Server
	nCtx    int
	props   bool // serve /props and /tokenize
	mu      sync.Mutex
	prompts []string
	refused atomic.Int32
	ok      atomic.Int32
}

func newByteEngine(t *testing.T, nCtx int, props bool) *byteEngine {
	e := &byteEngine{nCtx: nCtx, props: props}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.URL.Path == "/props" && e.props:
			fmt.Fprintf(w, `{"default_generation_settings":{"n_ctx":%d},"total_slots":1}`, e.nCtx)
			return
		case r.URL.Path == "/tokenize" && e.props:
			var req struct{ Content string }
			_ = json.Unmarshal(body, &req)
			toks := make([]int, len(req.Content))
			b, _ := json.Marshal(map[string]any{"tokens": toks})
			w.Write(b)
			return
		case r.URL.Path != "/v1/chat/completions":
			http.NotFound(w, r)
			return
		}
		var req struct {
			Messages []struct{ Role, Content string }
		}
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		n := 0
		for _, m := range req.Messages {
			n += len(m.Content) + 6 // the chat template's framing
		}
		e.mu.Lock()
		e.prompts = append(e.prompts, string(body))
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n > e.nCtx {
			e.refused.Add(1)
			w.WriteHeader(400)
			fmt.Fprintf(w, `{"error":{"code":400,"message":"request (%d tokens) exceeds the available context size (%d tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":%d,"n_ctx":%d}}`, n, e.nCtx, n, e.nCtx)
			return
		}
		e.ok.Add(1)
		last := req.Messages[len(req.Messages)-1].Content
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":3}}`, "ok "+last[:min(20, len(last))], n)
	}))
	t.Cleanup(e.Close)
	return e
}

// TestWindowFitsTheEnginesContext: an engine whose context is far smaller
// than the window and whose tokenizer counts several times what cl100k
// does. Drop-in and full-history clients talk for many turns; every
// request the engine would take from the client directly succeeds through
// the sidecar, with the context learned from /props and /tokenize, or
// (without them) from the first context error, retried once.
func TestWindowFitsTheEnginesContext(t *testing.T) {
	for _, probe := range []bool{true, false} {
		t.Run(fmt.Sprintf("probe=%v", probe), func(t *testing.T) {
			const nCtx = 2048
			eng := newByteEngine(t, nCtx, probe)
			st := openMemory(t, memory.Options{})
			base, srv := startSidecar(t, eng.URL, func(o *Options) { o.Memory = st; o.NoContextProbe = !probe })
			if probe {
				eventually(t, func() bool { return srv.limits.view("m").ratio > 0 && srv.limits.view("m").nCtx == nCtx })
			}
			failures := 0
			var full []map[string]string
			for turn := range 24 {
				text := fmt.Sprintf("turn %d: %s", turn, strings.Repeat(fmt.Sprintf("fact%d about the garden ", turn), 6))
				// The drop-in client sends its system message and newest one.
				msgs, _ := json.Marshal([]map[string]string{{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}})
				resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","messages":`+string(msgs)+`}`,
					map[string]string{"Authorization": "Bearer k", "X-Session-ID": "drop-in"})
				if resp.StatusCode != 200 {
					failures++
					t.Errorf("drop-in turn %d: %d %s", turn, resp.StatusCode, b)
				}
				// The full-history client keeps what fits the engine itself.
				full = append(full, map[string]string{"role": "user", "content": text})
				for {
					n := 0
					for _, m := range full {
						n += len(m["content"]) + 6
					}
					if n <= nCtx-200 {
						break
					}
					full = full[2:]
				}
				msgs, _ = json.Marshal(full)
				resp, b = post(t, base+"/v1/chat/completions", `{"model":"m","messages":`+string(msgs)+`}`,
					map[string]string{"Authorization": "Bearer k", "X-Session-ID": "full"})
				if resp.StatusCode != 200 {
					failures++
					t.Errorf("full-history turn %d: %d %s", turn, resp.StatusCode, b)
					continue
				}
				var out struct {
					Choices []struct{ Message map[string]string }
				}
				_ = json.Unmarshal(b, &out)
				full = append(full, out.Choices[0].Message)
			}
			if failures > 0 {
				t.Fatalf("%d requests failed through the sidecar", failures)
			}
			// The engine refused at most the first window (no probe), never
			// a client: every refusal was retried.
			if probe && eng.refused.Load() != 0 || !probe && eng.refused.Load() > 2 {
				t.Fatalf("the engine refused %d windows (probe %v)", eng.refused.Load(), probe)
			}
			srv.waitIdle()
			// The drop-in session's window still carries history: memory
			// fills what the engine holds, no more.
			var v struct{ Messages []struct{ Role string } }
			if getJSON(t, base+"/v1/sessions/drop-in", "k", &v) != 200 || len(v.Messages) < 40 {
				t.Fatalf("drop-in session holds %d messages", len(v.Messages))
			}
			eng.mu.Lock()
			last := eng.prompts[len(eng.prompts)-2] // the drop-in's last
			eng.mu.Unlock()
			if !strings.Contains(last, "turn 22") {
				t.Fatalf("the drop-in window lost the previous turn: %.300s", last)
			}
		})
	}
}

// TestRequestOverTheWindowGoesAsSent: a client's own request larger than
// what memory would build (the window, or the engine's context as
// estimated) but that the engine takes goes through exactly as sent.
func TestRequestOverTheWindowGoesAsSent(t *testing.T) {
	eng := newByteEngine(t, 8000, true)
	st := openMemory(t, memory.Options{Window: memory.WindowOptions{Limit: 512}})
	base, srv := startSidecar(t, eng.URL, func(o *Options) { o.Memory = st; o.NoContextProbe = false })
	eventually(t, func() bool { return srv.limits.view("m").nCtx == 8000 })
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("long words here ", 400) + `"}]}`
	resp, b := post(t, base+"/v1/chat/completions", body, map[string]string{"Authorization": "Bearer k", "X-Session-ID": "big"})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	eng.mu.Lock()
	got := eng.prompts[len(eng.prompts)-1]
	eng.mu.Unlock()
	if got != body {
		t.Fatalf("not sent as sent:\n%.200s", got)
	}
}

// TestOllamaContext: an Ollama upstream states the context of each loaded
// model in /api/ps; a model it has not loaded gets its default.
func TestOllamaContext(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/version":
			fmt.Fprint(w, `{"version":"0.12.3"}`)
		case "/api/ps":
			fmt.Fprint(w, `{"models":[{"name":"qwen2.5:0.5b","model":"qwen2.5:0.5b","context_length":2048}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(up.Close)
	st := openMemory(t, memory.Options{})
	_, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st; o.NoContextProbe = false })
	eventually(t, func() bool { return srv.limits.view("qwen2.5:0.5b").nCtx == 2048 })
	if got := srv.limits.view("llama3.1:8b").nCtx; got != ollamaDefaultCtx {
		t.Fatalf("a model Ollama has not loaded: context %d, want %d", got, ollamaDefaultCtx)
	}
}

// TestCtxLimitsCloseWhileStarting: Shutdown may close the context limits
// while Serve is still starting their first probe (a sidecar stopped as
// soon as it started: cmd/sidecar's TestServeWarnsOfAnUnreachableUpstream
// on a loaded machine). Under -race, close's wait on a probe that Serve
// started with nothing ordering the two was a data race on the wait group;
// close now orders itself after every probe started before it, and none
// starts after it.
func TestCtxLimitsCloseWhileStarting(t *testing.T) {
	// An upstream that accepts and never answers: the probe stays in flight.
	addr := sidecartest.ServeConns(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	base, _ := url.Parse("http://" + addr)
	stop, cancel := context.WithCancel(context.Background())
	count := func(_ context.Context, _, text string) (int, error) { return len(text), nil }
	c := newCtxLimits(base, count, stop, slog.New(slog.DiscardHandler))
	go c.start() // Serve's
	// A sleep, not a wait on a condition: anything the probe signalled
	// (its bytes on the socket included) would order it before close,
	// and the race detector would have nothing to see.
	time.Sleep(50 * time.Millisecond)
	time.AfterFunc(50*time.Millisecond, cancel) // Shutdown's stop ends the probe
	c.close()
	c.start() // after close: no probe
	c.mu.Lock()
	probing := c.probing
	c.mu.Unlock()
	if probing {
		t.Fatal("a probe started after close")
	}
}
