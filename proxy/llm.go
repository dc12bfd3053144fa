package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/memory"
)

// LLM calls the upstream model for the sidecar's own background work
// (summaries, fact extraction), never on a client's request path. It has its
// own connection pool so background calls never hold a client's connection.
type LLM struct {
	base    string // path prefix of the upstream base URL
	host    string
	up      *upClient
	apiKey  string
	model   string
	timeout time.Duration
	log     *slog.Logger
}

// LLMOptions configure NewLLM.
type LLMOptions struct {
	// Upstream is the same base URL the proxy forwards to. Required.
	Upstream string
	// APIKey, when set, is sent as a bearer token (local servers need none).
	APIKey string
	// Model, when set, names the model of every call; otherwise summaries
	// use the session's model and extraction the upstream's default.
	Model string
	// Timeout bounds one call. Default 2 minutes.
	Timeout time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// NewLLM returns a client for background completions against the upstream.
func NewLLM(o LLMOptions) (*LLM, error) {
	po := Options{Upstream: o.Upstream}
	po.setDefaults()
	base, err := po.validate()
	if err != nil {
		return nil, err
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	po.MaxIdleConnsPerHost = 4
	return &LLM{base: base.Path, host: base.Host, up: newUpClient(base, &po), apiKey: o.APIKey, model: o.Model, timeout: o.Timeout, log: o.Logger}, nil
}

// Close drops pooled connections.
func (l *LLM) Close() { l.up.closeIdle(true) }

// Complete sends one non-streamed chat completion and returns the reply text.
func (l *LLM) Complete(ctx context.Context, model, system, user string) (string, error) {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"user", user}}
	if system != "" {
		msgs = append([]msg{{"system", system}}, msgs...)
	}
	body, err := json.Marshal(struct {
		Model       string  `json:"model,omitempty"`
		Messages    []msg   `json:"messages"`
		Temperature float64 `json:"temperature"`
		Stream      bool    `json:"stream"`
	}{model, msgs, 0, false})
	if err != nil {
		return "", err
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(l.base + "/v1/chat/completions")
	req.Header.SetHost(l.host)
	req.Header.SetContentType("application/json")
	if l.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+l.apiKey)
	}
	req.SetBodyRaw(body)

	slot := new(cancelSlot)
	done := make(chan struct{})
	defer close(done)
	go func() { // the caller's context cancels the call
		select {
		case <-ctx.Done():
			slot.cancel()
		case <-done:
		}
	}()
	resp := fasthttp.AcquireResponse()
	uc, err := l.up.roundTrip(req, resp, l.timeout, l.timeout, slot)
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return "", fmt.Errorf("proxy: llm: %w", err)
	}
	ub := &upBody{u: l.up, uc: uc, r: resp.BodyStream(), idle: l.timeout, slot: slot, resp: resp, reuse: !resp.ConnectionClose()}
	b, err := readAllLimit(ub, 16<<20)
	status := resp.StatusCode()
	_ = ub.Close()
	if err != nil {
		return "", fmt.Errorf("proxy: llm: read reply: %w", err)
	}
	if status != fasthttp.StatusOK {
		return "", fmt.Errorf("proxy: llm: upstream answered %d: %.200s", status, b)
	}
	text := gjson.GetBytes(b, "choices.0.message.content")
	if !text.Exists() {
		return "", errors.New("proxy: llm: reply has no choices[0].message.content")
	}
	return text.String(), nil
}

const summaryPrompt = `You maintain a running summary of a conversation between a user and an assistant.
Merge the previous summary (if any) with the new messages into one concise summary
that keeps names, decisions, numbers, dates and open tasks. Then list durable facts
about the user, one per line, each starting with "FACT: ". Answer with the summary
first, then the FACT lines; nothing else.`

// Summarize implements memory.Summarizer with the upstream model.
func (l *LLM) Summarize(ctx context.Context, req memory.SummaryRequest) (memory.Summary, error) {
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
	model := req.Model
	if l.model != "" {
		model = l.model
	}
	out, err := l.Complete(ctx, model, summaryPrompt, b.String())
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
		return memory.Summary{}, errors.New("proxy: llm: empty summary")
	}
	return sum, nil
}

// Extractor returns a memory.Extractor that runs fact extraction and
// episodic summaries through the upstream.
func (l *LLM) Extractor() memory.Extractor {
	return memory.ExtractorFunc(func(ctx context.Context, prompt string) (string, error) {
		return l.Complete(ctx, l.model, "", prompt)
	})
}

var _ memory.Summarizer = (*LLM)(nil)
