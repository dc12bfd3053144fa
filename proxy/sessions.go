package proxy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/valyala/fasthttp"
)

// The sessions API: GET /v1/sessions (listSessions, below) and, under
// /v1/sessions/{id}, a session's view, its memory, its deletion and its
// context snapshot (handleSessions; snapshot.go).
//
// GET /v1/sessions lists the caller's own sessions: those of its API key
// (its tenant), and of one end user only when the request names one in
// X-User-ID, newest write first, a page at a time:
//
//	GET /v1/sessions?limit=20&after=<the last id of the previous page>
//
// The answer is OpenAI's list shape: {"object":"list","data":[…],
// "first_id","last_id","has_more"}. It reads this machine's disk (in a
// fleet, sessions only other replicas served are not listed). A session
// written between two pages moves to the front: paging walks the order of
// the first page's moment only approximately, never listing another key's
// sessions.
const (
	// sessionListDefault and sessionListMax bound a page.
	sessionListDefault = 20
	sessionListMax     = 100
	// sessionListDepth is how far into a key's sessions, newest first,
	// paging reaches (each page reads the stored sessions up to its own).
	sessionListDepth = 10000
)

// sessionListItem is one session of the list.
type sessionListItem struct {
	ID        string    `json:"id"`
	Object    string    `json:"object"`
	User      string    `json:"user,omitempty"`
	Bytes     int64     `json:"bytes"`
	UpdatedAt time.Time `json:"updated_at"`
}

// sessionList is the answer of GET /v1/sessions.
type sessionList struct {
	Object  string            `json:"object"`
	Data    []sessionListItem `json:"data"`
	FirstID string            `json:"first_id,omitempty"`
	LastID  string            `json:"last_id,omitempty"`
	HasMore bool              `json:"has_more"`
}

// listSessions answers GET /v1/sessions for the request's tenant.
func (s *Server) listSessions(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use GET to list sessions")
		ctx.Response.Header.Set("Allow", "GET") // after writeError, which resets the response
		return
	}
	tenant, ok := s.requireTenant(ctx)
	if !ok {
		return
	}
	if s.lister == nil {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "not_supported", "this sidecar's memory cannot list sessions")
		return
	}
	q := ctx.QueryArgs()
	limit := sessionListDefault
	if v := q.Peek("limit"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > sessionListMax {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_limit", fmt.Sprintf("limit must be 1 to %d", sessionListMax))
			return
		}
		limit = n
	}
	after := string(q.Peek("after"))
	var user *string
	if u := string(ctx.Request.Header.Peek("X-User-ID")); u != "" {
		user = &u
	}
	depth := limit + 1
	if after != "" {
		depth = sessionListDepth + limit + 1
	}
	all, err := s.lister.Sessions(tenant, user, depth)
	if err != nil {
		s.log.Error("listing sessions failed", "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "session store failed; see the sidecar's log")
		return
	}
	start := 0
	if after != "" {
		start = -1
		for i, x := range all {
			if x.ID == after {
				start = i + 1
				break
			}
		}
		if start < 0 {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_cursor",
				fmt.Sprintf("after=%q is not a session of this listing (deleted, or more than %d sessions deep)", after, sessionListDepth))
			return
		}
	}
	page := all[start:]
	out := sessionList{Object: "list", Data: []sessionListItem{}, HasMore: len(page) > limit}
	for _, x := range page[:min(limit, len(page))] {
		out.Data = append(out.Data, sessionListItem{ID: x.ID, Object: "session", User: x.User, Bytes: x.Bytes, UpdatedAt: x.UpdatedAt})
	}
	if n := len(out.Data); n > 0 {
		out.FirstID, out.LastID = out.Data[0].ID, out.Data[n-1].ID
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// handleSessions serves the sessions API: GET /v1/sessions/{id},
// GET /v1/sessions/{id}/memory, DELETE /v1/sessions/{id}, and
// GET|PUT /v1/sessions/{id}/snapshot (snapshot.go), scoped by tenant.
// tail is the raw path after /v1/sessions (see route.go).
func (s *Server) handleSessions(ctx *fasthttp.RequestCtx, tail []byte) {
	if s.opts.Memory == nil {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "memory_disabled", "session memory is disabled on this sidecar")
		return
	}
	if len(tail) == 0 {
		s.listSessions(ctx) // GET /v1/sessions
		return
	}
	// tail is what follows /v1/sessions: "/{id}", "/{id}/memory" or
	// "/{id}/snapshot", the id one escaped segment (so ".." is a name
	// here, not a step up).
	segs, err := pathSegments(tail)
	wantMemory := len(segs) == 2 && segs[1] == "memory"
	wantSnapshot := len(segs) == 2 && segs[1] == "snapshot"
	if err != nil || len(segs) == 0 || len(segs) > 2 || len(segs) == 2 && !wantMemory && !wantSnapshot {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_path", "session path must be /v1/sessions (the list) or /v1/sessions/{id}[/memory|/snapshot] with the id URL-escaped")
		return
	}
	id := segs[0]
	if err := validSessionID(id); err != nil || id == "" {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_session_id", "session id must be one URL-escaped path segment of 1..256 bytes without control characters")
		return
	}
	tenant, ok := s.requireTenant(ctx)
	if !ok {
		return
	}
	if wantSnapshot {
		s.handleSnapshot(ctx, tenant, id) // the end user must match exactly
		return
	}
	// A caller that names an end user sees only that user's sessions.
	if user := string(ctx.Request.Header.Peek("X-User-ID")); user != "" {
		if sv, err := s.opts.Memory.Session(tenant, id); err == nil && sv.User != user {
			writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "session_not_found", "no session of this id for this API key and user")
			return
		}
	}
	var v any
	switch {
	case ctx.IsGet() && wantMemory:
		v, err = s.opts.Memory.Memory(tenant, id)
	case ctx.IsGet():
		var sv memory.SessionView
		if sv, err = s.opts.Memory.Session(tenant, id); err == nil && s.opts.Engine != nil {
			es, ok := s.engine.SessionStats(tenant, id)
			v = struct {
				memory.SessionView
				Engine *engine.SessionStats `json:"engine,omitempty"`
			}{sv, ptrIf(es, ok)}
		} else {
			v = sv
		}
	case ctx.IsDelete() && !wantMemory:
		err = s.DeleteSession(ctx, tenant, id)
		v = map[string]any{"id": id, "object": "session.deleted", "deleted": err == nil}
	default:
		writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use GET or DELETE")
		ctx.Response.Header.Set("Allow", "GET, DELETE") // after writeError, which resets the response
		return
	}
	if errors.Is(err, memory.ErrNotFound) {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "session_not_found", "no session of this id for this API key")
		return
	}
	if err != nil {
		s.log.Error("session admin failed", "session", id, "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "session store failed; see the sidecar's log")
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, v)
}

func ptrIf[T any](v T, ok bool) *T {
	if !ok {
		return nil
	}
	return &v
}

// DeleteSession deletes a session's memory and then what follows it: the
// console's last window (Options.Windows) and the engine's saved KV (a
// failure there is logged; the session is gone either way). The sessions
// API and the console's admin API (package admin) both delete through it.
func (s *Server) DeleteSession(ctx context.Context, tenant, id string) error {
	if err := s.opts.Memory.Delete(tenant, id); err != nil {
		return err
	}
	s.forgetWindow(tenant, id)
	if s.opts.Engine != nil {
		if err := s.engine.Forget(ctx, tenant, id); err != nil {
			s.log.Warn("dropping a deleted session's KV failed", "session", id, "err", err)
		}
	}
	return nil
}

// forgetWindow tells Options.Windows that a session is gone or replaced.
func (s *Server) forgetWindow(tenant, id string) {
	if w := s.opts.Windows; w != nil {
		w.Forget(tenant, id)
	}
}
