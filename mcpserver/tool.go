package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kvsidecar/kvsidecar/memory"
)

const instructions = "Session memory of the kvsidecar in front of your LLM server. " +
	"session_recall(query, session_id) searches what a conversation of yours (the X-Session-ID or prompt_cache_key " +
	"of its chat requests) remembers: every turn it recorded (in the model's context or out of it), facts and " +
	"episodes, and, for a named end user (X-User-ID), that user's other sessions. Calls on the same topic reuse " +
	"the session's working memory."

var recallTool = &mcp.Tool{
	Name:  "session_recall",
	Title: "Recall from session memory",
	Description: "Recall what a conversation remembers about query: memories of the session session_id (its turns, " +
		"found as soon as they are recorded, its facts and episodes; for a named end user also the user's other " +
		"sessions), best first, each with its id, role, text and date. When memories hold some of the query's " +
		"words but none is close enough, the best few are shown all the same. mode says " +
		"how the session's working memory answered: full (a full retrieval: first recall, or a new topic), reuse " +
		"(the active topic's set, refreshed) or none (nothing matched). Only the caller's own sessions (API key, " +
		"X-User-ID) are found.",
	Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: new(bool)},
}

type recallArgs struct {
	Query     string `json:"query" jsonschema:"what to recall: the question or topic, in the user's words"`
	SessionID string `json:"session_id" jsonschema:"the conversation whose memory to search: the X-Session-ID or prompt_cache_key of its chat requests"`
}

type recallOut struct {
	Mode       string     `json:"mode" jsonschema:"full: a full retrieval ran (first recall, or a new topic); reuse: the working memory kept the active topic's set; none: nothing matched"`
	FullRecall bool       `json:"full_recall" jsonschema:"true when a full retrieval ran"`
	Memories   []recalled `json:"memories" jsonschema:"the recalled memories, best first"`
}

type recalled struct {
	ID           string `json:"id" jsonschema:"the memory's id"`
	Role         string `json:"role" jsonschema:"who said it (user, assistant) or what it is (fact, episode, summary)"`
	Text         string `json:"text" jsonschema:"the memory's text"`
	Date         string `json:"date,omitempty" jsonschema:"when it was said or learned (RFC 3339, UTC)"`
	OtherSession bool   `json:"other_session,omitempty" jsonschema:"true for a memory of another session of the same end user"`
}

// recall is session_recall's handler.
func (s *Server) recall(ctx context.Context, _ *mcp.CallToolRequest, in recallArgs) (*mcp.CallToolResult, recallOut, error) {
	c, ok := callerOf(ctx)
	if !ok {
		// Fail closed: a request that did not come through Serve.
		s.st.errors.Add(1)
		return nil, recallOut{}, errors.New("no authenticated caller")
	}
	if in.SessionID == "" {
		s.st.invalid.Add(1)
		return nil, recallOut{}, errors.New("session_id is required")
	}
	res, err := s.opts.Memory.Recall(ctx, c.Tenant, in.SessionID, c.User, in.Query)
	switch {
	case errors.Is(err, memory.ErrNotFound):
		s.st.notFound.Add(1)
		return nil, recallOut{}, fmt.Errorf("no session %q for this API key and end user", in.SessionID)
	case errors.Is(err, memory.ErrInvalid):
		s.st.invalid.Add(1)
		return nil, recallOut{}, fmt.Errorf("invalid arguments: %s", strings.TrimPrefix(err.Error(), memory.ErrInvalid.Error()+": "))
	case err != nil:
		s.st.errors.Add(1)
		s.opts.Logger.Error("mcp: session_recall failed", "session", in.SessionID, "err", err)
		return nil, recallOut{}, errors.New("recall failed; see the sidecar's log")
	}
	out := recallOut{Mode: res.Mode, FullRecall: res.Mode == "full", Memories: make([]recalled, 0, min(len(res.Memories), s.opts.MaxMemories))}
	switch res.Mode {
	case "full":
		s.st.full.Add(1)
	case "reuse":
		s.st.reuse.Add(1)
	default:
		s.st.none.Add(1)
	}
	for _, m := range res.Memories[:min(len(res.Memories), s.opts.MaxMemories)] {
		r := recalled{ID: m.ID, Role: m.Role, Text: cut(m.Text, s.opts.MaxTextBytes), OtherSession: m.OtherSession}
		if !m.At.IsZero() {
			r.Date = m.At.UTC().Format(time.RFC3339)
		}
		out.Memories = append(out.Memories, r)
	}
	return nil, out, nil
}

// cut returns text cut to at most n bytes at a rune boundary, marked with
// "…" when cut.
func cut(text string, n int) string {
	if len(text) <= n {
		return text
	}
	const mark = "…"
	i := n - len(mark)
	for i > 0 && !utf8.RuneStart(text[i]) {
		i--
	}
	return text[:i] + mark
}
