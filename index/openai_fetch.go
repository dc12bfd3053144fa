package index

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

type embeddingsRequest struct {
	Model          string   `json:"model,omitempty"`
	Input          []string `json:"input"`
	EncodingFormat string   `json:"encoding_format"`
}

type embeddingsResponse struct {
	Model string `json:"model"`
	Data  []struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
}

// connError is a request that got no HTTP answer; reused says it went out
// on a pooled keep-alive connection (which the server may have closed).
type connError struct {
	err    error
	reused bool
}

func (c *connError) Error() string { return c.err.Error() }
func (c *connError) Unwrap() error { return c.err }

// fetchBatch embeds texts (distinct, not cached) in one request, sent again
// after a failure as OpenAIOptions.Retries says and with the texts cut
// shorter while the server answers that an input is too large. gen is the
// space generation the caller started in: an answer in another space than
// the current one either moves the embedder to it (errSpaceMoved, the
// answer cached under the new space) or, when the space already moved
// since gen, is refused (errSpaceMoved: an answer of the old server).
//
// A limit lowered for this batch is kept only when the batch then
// succeeds: a refusal no cut cured was not about length.
func (e *OpenAIEmbedder) fetchBatch(ctx context.Context, gen uint64, texts []string) (_ [][]float32, err error) {
	retries, cuts := 0, 0
	e.mu.Lock()
	before := e.inputCap
	e.mu.Unlock()
	defer func() {
		if err != nil && !errors.Is(err, errSpaceMoved) && cuts > 0 {
			e.mu.Lock()
			e.inputCap = max(e.inputCap, before)
			e.mu.Unlock()
		}
	}()
	for {
		e.mu.Lock()
		limit := e.inputCap
		e.mu.Unlock()
		send, cut := truncateAll(texts, limit)
		var vecs [][]float32
		var model string
		vecs, model, err = e.post(ctx, send)
		if err == nil {
			e.mu.Lock()
			e.st.Truncated += int64(cut)
			e.st.Embedded += int64(len(texts))
			e.mu.Unlock()
			return e.adopt(gen, texts, vecs, model)
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if n, ok := tooLarge(err, send); ok && cuts < 16 {
			if e.lowerCap(n, limit) {
				cuts++
				continue
			}
			return nil, err
		}
		if !retryable(ctx, err) || retries >= e.o.Retries {
			return nil, err
		}
		retries++
		e.mu.Lock()
		e.st.Retries++
		e.mu.Unlock()
		var ce *connError
		if errors.As(err, &ce) && ce.reused {
			continue // a keep-alive connection the server closed: at once
		}
		t := time.NewTimer(e.o.Backoff << (retries - 1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

// adopt checks an answer's vector space against the embedder's; see
// fetchBatch.
func (e *OpenAIEmbedder) adopt(gen uint64, texts []string, vecs [][]float32, model string) ([][]float32, error) {
	dim := len(vecs[0])
	space := fmt.Sprintf("%s/d%d", model, dim)
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.o.Dim > 0 && dim != e.o.Dim:
		return nil, fmt.Errorf("index: embeddings POST %s: dimension %d, want %d: %w", e.url, dim, e.o.Dim, ErrEmbed)
	case e.space == "":
		e.space, e.dim = space, dim
		return vecs, nil
	case space == e.space:
		return vecs, nil
	case gen != e.gen:
		return nil, errSpaceMoved // an answer from before the change
	}
	e.o.Logger.Warn("embeddings: the server's vector space changed (restarted with another model?): cached vectors dropped, indexes re-embed their documents",
		"url", e.url, "from", e.space, "to", space)
	e.space, e.dim = space, dim
	e.gen++
	e.st.SpaceChanges++
	e.dropCache()
	for i, v := range vecs {
		e.put(e.key(texts[i]), v)
	}
	return nil, errSpaceMoved
}

// post sends one request and validates the answer: one finite vector per
// input, all of one dimension. It returns the answer's model name.
func (e *OpenAIEmbedder) post(ctx context.Context, batch []string) ([][]float32, string, error) {
	body, err := json.Marshal(embeddingsRequest{Model: e.o.Model, Input: batch, EncodingFormat: "float"})
	if err != nil {
		return nil, "", fmt.Errorf("index: embeddings request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
	defer cancel()
	var reused bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return nil, "", fmt.Errorf("index: embeddings request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if e.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+e.o.APIKey)
	}
	start := time.Now()
	defer func() {
		e.mu.Lock()
		e.st.Requests++
		e.st.RequestSeconds += time.Since(start).Seconds()
		e.mu.Unlock()
	}()
	resp, err := e.o.Client.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("index: embeddings POST %s: %w: %w", e.url, ErrEmbed, &connError{err: err, reused: reused})
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, e.o.MaxResponseBytes+1))
	if err != nil {
		return nil, "", fmt.Errorf("index: embeddings POST %s: read: %w: %w", e.url, ErrEmbed, &connError{err: err})
	}
	if resp.StatusCode/100 != 2 {
		return nil, "", fmt.Errorf("index: embeddings POST %s: %w: %w", e.url, ErrEmbed, &HTTPError{StatusCode: resp.StatusCode, Message: errorMessage(raw)})
	}
	if int64(len(raw)) > e.o.MaxResponseBytes {
		return nil, "", fmt.Errorf("index: embeddings POST %s: response over %d bytes: %w", e.url, e.o.MaxResponseBytes, ErrEmbed)
	}
	var r embeddingsResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, "", fmt.Errorf("index: embeddings POST %s: decode: %w: %w", e.url, ErrEmbed, err)
	}
	if len(r.Data) != len(batch) {
		return nil, "", fmt.Errorf("index: embeddings POST %s: %d embeddings for %d inputs: %w", e.url, len(r.Data), len(batch), ErrEmbed)
	}
	out := make([][]float32, len(batch))
	for _, d := range r.Data {
		if d.Index < 0 || d.Index >= len(batch) || out[d.Index] != nil {
			return nil, "", fmt.Errorf("index: embeddings POST %s: bad or repeated index %d: %w", e.url, d.Index, ErrEmbed)
		}
		if len(d.Embedding) == 0 {
			return nil, "", fmt.Errorf("index: embeddings POST %s: empty embedding: %w", e.url, ErrEmbed)
		}
		if len(d.Embedding) != len(r.Data[0].Embedding) {
			return nil, "", fmt.Errorf("index: embeddings POST %s: dimensions %d and %d in one answer: %w",
				e.url, len(r.Data[0].Embedding), len(d.Embedding), ErrEmbed)
		}
		for _, f := range d.Embedding {
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				return nil, "", fmt.Errorf("index: embeddings POST %s: non-finite value: %w", e.url, ErrEmbed)
			}
		}
		out[d.Index] = d.Embedding
	}
	return out, r.Model, nil
}

// retryable reports whether a failed request may succeed if sent again:
// no answer (a broken connection, this attempt's timeout), 408, 429 or a
// 5xx.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var he *HTTPError
	if errors.As(err, &he) {
		return he.StatusCode == http.StatusRequestTimeout || he.StatusCode == http.StatusTooManyRequests || he.StatusCode >= 500
	}
	var ce *connError
	return errors.As(err, &ce)
}

// tooLargeRE matches what servers answer for an input longer than they
// take: llama.cpp "input (601 tokens) is too large to process. increase
// the physical batch size (current batch size: 512)", vLLM and OpenAI
// "maximum context length is 8192 tokens", TEI "must have less than 512
// tokens".
var (
	tooLargeRE = regexp.MustCompile(`(?i)too (large|long)|maximum context length|context length|exceeds? the|less than \d+ tokens|physical batch`)
	llamaLenRE = regexp.MustCompile(`input \((\d+) tokens\).*current batch size: (\d+)`)
)

// tooLarge reports whether err says an input was too long, and if so the
// length in bytes the longest input of send should be cut to: in
// proportion when the message gives tokens and the limit (llama.cpp),
// else half.
func tooLarge(err error, send []string) (int, bool) {
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode < 400 || !tooLargeRE.MatchString(he.Message) {
		return 0, false
	}
	longest := 0
	for _, s := range send {
		longest = max(longest, len(s))
	}
	want := longest / 2
	if m := llamaLenRE.FindStringSubmatch(he.Message); m != nil {
		n, _ := strconv.Atoi(m[1])
		limit, _ := strconv.Atoi(m[2])
		if n > 0 && limit > 0 && limit < n {
			want = int(float64(longest) * float64(limit) / float64(n) * 0.9)
		}
	}
	return min(want, longest-1), true
}

// lowerCap lowers the input limit to n bytes (at least minInputBytes); it
// reports whether the limit went below was, the one the failed request was
// cut to (another call may have lowered it meanwhile).
func (e *OpenAIEmbedder) lowerCap(n, was int) bool {
	n = max(n, minInputBytes)
	e.mu.Lock()
	defer e.mu.Unlock()
	if n < e.inputCap {
		e.o.Logger.Info("embeddings: the server refused an input as too large: inputs are cut", "url", e.url, "bytes", n)
		e.inputCap = n
	}
	return e.inputCap < was
}

// truncateAll returns texts with each cut to limit bytes at a character
// boundary, and how many were cut; texts itself when none is.
func truncateAll(texts []string, limit int) ([]string, int) {
	var out []string
	cut := 0
	for i, t := range texts {
		if len(t) <= limit {
			continue
		}
		if out == nil {
			out = append([]string(nil), texts...)
		}
		n := limit
		for n > 0 && !utf8.RuneStart(t[n]) {
			n--
		}
		out[i] = t[:n]
		cut++
	}
	if out == nil {
		return texts, 0
	}
	return out, cut
}

// errorMessage extracts an OpenAI-style error message, else the body's
// first 256 bytes.
func errorMessage(raw []byte) string {
	var r struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &r) == nil && r.Error.Message != "" {
		return r.Error.Message
	}
	if len(raw) > 256 {
		raw = raw[:256]
	}
	return strings.TrimSpace(string(raw))
}
