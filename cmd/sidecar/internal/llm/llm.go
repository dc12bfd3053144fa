package llm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

// MaxReplyBytes bounds an upstream reply read by the client.
const MaxReplyBytes = 16 << 20

// Reply bounds (max_tokens) of the calls, by what each expects back. The
// engine stops generating there, so a model that rambles (or a random-
// weight test model that never emits an end token) holds a slot for a
// bounded time instead of running to its context limit.
const (
	// FactsMaxTokens bounds a fact-extraction reply: memory operations and
	// triples, one per line, each a sentence of about 25 tokens; the
	// prompt covers the messages of a few turns, which rarely give more
	// than ten facts and as many triples (about 20 lines).
	FactsMaxTokens = 512
	// EpisodeMaxTokens bounds an episode: "at most five sentences" (about
	// 150 tokens), with room for long ones.
	EpisodeMaxTokens = 256
	// SummaryMaxTokens bounds a running summary: the merged summary (a
	// paragraph or two, about 250 tokens) and a few "FACT:" lines.
	SummaryMaxTokens = 384
	// ReviewMaxTokens bounds a review round: exactly one line, a tag and a
	// reason of at most 300 bytes (about 75 tokens).
	ReviewMaxTokens = 128
	// ToolContextMaxTokens bounds a condensed tool context: one or two
	// short sentences, at most 400 bytes (memory rejects longer), about
	// 100 tokens.
	ToolContextMaxTokens = 128
	// L4MergeMaxTokens bounds an L4 merge: one line, "[MERGE]" and a fact
	// of at most 1,000 bytes (memory rejects longer; about 250 tokens of
	// English, up to about 400 of Chinese).
	L4MergeMaxTokens = 400
	// DefaultMaxTokens bounds a Call that names no bound, and an
	// extraction kind this package does not know.
	DefaultMaxTokens = 512
)

// Cut says what becomes of a reply the engine cut at its max_tokens
// (finish_reason "length").
type Cut uint8

const (
	// CutKeep keeps the reply as it is (a summary cut short still covers
	// what it says).
	CutKeep Cut = iota
	// CutLine drops its unfinished last line (a reply read line by line,
	// whose last operation may be half a sentence); nothing left is an
	// error.
	CutLine
	// CutFail makes it an error (an answer that must be whole).
	CutFail
)

// kindSpec is the bound and cut policy of each memory.ExtractRequest kind.
var kindSpec = map[string]struct {
	maxTokens int
	cut       Cut
}{
	"facts":        {FactsMaxTokens, CutLine},
	"episode":      {EpisodeMaxTokens, CutKeep},
	"review":       {ReviewMaxTokens, CutKeep}, // memory's parser rejects a cut line as malformed
	"tool_context": {ToolContextMaxTokens, CutFail},
	"l4_merge":     {L4MergeMaxTokens, CutFail}, // a merge cut short would still parse: it must be whole
}

// Router places the sidecar's own calls in the engine; engine.Hooks
// satisfies it. Before returns the body to send (req.Body when it has
// nothing to change; an error is logged and req.Body sent, except
// engine.ErrBusy: no slot could be had, and the call is not sent); After
// is called exactly once per Before with what the upstream answered
// (Status 0 when it never did). Every request carries Cancel, the cancel
// of the attempt's context: a router that cancels it with
// engine.ErrPreempted (a client needed the slot) has the call sent again
// later (Options.Preemptions).
type Router interface {
	Before(ctx context.Context, req *engine.Request) ([]byte, error)
	After(ctx context.Context, req *engine.Request, resp *engine.Response)
}

// Options configure New. Only BaseURL is required.
type Options struct {
	// BaseURL is the upstream's base URL (a trailing /v1 is fine).
	BaseURL string
	// APIKey, when set, is sent as a bearer token (local servers need none).
	APIKey string
	// Model, when set, names the model of every call; otherwise a call
	// carries the session's model, or none when that is unknown.
	Model string
	// Timeout bounds one attempt of a call: its wait for a slot (the
	// Router's Before) and the upstream's whole answer. Zero: 60 s (a
	// capped reply takes seconds on a GPU).
	Timeout time.Duration
	// Logger receives retries and router errors. Nil: slog.Default().
	Logger *slog.Logger
	// Router, when set, sees every call (see Router). Nil: calls go
	// straight to the upstream.
	Router Router
	// MaxConns bounds the connections to the upstream. Zero: 4.
	MaxConns int
	// Stream sends every call streamed (SSE) and reads the reply from its
	// events, so that a cancelled call stops the engine at its next token:
	// llama-server notices the closed connection of a non-streamed
	// request only when it polls it, once a second. False: plain JSON
	// replies.
	Stream bool
	// Preemptions is how many times a call the Router cancelled for a
	// client (engine.ErrPreempted) is sent again before it is dropped
	// (Stats.Dropped; memory retries the work after a later turn). Zero:
	// 2; negative: never.
	Preemptions int
	// PreemptBackoff is the wait before sending a preempted call again,
	// doubled for each further time. Zero: 500 ms.
	PreemptBackoff time.Duration
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. New calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxConns == 0 {
		o.MaxConns = 4
	}
	if o.Preemptions == 0 {
		o.Preemptions = 2 // negative stays: never resent
	}
	if o.PreemptBackoff == 0 {
		o.PreemptBackoff = 500 * time.Millisecond
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *Options) Validate() error {
	_, err := o.baseURL()
	return err
}

// baseURL is o.BaseURL parsed, without a trailing /v1, query or fragment.
func (o *Options) baseURL() (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(o.BaseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("llm: base URL %q: want http(s)://host[:port][/path]", o.BaseURL)
	}
	if o.Timeout < 0 || o.MaxConns < 0 || o.PreemptBackoff < 0 {
		return nil, errors.New("llm: Timeout, MaxConns and PreemptBackoff must not be negative")
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	u.RawQuery, u.Fragment = "", ""
	return u, nil
}

// Client calls the upstream for the sidecar's own work. Safe for concurrent
// use; Close it after the memory store that uses it.
type Client struct {
	opts     Options
	endpoint string
	http     *http.Client

	calls, failures, retries, preempted, dropped, truncated atomic.Int64
}

// Stats are the client's cumulative counters.
type Stats struct {
	Calls    int64 // calls made (a retried call counts once)
	Failures int64 // calls that failed after their retries (Dropped included)
	Retries  int64 // second attempts after a failure that may pass
	// Preempted counts attempts the Router cancelled for a client;
	// Dropped the calls given up after Options.Preemptions resends.
	Preempted int64
	Dropped   int64
	// Truncated counts replies the engine cut at their max_tokens.
	Truncated int64
}

// New returns a client for the upstream at o.BaseURL.
func New(o Options) (*Client, error) {
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	u, _ := o.baseURL() // Validate parsed it
	tr := &http.Transport{
		Proxy:               nil, // loopback and cluster upstreams: no environment proxy
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: o.MaxConns,
		MaxConnsPerHost:     o.MaxConns,
		// llama-server and uvicorn (vLLM, SGLang) close an idle keep-alive
		// connection after 5 s; a call sent on one they are closing fails.
		// Dropping them after 2 s keeps the pool to connections they keep.
		IdleConnTimeout:       2 * time.Second,
		ResponseHeaderTimeout: o.Timeout,
		DisableCompression:    true,
	}
	return &Client{opts: o, endpoint: u.String() + "/v1/chat/completions", http: &http.Client{Transport: tr}}, nil
}

// Close drops idle connections.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{Calls: c.calls.Load(), Failures: c.failures.Load(), Retries: c.retries.Load(),
		Preempted: c.preempted.Load(), Dropped: c.dropped.Load(), Truncated: c.truncated.Load()}
}

// Call is one completion the sidecar asks for on a session's behalf.
type Call struct {
	// Tenant and SessionID name the session; Model is its model (see
	// Options.Model).
	Tenant, SessionID, Model string
	// System, when set, is the system message; User the user message.
	System, User string
	// MaxTokens bounds the reply (max_tokens). Zero: DefaultMaxTokens.
	MaxTokens int
	// Cut is what becomes of a reply cut at MaxTokens (zero: CutKeep).
	Cut Cut
}

// model is the model of a call: the override, else the session's.
func (c *Client) model(session string) string {
	if c.opts.Model != "" {
		return c.opts.Model
	}
	return session
}

// ErrTruncated is the error of a reply cut at its max_tokens when the
// call's Cut does not accept it.
var ErrTruncated = errors.New("llm: reply cut at max_tokens")

// Complete sends one chat completion, bounded by call.MaxTokens, and
// returns the reply's text. A call the Router cancels for a client is sent
// again after a backoff (Options.Preemptions); one that fails for a reason
// that may pass (a transport error, 429, a 5xx) once more.
func (c *Client) Complete(ctx context.Context, call Call) (string, error) {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"user", call.User}}
	if call.System != "" {
		msgs = append([]msg{{"system", call.System}}, msgs...)
	}
	if call.MaxTokens <= 0 {
		call.MaxTokens = DefaultMaxTokens
	}
	model := c.model(call.Model)
	body, err := json.Marshal(struct {
		Model       string  `json:"model,omitempty"`
		Messages    []msg   `json:"messages"`
		Temperature float64 `json:"temperature"`
		MaxTokens   int     `json:"max_tokens"`
		Stream      bool    `json:"stream"`
	}{model, msgs, 0, call.MaxTokens, c.opts.Stream})
	if err != nil {
		return "", fmt.Errorf("llm: encode request: %w", err)
	}
	c.calls.Add(1)
	retried, preemptions := false, 0
	backoff := c.opts.PreemptBackoff
	for {
		var r reply
		r, err = c.attempt(ctx, call, model, body)
		if err == nil {
			return c.finish(call, r)
		}
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, engine.ErrPreempted) {
			c.preempted.Add(1)
			if preemptions >= c.opts.Preemptions {
				c.dropped.Add(1)
				c.opts.Logger.Info("llm: background call preempted by clients; dropped until a later turn",
					"session", call.SessionID, "times", preemptions+1)
				break
			}
			preemptions++
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				c.failures.Add(1)
				return "", fmt.Errorf("llm: %w (waiting to resend a preempted call)", context.Cause(ctx))
			}
			backoff *= 2
			continue
		}
		if retried || !retryable(err) {
			break
		}
		retried = true
		c.retries.Add(1)
		c.opts.Logger.Warn("llm: background call failed, retrying once", "session", call.SessionID, "err", err)
	}
	c.failures.Add(1)
	if errors.Is(err, engine.ErrPreempted) || errors.Is(err, engine.ErrBusy) {
		err = fmt.Errorf("%w: %w", memory.ErrDeferred, err) // by design: memory retries later
	}
	return "", err
}

// finish applies the call's Cut to a reply.
func (c *Client) finish(call Call, r reply) (string, error) {
	if !r.truncated {
		return r.text, nil
	}
	c.truncated.Add(1)
	switch call.Cut {
	case CutLine:
		i := strings.LastIndexByte(r.text, '\n')
		if i < 0 || strings.TrimSpace(r.text[:i]) == "" {
			return "", fmt.Errorf("%w (%d tokens): no whole line", ErrTruncated, call.MaxTokens)
		}
		return r.text[:i+1], nil
	case CutFail:
		return "", fmt.Errorf("%w (%d tokens)", ErrTruncated, call.MaxTokens)
	}
	return r.text, nil
}

// statusError is an upstream answer other than 200 (or an error event in
// a stream).
type statusError struct {
	status int
	body   []byte
}

func (e *statusError) Error() string {
	return fmt.Sprintf("llm: upstream answered %d: %.200s", e.status, e.body)
}

// retryable reports failures that a second attempt may not meet: transport
// errors (not the caller's cancellation), 429 and 5xx answers.
func retryable(err error) bool {
	var se *statusError
	if errors.As(err, &se) {
		return se.status == http.StatusTooManyRequests || se.status >= 500
	}
	var parse *replyError
	if errors.As(err, &parse) {
		return false
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, engine.ErrBusy)
}

// replyError is a 200 answer without the expected content.
type replyError struct{ msg string }

func (e *replyError) Error() string { return "llm: " + e.msg }

// reply is what an attempt read: the text, whether the engine cut it at
// max_tokens, and the body the Router's After is given (the JSON answer,
// or the stream's last event carrying timings or usage).
type reply struct {
	status    int
	text      string
	truncated bool
	meta      []byte
}

// attempt sends the call once, through the router when there is one,
// bounded by Options.Timeout. A cancellation by the router for a client is
// an error wrapping engine.ErrPreempted.
func (c *Client) attempt(ctx context.Context, call Call, model string, body []byte) (reply, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	tctx, cancelT := context.WithTimeout(actx, c.opts.Timeout)
	defer cancelT()
	var ereq *engine.Request
	send := body
	if c.opts.Router != nil {
		ereq = &engine.Request{Tenant: call.Tenant, SessionID: call.SessionID, Model: model, Body: body, Background: true, Cancel: cancel}
		b, err := c.opts.Router.Before(tctx, ereq)
		if errors.Is(err, engine.ErrBusy) {
			c.opts.Router.After(context.WithoutCancel(ctx), ereq, &engine.Response{})
			return reply{}, fmt.Errorf("llm: %w", err)
		}
		if err != nil {
			c.opts.Logger.Warn("llm: engine before-hook failed; sending anyway", "session", call.SessionID, "err", err)
		}
		if len(b) > 0 {
			send = b
		}
	}
	r, err := c.post(tctx, send)
	if ereq != nil {
		c.opts.Router.After(context.WithoutCancel(ctx), ereq, &engine.Response{Status: r.status, Stream: c.opts.Stream, Body: r.meta})
	}
	if err != nil && errors.Is(context.Cause(actx), engine.ErrPreempted) && ctx.Err() == nil {
		return reply{}, fmt.Errorf("llm: %w", engine.ErrPreempted)
	}
	return r, err
}

// post sends body and reads the whole answer (bounded): a JSON reply, or a
// stream of events when the upstream answers text/event-stream.
func (c *Client) post(ctx context.Context, body []byte) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return reply{}, fmt.Errorf("llm: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	}
	// A temperature-0 completion may be sent twice: marked replayable
	// (without sending the header), net/http retries it when a reused
	// connection turns out closed before the server read it.
	req.Header["Idempotency-Key"] = nil
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			// The upstream may have restarted: its kept-alive connections
			// are dead too.
			c.http.CloseIdleConnections()
		}
		return reply{}, fmt.Errorf("llm: %w", err)
	}
	defer resp.Body.Close()
	r := reply{status: resp.StatusCode}
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return readStream(resp.Body, r)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxReplyBytes+1))
	if err != nil {
		return r, fmt.Errorf("llm: read reply: %w", err)
	}
	if len(data) > MaxReplyBytes {
		return r, &replyError{fmt.Sprintf("reply exceeds %d bytes", MaxReplyBytes)}
	}
	r.meta = data
	if resp.StatusCode != http.StatusOK {
		return r, &statusError{status: resp.StatusCode, body: data}
	}
	text := gjson.GetBytes(data, "choices.0.message.content")
	if !text.Exists() {
		return r, &replyError{"reply has no choices[0].message.content"}
	}
	r.text = text.String()
	r.truncated = gjson.GetBytes(data, "choices.0.finish_reason").String() == "length"
	return r, nil
}

// readStream reads a chat completion stream: the content deltas of
// choice 0, its finish_reason, and the last event carrying timings or
// usage (r.meta). An error event is a *statusError; a stream that ends
// without a finish_reason or [DONE] is a transport error.
func readStream(body io.Reader, r reply) (reply, error) {
	br := bufio.NewReaderSize(body, 64<<10)
	var text strings.Builder
	read, finished := 0, false
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// One event longer than the buffer: read it whole, bounded.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) && len(long) <= MaxReplyBytes {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		read += len(line)
		if read > MaxReplyBytes {
			return r, &replyError{fmt.Sprintf("reply exceeds %d bytes", MaxReplyBytes)}
		}
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if bytes.Equal(data, []byte("[DONE]")) {
				break
			}
			if e := gjson.GetBytes(data, "error"); e.Exists() {
				status := int(e.Get("code").Int())
				if status < 400 {
					status = http.StatusInternalServerError
				}
				r.status = status
				return r, &statusError{status: status, body: append([]byte(nil), data...)}
			}
			ch := gjson.GetBytes(data, "choices.0")
			text.WriteString(ch.Get("delta.content").String())
			if f := ch.Get("finish_reason"); f.Exists() && f.Type != gjson.Null {
				finished = true
				r.truncated = f.String() == "length"
			}
			if gjson.GetBytes(data, "timings").Exists() || gjson.GetBytes(data, "usage").Exists() {
				r.meta = append(r.meta[:0], data...)
			}
		}
		if err == io.EOF {
			if !finished {
				return r, fmt.Errorf("llm: read reply: %w", io.ErrUnexpectedEOF)
			}
			break
		}
		if err != nil {
			return r, fmt.Errorf("llm: read reply: %w", err)
		}
	}
	r.text = text.String()
	return r, nil
}

const summaryPrompt = `You maintain a running summary of a conversation between a user and an assistant.
Merge the previous summary (if any) with the new messages into one concise summary
that keeps names, decisions, numbers, dates and open tasks. Then list durable facts
about the user, one per line, each starting with "FACT: ". Answer with the summary
first, then the FACT lines; nothing else.`

// Summarize implements memory.Summarizer with the upstream model.
func (c *Client) Summarize(ctx context.Context, req memory.SummaryRequest) (memory.Summary, error) {
	var b strings.Builder
	if req.Previous != "" {
		b.WriteString("Previous summary:\n")
		b.WriteString(req.Previous)
		b.WriteString("\n\n")
	}
	b.WriteString("New messages:\n")
	for _, m := range req.Messages {
		fmt.Fprintf(&b, "%s: %s\n", m.Role, m.Content)
	}
	out, err := c.Complete(ctx, Call{Tenant: req.Tenant, SessionID: req.SessionID, Model: req.Model, System: summaryPrompt, User: b.String(),
		MaxTokens: SummaryMaxTokens, Cut: CutLine})
	if err != nil {
		return memory.Summary{}, err
	}
	var sum memory.Summary
	var text []string
	for _, line := range strings.Split(out, "\n") {
		if f, ok := strings.CutPrefix(strings.TrimSpace(line), "FACT:"); ok {
			if f = strings.TrimSpace(f); f != "" {
				sum.Facts = append(sum.Facts, f)
			}
			continue
		}
		text = append(text, line)
	}
	sum.Text = strings.TrimSpace(strings.Join(text, "\n"))
	if sum.Text == "" {
		return memory.Summary{}, errors.New("llm: empty summary")
	}
	return sum, nil
}

// Extract implements memory.Extractor with the upstream model; the
// request's Kind decides the reply's bound (FactsMaxTokens, …).
func (c *Client) Extract(ctx context.Context, req memory.ExtractRequest) (string, error) {
	spec, ok := kindSpec[req.Kind]
	if !ok {
		spec.maxTokens, spec.cut = DefaultMaxTokens, CutKeep
	}
	return c.Complete(ctx, Call{Tenant: req.Tenant, SessionID: req.SessionID, Model: req.Model, User: req.Prompt,
		MaxTokens: spec.maxTokens, Cut: spec.cut})
}

var (
	_ memory.Summarizer = (*Client)(nil)
	_ memory.Extractor  = (*Client)(nil)
	_ Router            = (*engine.Hooks)(nil)
)
