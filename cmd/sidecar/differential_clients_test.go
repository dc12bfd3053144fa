package main

// The clients of the differential test (differential_test.go): who they
// are, what they send each round, and one turn with its retry.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// diffKind is how a client talks to a session.
type diffKind int

const (
	// diffDropIn sends the system message and the newest user message only,
	// with X-Session-ID: what most memory-layer clients do.
	diffDropIn diffKind = iota
	// diffFull sends the whole conversation every turn.
	diffFull
	// diffTools sends the whole conversation; every other turn (the odd
	// rounds) ends with the assistant's tool call and the tool's result
	// (the tiny model cannot call tools itself, so the client plays the
	// app's tool loop).
	diffTools
)

func (k diffKind) String() string {
	return [...]string{"drop-in", "full-history", "tools"}[k]
}

// diffClient is one conversation of the app. Every client uses the app's
// one API key; the end user is the X-User-ID when the client sends one,
// else the session itself.
type diffClient struct {
	name    string // c0, c1, …: also the marker of its messages
	kind    diffKind
	stream  bool
	user    string // X-User-ID; "" sends none
	endUser string
	word    string // the end user's private word, in every user message
	session string // X-Session-ID
	system  string
	// msgChars is the length of each user message (and of each tool
	// result), in characters.
	msgChars int
	seed     uint64
}

// diffPopulation returns the app's clients for one variant: four drop-in
// and three full-history ones (one with tool results), streamed and not,
// two of them one named end user, one another named end user, the rest
// with no user id. sizes gives the message lengths in characters.
func diffPopulation(variant string, rng *rand.Rand, sizes diffSizes) []*diffClient {
	cs := []*diffClient{
		{kind: diffDropIn},
		{kind: diffDropIn, stream: true},
		{kind: diffDropIn, user: "alice"},
		{kind: diffDropIn, stream: true, user: "alice"},
		{kind: diffFull, stream: true},
		{kind: diffFull},
		{kind: diffTools, user: "bob"},
	}
	words := map[string]string{}
	for i, c := range cs {
		c.name = fmt.Sprintf("c%d", i)
		c.session = fmt.Sprintf("diff-%s-%s", variant, c.name)
		c.endUser = c.user
		if c.endUser == "" {
			c.endUser = "session " + c.session
		}
		if words[c.endUser] == "" {
			words[c.endUser] = privateWord(rng)
		}
		c.word = words[c.endUser]
		c.seed = uint64(i+1) * 7919
		system := sizes.system
		switch c.kind {
		case diffDropIn:
			c.msgChars = sizes.dropIn
		case diffFull:
			c.msgChars = sizes.full
		case diffTools:
			c.msgChars, system = sizes.tools, sizes.toolsSystem
		}
		c.system = "You are the assistant of a notes app. The user's notes follow. " + filler(c.seed, system)
	}
	return cs
}

// diffSizes are the lengths, in characters, of what the clients send: the
// system message's notes, and each user message (and tool result) of the
// three kinds of clients.
type diffSizes struct{ system, dropIn, full, tools, toolsSystem int }

// privateWord is a random word of 10 lowercase letters: no filler word,
// template or model reply holds it by chance.
func privateWord(rng *rand.Rand) string {
	b := make([]byte, 10)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return string(b)
}

var fillerWords = strings.Fields(`ledger harbor copper violet meadow cable orbit lantern quartz saddle
timber walnut engine glacier pepper signal canyon marble thunder velvet basket falcon garden
hammer island jacket kettle ladder mirror needle oyster pillow rocket silver tunnel umbrella
window yellow anchor bridge candle dragon feather helmet insect jungle kingdom lemon magnet`)

// filler is about n characters of words, the same for the same seed.
func filler(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 0xd1ff))
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(fillerWords[rng.IntN(len(fillerWords))])
	}
	return b.String()
}

// marker starts every user message of c's round: it names the turn in
// the stored history and in what reached the engine.
func (c *diffClient) marker(round int) string { return fmt.Sprintf("[%s turn %d]", c.name, round) }

// message is c's user message of round.
func (c *diffClient) message(round int) string {
	seed := c.seed + uint64(round)
	if c.kind == diffTools && round%2 == 1 {
		return fmt.Sprintf("%s Look up my note about %s. %s", c.marker(round), c.word, filler(seed, c.msgChars))
	}
	return fmt.Sprintf("%s My code word is %s. %s", c.marker(round), c.word, filler(seed, c.msgChars))
}

// request is what c sends in round, given its conversation so far (hist,
// system message first; unused by drop-in clients), and what the
// conversation becomes once the turn is answered (before the reply).
func (c *diffClient) request(round int, hist []openai.ChatCompletionMessageParamUnion) []openai.ChatCompletionMessageParamUnion {
	user := openai.UserMessage(c.message(round))
	switch c.kind {
	case diffDropIn:
		return []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(c.system), user}
	case diffTools:
		if round%2 == 0 {
			return append(hist[:len(hist):len(hist)], user)
		}
		id := fmt.Sprintf("call_%s_%d", c.name, round)
		call := openai.ChatCompletionMessageParamUnion{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
			ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID: id, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{
					Name: "lookup_note", Arguments: fmt.Sprintf(`{"topic":%q}`, c.word)}}}}}}
		result := openai.ToolMessage(fmt.Sprintf("Note about %s: %s", c.word, filler(c.seed+1000+uint64(round), c.msgChars)), id)
		return append(hist[:len(hist):len(hist)], user, call, result)
	default:
		return append(hist[:len(hist):len(hist)], user)
	}
}

// diffAttempt is one request of a turn.
type diffAttempt struct {
	start, end time.Time
	err        error
}

// diffTurn is one turn of one client on one side.
type diffTurn struct {
	attempts []diffAttempt
	ok       bool
}

// describe is the turn's outcome with the last error in full: "HTTP 502,
// then HTTP 400 exceed_context_size_error: request (…) exceeds …".
func (t diffTurn) describe() string {
	if len(t.attempts) == 0 {
		return "not sent"
	}
	var b strings.Builder
	for _, a := range t.attempts[:len(t.attempts)-1] {
		b.WriteString(diffTurn{attempts: []diffAttempt{a}}.outcome() + ", then ")
	}
	b.WriteString(oneLine(t.attempts[len(t.attempts)-1].err))
	return b.String()
}

// outcome lists the attempts' results: "ok", "HTTP 429, then ok".
func (t diffTurn) outcome() string {
	var parts []string
	for _, a := range t.attempts {
		var apiErr *openai.Error
		switch {
		case a.err == nil:
			parts = append(parts, "ok")
		case errors.As(a.err, &apiErr):
			parts = append(parts, fmt.Sprintf("HTTP %d", apiErr.StatusCode))
		default:
			parts = append(parts, "failed")
		}
	}
	return strings.Join(parts, ", then ")
}

// overlaps reports whether an attempt of the turn was in flight at some
// moment between from and to.
func (t diffTurn) overlaps(from, to time.Time) bool {
	if from.IsZero() {
		return false
	}
	for _, a := range t.attempts {
		if a.start.Before(to) && a.end.After(from) {
			return true
		}
	}
	return false
}

// diffRetryable is the openai SDKs' rule: a failed connection or broken
// stream, 408, 409, 429 and 5xx are retried; other statuses are not.
func diffRetryable(err error) bool {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		c := apiErr.StatusCode
		return c == 408 || c == 409 || c == 429 || c >= 500
	}
	return true
}

// diffGrammar keeps the tiny model's random output to parseable text.
const diffGrammar = "root ::= [a-z ]+"

// send sends msgs as c with openai-go (streamed or not) and returns the
// reply.
func (c *diffClient) send(ctx context.Context, client openai.Client, msgs []openai.ChatCompletionMessageParamUnion) (string, error) {
	params := openai.ChatCompletionNewParams{Model: "tiny", Messages: msgs, MaxTokens: openai.Int(8), Temperature: openai.Float(0)}
	opts := []option.RequestOption{option.WithHeader("X-Session-ID", c.session), option.WithJSONSet("grammar", diffGrammar),
		option.WithRequestTimeout(90 * time.Second)}
	if c.user != "" {
		opts = append(opts, option.WithHeader("X-User-ID", c.user))
	}
	if !c.stream {
		comp, err := client.Chat.Completions.New(ctx, params, opts...)
		if err != nil {
			return "", err
		}
		if len(comp.Choices) == 0 {
			return "", fmt.Errorf("an answer without choices: %.300s", comp.RawJSON())
		}
		return comp.Choices[0].Message.Content, nil
	}
	st := client.Chat.Completions.NewStreaming(ctx, params, opts...)
	defer st.Close()
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if err := st.Err(); err != nil {
		return "", err
	}
	if len(acc.Choices) == 0 || acc.Choices[0].FinishReason == "" {
		return "", errors.New("the stream ended without a finish_reason")
	}
	return acc.Choices[0].Message.Content, nil
}
