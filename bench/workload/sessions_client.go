package workload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// chatMsg is one message of a full-history client.
type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// turnResult is what one streamed chat request showed the client.
type turnResult struct {
	Reply    string
	TTFT     time.Duration // request sent → first content delta
	Total    time.Duration
	PromptN  int64 // llama.cpp's timings.prompt_n: tokens reprocessed
	CacheN   int64 // timings.cache_n: tokens reused
	PromptMs float64
}

// Grammar keeps a random-weight model's output parseable (see
// ../shared/llama/README.md).
const sessionsGrammar = "root ::= [a-z ]+"

// streamTurn sends one streamed chat completion to base (a server root,
// without /v1) and reads it to the end. user, when set, is the OpenAI
// "user" field: the end user the session belongs to.
func streamTurn(ctx context.Context, client *http.Client, base, session, user string, msgs []chatMsg, maxTokens int) (turnResult, error) {
	var r turnResult
	fields := map[string]any{
		"model": "tiny", "messages": msgs, "stream": true,
		"max_tokens": maxTokens, "grammar": sessionsGrammar, "temperature": 0,
	}
	if user != "" {
		fields["user"] = user
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return r, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return r, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench-sessions")
	req.Header.Set("X-Session-ID", session)
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return r, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var reply strings.Builder
	timed, done := false, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte("event: error")) {
			return r, fmt.Errorf("stream broke: %s", line)
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
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Timings *struct {
				PromptN  int64   `json:"prompt_n"`
				CacheN   int64   `json:"cache_n"`
				PromptMs float64 `json:"prompt_ms"`
			} `json:"timings"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return r, fmt.Errorf("bad event %.200s: %w", data, err)
		}
		if len(ev.Error) > 0 {
			return r, fmt.Errorf("error event: %.300s", ev.Error)
		}
		for _, c := range ev.Choices {
			if c.Delta.Content != "" && r.TTFT == 0 {
				r.TTFT = time.Since(t0)
			}
			reply.WriteString(c.Delta.Content)
		}
		if ev.Timings != nil {
			r.PromptN, r.CacheN, r.PromptMs, timed = ev.Timings.PromptN, ev.Timings.CacheN, ev.Timings.PromptMs, true
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	r.Total = time.Since(t0)
	if r.TTFT == 0 {
		r.TTFT = r.Total
	}
	r.Reply = reply.String()
	switch {
	case !done:
		return r, fmt.Errorf("stream ended without [DONE]")
	case !timed:
		return r, fmt.Errorf("no timings in the stream (is the upstream llama.cpp's server?)")
	}
	return r, nil
}

// sessionsWords are the words of the documents: distinct documents are
// different random sequences of them.
var sessionsWords = strings.Fields(`ledger harbor copper violet meadow cable orbit lantern quartz saddle
timber walnut engine glacier pepper signal canyon marble thunder velvet basket falcon garden
hammer island jacket kettle ladder mirror needle oyster pillow rocket silver tunnel umbrella
window yellow zipper anchor bridge candle dragon feather goblet helmet insect jungle kingdom
lemon magnet nickel orange parrot quiver ribbon spider tomato unicorn valley wagon xylophone
yacht zebra account balance contract deliver estimate freight invoice journal margin payment
quarter receipt schedule transfer vendor warrant budget capital deposit equity forecast grant
river mountain forest desert ocean prairie tundra volcano lagoon plateau delta estuary summit`)

// sessionDoc returns a document of about tokens tokens (per tokensPerWord,
// measured on the server's tokenizer) for one session: numbered sentences
// of random words, distinct per seed.
func sessionDoc(seed uint64, words int) string {
	rng := rand.New(rand.NewPCG(seed, 0x5e55))
	var b strings.Builder
	fmt.Fprintf(&b, "Reference document %d.", seed)
	n := 0
	for s := 1; n < words; s++ {
		fmt.Fprintf(&b, " Item %d:", s)
		k := 6 + rng.IntN(8)
		for i := 0; i < k && n < words; i++ {
			b.WriteByte(' ')
			b.WriteString(sessionsWords[rng.IntN(len(sessionsWords))])
			if rng.IntN(5) == 0 {
				fmt.Fprintf(&b, " %d", rng.IntN(1000))
			}
			n++
		}
		b.WriteByte('.')
	}
	return b.String()
}

// sessionFollowUp is the question a session asks right after its round's
// first (SessionsOptions.FollowUp), about as long.
func sessionFollowUp(session, round int) string {
	return fmt.Sprintf("And item %d, %s?", 1+(session*11+round*7)%40, sessionsWords[(session*5+round*3)%len(sessionsWords)])
}

// sessionQuestion is the user message of one session's turn: short, as
// users' follow-ups are (about 25 tokens of the tiny model's byte-level
// vocabulary; its chat template adds about 60 per turn).
func sessionQuestion(session, round int) string {
	return fmt.Sprintf("Item %d, %s?", 1+(session*7+round*3)%40, sessionsWords[(session*13+round*5)%len(sessionsWords)])
}
