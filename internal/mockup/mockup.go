package mockup

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Options shape the scripted upstream. The zero value answers every chat
// with one canned sentence; every zero value is a documented default (New
// applies EnsureDefaults; nothing is refused).
type Options struct {
	// StreamEvents is how many content chunks a streamed answer has.
	// Zero means 16.
	StreamEvents int
	// EventGap is the pause between two streamed chunks. Zero means none.
	EventGap time.Duration
	// KeepPrompts keeps the last "messages" of each session's chat request
	// (by X-Session-ID) for LastPrompt, and counts the requests without a
	// session (the sidecar's own calls) by model.
	KeepPrompts bool
	// BackgroundReply, when set, answers chat requests without a session
	// (the sidecar's own summary and extraction calls), e.g. "[SKIP]".
	BackgroundReply string
	// Background, when set, answers chat requests without a session with
	// what it returns for their last message (BackgroundReply unused).
	Background func(prompt string) string
	// Describe makes the answer to a chat request with a session say what
	// the upstream received: how many messages, and the newest of them,
	// each cut short (what a demo shows: the history and memory the
	// sidecar added to the client's one message). Otherwise the answer is
	// a canned sentence (streamed: "tok0 tok1 …").
	Describe bool
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. New calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.StreamEvents == 0 {
		o.StreamEvents = 16
	}
	return o
}

// Demo is the upstream `sidecar serve --demo` runs: answers that describe
// what the sidecar sent, and DemoBackground for its own calls.
func Demo() Options {
	return Options{StreamEvents: 8, Describe: true, Background: DemoBackground}
}

// ReplyHeader, on a chat request, names the answer the mock gives: its
// value is the reply text, base64url-encoded (the memory benchmark replays
// a recorded conversation this way). Without it the answer is canned.
const ReplyHeader = "X-Bench-Reply"

// Server is a scripted OpenAI-compatible server for benchmarks and
// demos: /v1/chat/completions (streamed or not), /v1/completions,
// /v1/embeddings and /v1/models, with canned answers.
type Server struct {
	srv  *fasthttp.Server
	opts Options

	// mu protects the fields below.
	mu      sync.Mutex
	prompts map[string][]byte // session → last "messages"
	bgCalls map[string]int    // the model of requests without a session → count
}

// LastPrompt returns the "messages" of the session's last chat request
// (KeepPrompts), nil when none.
func (m *Server) LastPrompt(session string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.prompts[session]
}

// Sessions returns how many sessions' prompts were kept (KeepPrompts).
func (m *Server) Sessions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.prompts)
}

// BackgroundCalls returns the chat requests without a session seen so far
// (KeepPrompts), by model ("" when the request named none).
func (m *Server) BackgroundCalls() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.bgCalls)
}

// keep records a chat request (KeepPrompts).
func (m *Server) keep(ctx *fasthttp.RequestCtx) {
	body := ctx.Request.Body()
	session := string(ctx.Request.Header.Peek("X-Session-ID"))
	m.mu.Lock()
	defer m.mu.Unlock()
	if session == "" {
		m.bgCalls[gjson.GetBytes(body, "model").String()]++
		return
	}
	m.prompts[session] = []byte(gjson.GetBytes(body, "messages").Raw)
}

// New returns a mock; serve it with Serve.
func New(o Options) *Server {
	o.EnsureDefaults()
	m := &Server{opts: o, prompts: map[string][]byte{}, bgCalls: map[string]int{}}
	m.srv = &fasthttp.Server{Handler: m.handle, Name: "mock-upstream"}
	return m
}

// Options returns the options the server was made with (defaults filled
// in).
func (m *Server) Options() Options { return m.opts }

// Serve answers on ln until Close.
func (m *Server) Serve(ln net.Listener) error { return m.srv.Serve(ln) }

// Close stops the mock.
func (m *Server) Close() error { return m.srv.Shutdown() }

const mockChat = `{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":"This is a canned answer from the kvsidecar mock upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":11,"total_tokens":23}}`

func (m *Server) handle(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	switch string(ctx.Path()) {
	case "/v1/models", "/models":
		ctx.SetBodyString(`{"object":"list","data":[{"id":"mock","object":"model","created":1700000000,"owned_by":"kvsidecar"}]}`)
	case "/v1/embeddings":
		// One deterministic 8-dim vector per input, from the input's bytes.
		in := gjson.GetBytes(ctx.Request.Body(), "input")
		var texts []string
		if in.IsArray() {
			for _, v := range in.Array() {
				texts = append(texts, v.Raw)
			}
		} else {
			texts = []string{in.Raw}
		}
		var b bytes.Buffer
		b.WriteString(`{"object":"list","model":"mock","data":[`)
		for i, t := range texts {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"object":"embedding","index":%d,"embedding":[`, i)
			h := fnv.New64a()
			for d := 0; d < 8; d++ {
				h.Write([]byte(t))
				if d > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, "%.4f", float64(h.Sum64()%2000)/1000-1)
			}
			b.WriteString(`]}`)
		}
		fmt.Fprintf(&b, `],"usage":{"prompt_tokens":%d,"total_tokens":%d}}`, len(texts), len(texts))
		ctx.SetBody(b.Bytes())
	case "/v1/completions":
		ctx.SetBodyString(`{"id":"cmpl-mock","object":"text_completion","created":1700000000,"model":"mock","choices":[{"index":0,"text":"canned","finish_reason":"stop"}]}`)
	case "/v1/chat/completions":
		if m.opts.KeepPrompts {
			m.keep(ctx)
		}
		if (m.opts.BackgroundReply != "" || m.opts.Background != nil) && len(ctx.Request.Header.Peek("X-Session-ID")) == 0 {
			reply := m.opts.BackgroundReply
			if m.opts.Background != nil {
				msgs := gjson.GetBytes(ctx.Request.Body(), "messages").Array()
				prompt := ""
				if len(msgs) > 0 {
					prompt = msgs[len(msgs)-1].Get("content").String()
				}
				reply = m.opts.Background(prompt)
			}
			content, _ := json.Marshal(reply)
			ctx.SetBodyString(`{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":` +
				string(content) + `},"finish_reason":"stop"}]}`)
			return
		}
		if h := ctx.Request.Header.Peek(ReplyHeader); len(h) > 0 {
			reply, err := base64.RawURLEncoding.DecodeString(string(h))
			if err != nil {
				ctx.SetStatusCode(fasthttp.StatusBadRequest)
				ctx.SetBodyString(`{"error":{"message":"bad X-Bench-Reply","type":"invalid_request_error","code":"bad_reply"}}`)
				return
			}
			content, _ := json.Marshal(string(reply))
			ctx.SetBodyString(`{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":` +
				string(content) + `},"finish_reason":"stop"}]}`)
			return
		}
		stream := bytes.Contains(ctx.Request.Body(), []byte(`"stream":true`))
		if !m.opts.Describe && !stream {
			ctx.SetBodyString(mockChat)
			return
		}
		n, gap := m.opts.StreamEvents, m.opts.EventGap
		chunks := make([]string, n)
		for i := range chunks {
			chunks[i] = fmt.Sprintf("tok%d ", i)
		}
		if m.opts.Describe {
			chunks = splitWords(Describe(ctx.Request.Body()), n)
		}
		if !stream {
			content, _ := json.Marshal(strings.Join(chunks, ""))
			ctx.SetBodyString(`{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":` +
				string(content) + `},"finish_reason":"stop"}]}`)
			return
		}
		ctx.SetContentType("text/event-stream")
		// With stream_options.include_usage, a last chunk carries the usage
		// (no choices), as OpenAI's API and vLLM send it; prompt tokens are
		// the body's bytes / 4.
		usage := gjson.GetBytes(ctx.Request.Body(), "stream_options.include_usage").Bool()
		promptTokens := len(ctx.Request.Body()) / 4
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i, c := range chunks {
				if i > 0 && gap > 0 {
					time.Sleep(gap)
				}
				content, _ := json.Marshal(c)
				fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"mock\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%s}}]}\n\n", content)
				if w.Flush() != nil {
					return
				}
			}
			if usage {
				fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"mock\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
					promptTokens, n, promptTokens+n)
			}
			w.WriteString("data: [DONE]\n\n")
			_ = w.Flush()
		})
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetBodyString(`{"error":{"message":"not found","type":"not_found_error","code":"not_found"}}`)
	}
}
