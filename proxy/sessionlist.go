package proxy

import (
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

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
