package workload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// turnRecord is what one streamed request showed the client, timed as
// vLLM's openai-chat request function times it.
type turnRecord struct {
	// TTFT is request sent → the first chunk carrying generated text
	// (content, reasoning or a tool call).
	TTFT time.Duration
	// ITL holds the gap before each later chunk carrying choices.
	ITL []time.Duration
	// E2EL is request sent → the last data event before [DONE].
	E2EL time.Duration
	// OutputTokens is usage.completion_tokens where the server reports it,
	// else the chunks that carried text.
	OutputTokens int64
	// PromptTokens is usage.prompt_tokens (or llama.cpp's prompt_n +
	// cache_n); -1 when the server reports neither.
	PromptTokens int64
	// CachedTokens is usage.prompt_tokens_details.cached_tokens, else
	// llama.cpp's timings.cache_n; -1 when the server reports neither.
	CachedTokens int64
	Reply        string
	Err          error
}

// sendTurn sends one streamed chat completion with the conversation's
// session headers and reads it to the end.
func sendTurn(ctx context.Context, c *http.Client, base string, o ServeOptions, extra map[string]json.RawMessage,
	session string, msgs []chatMsg) turnRecord {
	rec := turnRecord{PromptTokens: -1, CachedTokens: -1}
	fields := map[string]any{
		"model": o.Model, "messages": msgs, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
		"max_tokens":     o.MaxTokens, "temperature": 0,
	}
	for k, v := range extra {
		fields[k] = v
	}
	body, err := json.Marshal(fields)
	if err != nil {
		rec.Err = err
		return rec
	}
	ctx, cancel := context.WithTimeout(ctx, o.RequestTimeout)
	defer cancel()
	t0 := time.Now()
	var resp *http.Response
	// A server may close a keep-alive connection (after an error answer,
	// or idle) just as the next request is written to it; Go's transport
	// does not resend a POST then. Such a request is sent again, on
	// another connection, twice at most; its times count from the first
	// attempt.
	for attempt := 0; ; attempt++ {
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, chatURL(base), bytes.NewReader(body))
		if err != nil {
			rec.Err = err
			return rec
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
		req.Header.Set("X-Session-ID", session)
		resp, err = c.Do(req)
		if err == nil {
			break
		}
		if !reused || attempt == 2 || ctx.Err() != nil {
			rec.Err = err
			return rec
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		rec.Err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		return rec
	}
	rec.Err = readStream(resp.Body, t0, &rec)
	return rec
}

// readStream reads an SSE chat completion stream into rec, timing each
// event from t0.
func readStream(body io.Reader, t0 time.Time, rec *turnRecord) error {
	var (
		reply      strings.Builder
		last       = t0
		done       bool
		first      bool // a chunk with text came
		textChunks int64
		usage      bool
	)
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte("event:")) && bytes.Contains(line, []byte("error")) {
			return fmt.Errorf("stream broke: %s", line)
		}
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			done = true
			break
		}
		now := time.Now()
		if !gjson.ValidBytes(data) {
			return fmt.Errorf("bad event %.200q", data)
		}
		ev := gjson.ParseBytes(data)
		if e := ev.Get("error"); e.Exists() {
			return fmt.Errorf("error event: %.300s", e.Raw)
		}
		if ch := ev.Get("choices"); ch.IsArray() && len(ch.Array()) > 0 {
			d := ch.Get("0.delta")
			text := d.Get("content").String() + d.Get("reasoning_content").String() + d.Get("reasoning").String()
			hasText := text != "" || d.Get("tool_calls").Exists()
			switch {
			case !first && hasText:
				rec.TTFT, first = now.Sub(t0), true
			case first:
				rec.ITL = append(rec.ITL, now.Sub(last))
			}
			if hasText {
				textChunks++
			}
			reply.WriteString(d.Get("content").String())
		}
		if u := ev.Get("usage"); u.IsObject() {
			if v := u.Get("completion_tokens"); v.Exists() {
				rec.OutputTokens, usage = v.Int(), true
			}
			if v := u.Get("prompt_tokens"); v.Exists() {
				rec.PromptTokens = v.Int()
			}
			if v := u.Get("prompt_tokens_details.cached_tokens"); v.Exists() {
				rec.CachedTokens = v.Int()
			}
		}
		if t := ev.Get("timings"); t.IsObject() && rec.CachedTokens < 0 {
			if v := t.Get("cache_n"); v.Exists() {
				rec.CachedTokens = v.Int()
				if rec.PromptTokens < 0 {
					rec.PromptTokens = v.Int() + t.Get("prompt_n").Int()
				}
			}
		}
		last = now
	}
	if err := sc.Err(); err != nil {
		return err
	}
	rec.E2EL = last.Sub(t0)
	rec.Reply = reply.String()
	if !usage {
		rec.OutputTokens = textChunks
	}
	switch {
	case !done:
		return errors.New("stream ended without [DONE]")
	case !first:
		return errors.New("no generated text in the stream")
	}
	return nil
}
