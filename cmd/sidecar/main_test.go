package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvsidecar/kvsidecar/proxy"
)

// When the test binary runs with SIDECAR_TEST_MAIN=1 it is the sidecar
// itself: tests start it as a child process, as users start the binary.
func TestMain(m *testing.M) {
	if os.Getenv("SIDECAR_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// child is a sidecar process started by a test.
type child struct {
	cmd     *exec.Cmd
	addr    string
	admin   string                 // the admin listener's address (metrics, console)
	pprof   atomic.Pointer[string] // the pprof address, when started with --pprof
	logPath string                 // where its stderr goes ("" for nowhere)
	done    chan struct{}          // closed when the process exited; err and exited are then set
	exited  time.Time
	err     error
}

// startChild runs `sidecar serve` with args in a child process and waits
// until it listens.
func startChild(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, args...)...)
	cmd.Env = append(append(os.Environ(), "SIDECAR_TEST_MAIN=1"), env...)
	return startCmd(t, cmd, "")
}

// startCmd starts a prepared `sidecar serve` command and waits until it
// listens; its stderr (the JSON log) is appended to logPath when that is
// not empty. The test's cleanup kills it.
func startCmd(t *testing.T, cmd *exec.Cmd, logPath string) *child {
	t.Helper()
	lf := io.Discard
	if logPath != "" {
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		lf = f
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = lf.Write(append(line, '\n'))
			var l struct{ Msg, Listen, Addr string }
			if json.Unmarshal(line, &l) == nil {
				switch l.Msg {
				case "admin listening": // before "sidecar listening"
					c.admin = l.Addr
				case "sidecar listening":
					addr <- l.Listen
				case "pprof listening":
					c.pprof.Store(&l.Addr)
				}
			}
		}
		_, _ = io.Copy(lf, stderr) // past a line too long to scan
		c.err = cmd.Wait()
		c.exited = time.Now()
		if f, ok := lf.(*os.File); ok {
			f.Close()
		}
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	select {
	case c.addr = <-addr:
	case <-c.done:
		t.Fatalf("sidecar exited before listening: %v\n%s", c.err, tail(c.log(), 4000))
	case <-time.After(60 * time.Second):
		t.Fatal("sidecar did not start listening")
	}
	return c
}

// kill sends SIGKILL and waits until the process is reaped.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// log is what the child wrote to its log so far ("" when it keeps none).
func (c *child) log() string {
	if c.logPath == "" {
		return ""
	}
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}

// scriptedUpstream is an OpenAI-compatible server on loopback with canned
// answers. step, when not nil, gates each streamed chunk after the first.
type scriptedUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
	prompts []json.RawMessage // "messages" of each client chat request
	bgModel []string          // "model" of each request without a session (the sidecar's own calls)
	step    chan struct{}
	// bg, when not nil, answers the sidecar's own calls (extraction,
	// summaries) instead of the echo: its argument is the prompt.
	bg func(prompt string) string
}

func newScriptedUpstream(t *testing.T) *scriptedUpstream {
	u := &scriptedUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *scriptedUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("User-Agent") == proxy.ProbeUserAgent {
		http.NotFound(w, r) // a scripted upstream states no context
		return
	}
	u.mu.Lock()
	u.headers = append(u.headers, r.Header.Clone())
	u.mu.Unlock()
	var req struct {
		Stream   bool `json:"stream"`
		Messages []struct{ Content string }
	}
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &req)
	var raw struct {
		Messages json.RawMessage `json:"messages"`
	}
	// Client prompts only: the sidecar's own background calls (summaries,
	// extraction) carry no session.
	if json.Unmarshal(body, &raw) == nil && raw.Messages != nil && r.Header.Get("X-Session-Id") != "" {
		u.mu.Lock()
		u.prompts = append(u.prompts, raw.Messages)
		u.mu.Unlock()
	} else if r.URL.Path == "/v1/chat/completions" {
		var m struct{ Model string }
		_ = json.Unmarshal(body, &m)
		u.mu.Lock()
		u.bgModel = append(u.bgModel, m.Model)
		u.mu.Unlock()
	}
	switch r.URL.Path {
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[{"id":"tiny","object":"model","created":1,"owned_by":"test"}]}`)
	case "/v1/embeddings":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","model":"tiny","data":[{"object":"embedding","index":0,"embedding":[0.5,-0.25,1]}],"usage":{"prompt_tokens":1,"total_tokens":1}}`)
	case "/v1/chat/completions":
		echo := ""
		if n := len(req.Messages); n > 0 {
			echo = req.Messages[n-1].Content
		}
		if u.bg != nil && r.Header.Get("X-Session-Id") == "" {
			reply, _ := json.Marshal(u.bg(echo)) // JSON, not Go, escapes
			// The sidecar streams its own calls (cmd/sidecar/internal/llm).
			if req.Stream {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":%s}}]}\n\n", reply)
				fmt.Fprint(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"tiny","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%s}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, reply)
			return
		}
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"tiny","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%q}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, "echo: "+echo)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i, word := range []string{"echo:", " ", echo} {
			if i > 0 && u.step != nil {
				<-u.step
			}
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", word)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	default:
		http.NotFound(w, r)
	}
}

func TestOpenAIClientAgainstRunningSidecar(t *testing.T) {
	up := newScriptedUpstream(t)
	sc := startChild(t, []string{"SIDECAR_UPSTREAM=" + up.URL})
	client := openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey("sk-test"),
		option.WithHeader("X-Session-ID", "s-1"), option.WithMaxRetries(0))
	ctx := context.Background()

	params := openai.ChatCompletionNewParams{
		Model:    "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")},
	}
	comp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if got := comp.Choices[0].Message.Content; got != "echo: hello there" || comp.Usage.TotalTokens != 5 {
		t.Fatalf("chat = %q, usage %+v", got, comp.Usage)
	}

	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.Content; got != "echo: hello there" {
		t.Fatalf("streamed chat = %q", got)
	}

	emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "tiny",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("vector me")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := emb.Data[0].Embedding; len(v) != 3 || v[1] != -0.25 {
		t.Fatalf("embedding = %v", v)
	}

	models, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != "tiny" {
		t.Fatalf("models = %+v", models.Data)
	}

	up.mu.Lock()
	defer up.mu.Unlock()
	for _, h := range up.headers {
		if h.Get("Authorization") != "Bearer sk-test" || h.Get("X-Session-Id") != "s-1" {
			t.Fatalf("upstream saw headers %v", h)
		}
	}
}

func TestOpenAIClientSeesErrors(t *testing.T) {
	up := newScriptedUpstream(t)
	sc := startChild(t, []string{"SIDECAR_UPSTREAM=" + up.URL}, "--max-body-bytes", "2048")
	client := openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("long ", 1000))},
	})
	var apiErr *openai.Error
	if !errorsAs(err, &apiErr) || apiErr.StatusCode != 413 || apiErr.Code != "body_too_large" {
		t.Fatalf("err = %v", err)
	}
}

func errorsAs(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

func TestSIGTERMLetsInFlightStreamFinish(t *testing.T) {
	up := newScriptedUpstream(t)
	up.step = make(chan struct{})
	sc := startChild(t, nil, "--upstream", up.URL, "--shutdown-timeout", "20s")
	client := openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:    "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("bye")},
	})
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	content := stream.Current().Choices[0].Delta.Content
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the sidecar is now shutting down
	if _, err := http.Get("http://" + sc.addr + "/healthz"); err == nil {
		t.Fatal("a shutting-down sidecar still accepts connections")
	}
	go func() { up.step <- struct{}{}; up.step <- struct{}{} }()
	for stream.Next() {
		content += stream.Current().Choices[0].Delta.Content
	}
	if err := stream.Err(); err != nil || content != "echo: bye" {
		t.Fatalf("stream after SIGTERM: %q, %v", content, err)
	}
	select {
	case <-sc.done:
		if sc.err != nil {
			t.Fatalf("sidecar exit: %v", sc.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sidecar did not exit after its last stream")
	}
}

func TestParseModelLimits(t *testing.T) {
	m, err := parseModelLimits(" gpt-4o=128000, llama-3*=32768 ")
	if err != nil || len(m) != 2 || m["gpt-4o"] != 128000 || m["llama-3*"] != 32768 {
		t.Fatalf("%v %v", m, err)
	}
	for _, bad := range []string{"gpt-4o", "=5", "m=0", "m=x"} {
		if _, err := parseModelLimits(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if m, err := parseModelLimits(""); m != nil || err != nil {
		t.Fatalf("empty: %v %v", m, err)
	}
}

func TestFlagsReadEnvironment(t *testing.T) {
	env := map[string]string{"SIDECAR_UPSTREAM": "http://env:1", "SIDECAR_LISTEN": "127.0.0.1:9", "SIDECAR_UPSTREAM_TIMEOUT": "7s"}
	var c serveConfig
	if err := parseFlags(serveFlags(&c), []string{"--listen", "127.0.0.1:5"}, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.upstream != "http://env:1" || c.listen != "127.0.0.1:5" || c.upstreamTimeout != 7*time.Second {
		t.Fatalf("config %+v", c)
	}
	if err := parseFlags(serveFlags(&c), []string{"--upstream-max-idle", "7"}, func(string) string { return "" }); err != nil || c.upstreamMaxIdle != 7 {
		t.Fatalf("--upstream-max-idle 7: %d, %v", c.upstreamMaxIdle, err)
	}
	env["SIDECAR_UPSTREAM_TIMEOUT"] = "soon"
	if err := parseFlags(serveFlags(&c), nil, func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "SIDECAR_UPSTREAM_TIMEOUT") {
		t.Fatalf("bad env value: %v", err)
	}
	if err := parseFlags(serveFlags(&c), []string{"extra"}, func(string) string { return "" }); err == nil {
		t.Fatal("stray argument accepted")
	}
}

// waitUntil polls cond for up to a minute, for effects that land after a
// response (replies are recorded off the request path). The bound only
// matters when cond never holds: it is wide because make test runs the
// groups of packages at once on two cores, where background work can lag
// by seconds.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within a minute")
}
