package llm

import (
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

// Router places the sidecar's own calls in the engine; engine.Connector
// satisfies it. Before returns the body to send (req.Body when it has
// nothing to change; an error is logged and req.Body sent); After is called
// exactly once per Before with what the upstream answered (Status 0 when it
// never did).
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
	// Timeout bounds one attempt of a call. Zero: 2 minutes.
	Timeout time.Duration
	// Logger receives retries and router errors. Nil: slog.Default().
	Logger *slog.Logger
	// Router, when set, sees every call (see Router). Nil: calls go
	// straight to the upstream.
	Router Router
	// MaxConns bounds the connections to the upstream. Zero: 4.
	MaxConns int
}

func (o *Options) ensureDefaults() {
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxConns == 0 {
		o.MaxConns = 4
	}
}

func (o *Options) validate() (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(o.BaseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("llm: base URL %q: want http(s)://host[:port][/path]", o.BaseURL)
	}
	if o.Timeout < 0 || o.MaxConns < 0 {
		return nil, errors.New("llm: Timeout and MaxConns must not be negative")
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

	calls, failures, retries atomic.Int64
}

// Stats are the client's cumulative counters.
type Stats struct {
	Calls    int64 // calls made (a retried call counts once)
	Failures int64 // calls that failed after their retry
	Retries  int64 // second attempts
}

// New returns a client for the upstream at o.BaseURL.
func New(o Options) (*Client, error) {
	o.ensureDefaults()
	u, err := o.validate()
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy:                 nil, // loopback and cluster upstreams: no environment proxy
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   o.MaxConns,
		MaxConnsPerHost:       o.MaxConns,
		IdleConnTimeout:       90 * time.Second,
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
	return Stats{Calls: c.calls.Load(), Failures: c.failures.Load(), Retries: c.retries.Load()}
}

// Call is one completion the sidecar asks for on a session's behalf.
type Call struct {
	// Tenant and SessionID name the session; Model is its model (see
	// Options.Model).
	Tenant, SessionID, Model string
	// System, when set, is the system message; User the user message.
	System, User string
}

// model is the model of a call: the override, else the session's.
func (c *Client) model(session string) string {
	if c.opts.Model != "" {
		return c.opts.Model
	}
	return session
}

// Complete sends one non-streamed chat completion and returns the reply's
// text.
func (c *Client) Complete(ctx context.Context, call Call) (string, error) {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"user", call.User}}
	if call.System != "" {
		msgs = append([]msg{{"system", call.System}}, msgs...)
	}
	model := c.model(call.Model)
	body, err := json.Marshal(struct {
		Model       string  `json:"model,omitempty"`
		Messages    []msg   `json:"messages"`
		Temperature float64 `json:"temperature"`
		Stream      bool    `json:"stream"`
	}{model, msgs, 0, false})
	if err != nil {
		return "", fmt.Errorf("llm: encode request: %w", err)
	}
	c.calls.Add(1)
	var text string
	for attempt := 0; ; attempt++ {
		text, err = c.attempt(ctx, call, model, body)
		if err == nil {
			return text, nil
		}
		if attempt > 0 || !retryable(err) || ctx.Err() != nil {
			break
		}
		c.retries.Add(1)
		c.opts.Logger.Warn("llm: background call failed, retrying once", "session", call.SessionID, "err", err)
	}
	c.failures.Add(1)
	return "", err
}

// statusError is an upstream answer other than 200.
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
	return !errors.Is(err, context.Canceled)
}

// replyError is a 200 answer without the expected content.
type replyError struct{ msg string }

func (e *replyError) Error() string { return "llm: " + e.msg }

// attempt sends the call once, through the router when there is one.
func (c *Client) attempt(ctx context.Context, call Call, model string, body []byte) (string, error) {
	var ereq *engine.Request
	send := body
	if c.opts.Router != nil {
		ereq = &engine.Request{Tenant: call.Tenant, SessionID: call.SessionID, Model: model, Body: body, Background: true}
		b, err := c.opts.Router.Before(ctx, ereq)
		if err != nil {
			c.opts.Logger.Warn("llm: engine before-hook failed; sending anyway", "session", call.SessionID, "err", err)
		}
		if len(b) > 0 {
			send = b
		}
	}
	status, reply, err := c.post(ctx, send)
	if ereq != nil {
		c.opts.Router.After(context.WithoutCancel(ctx), ereq, &engine.Response{Status: status, Body: reply})
	}
	if err != nil {
		return "", err
	}
	if status != http.StatusOK {
		return "", &statusError{status: status, body: reply}
	}
	text := gjson.GetBytes(reply, "choices.0.message.content")
	if !text.Exists() {
		return "", &replyError{"reply has no choices[0].message.content"}
	}
	return text.String(), nil
}

// post sends body and reads the whole answer (bounded).
func (c *Client) post(ctx context.Context, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("llm: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("llm: %w", err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, MaxReplyBytes+1))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("llm: read reply: %w", err)
	}
	if len(reply) > MaxReplyBytes {
		return resp.StatusCode, nil, &replyError{fmt.Sprintf("reply exceeds %d bytes", MaxReplyBytes)}
	}
	return resp.StatusCode, reply, nil
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
	out, err := c.Complete(ctx, Call{Tenant: req.Tenant, SessionID: req.SessionID, Model: req.Model, System: summaryPrompt, User: b.String()})
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

// Extract implements memory.Extractor with the upstream model.
func (c *Client) Extract(ctx context.Context, req memory.ExtractRequest) (string, error) {
	return c.Complete(ctx, Call{Tenant: req.Tenant, SessionID: req.SessionID, Model: req.Model, User: req.Prompt})
}

var (
	_ memory.Summarizer = (*Client)(nil)
	_ memory.Extractor  = (*Client)(nil)
	_ Router            = engine.Connector(nil)
)
