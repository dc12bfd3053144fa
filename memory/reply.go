package memory

import (
	"context"
	"unicode/utf8"
)

// MaxReplyBytes is the most of one reply that Complete keeps
// (Options.Storage.MaxReplyBytes): callers that accumulate a streamed reply
// may stop accumulating beyond it.
func (s *Store) MaxReplyBytes() int { return s.opts.Storage.MaxReplyBytes }

// capReply returns m, or when its text and tool calls exceed
// MaxReplyBytes, an assistant message holding the first MaxReplyBytes of
// its text (or, without text, of its tool calls), and marks it partial.
// A reply's cost in memory, on disk and in tokenizing is thereby bounded
// whatever the upstream sends.
func (e *env) capReply(m *Message, partial *bool) *Message {
	maxBytes := e.opts.Storage.MaxReplyBytes
	if len(m.Content)+len(m.toolText)+len(m.Name) <= maxBytes && len(m.Raw) <= 2*maxBytes+4096 {
		return m
	}
	text := m.Content
	if text == "" {
		text = m.toolText
	}
	role := m.Role
	if role == "" {
		role = "assistant"
	}
	c := NewMessage(role, CutText(text, maxBytes))
	*partial = true
	e.stats.repliesCut.Add(1)
	return &c
}

// CutText returns the longest prefix of s of at most n bytes that does not
// split a UTF-8 sequence.
func CutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// withStore returns ctx, also cancelled when the store closes, and the
// function that releases it.
func (e *env) withStore(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(e.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}
