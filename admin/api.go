package admin

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/memory"
)

// The operator's console: a page at /ui (package ui's embedded files) and
// its JSON API under /admin/v1, both on when Options.Token is set and
// answering 404 otherwise. Every API call needs Authorization: Bearer
// <Token>; the page itself holds no data and asks for the token, which
// it keeps in the tab's sessionStorage and sends as that header (no cookie,
// so no other site can make the browser act on the console).
//
// The admin token sees every tenant; each call about sessions, memories or
// knowledge names one with ?tenant= (the tenant ids the sidecar stores:
// "t_" and 16 hex digits, a hash of the API key or of a RESP client's
// AUTH credentials, "u_<name>" for a --resp-users account, or
// "anonymous"). The
// normal routes are untouched: an API key still sees only its own tenant.
//
//	GET    /admin/v1/tenants                          tenants with stored sessions or RESP keys
//	GET    /admin/v1/sessions?tenant=&user=           a tenant's sessions (of one user)
//	GET    /admin/v1/sessions/{id}?tenant=            history, window tiers, last window and recall, engine
//	DELETE /admin/v1/sessions/{id}?tenant=            delete the session (and its KV)
//	GET    /admin/v1/memories?tenant=&session=|user=  memories with category, importance, decay
//	                          [&format=csv|json]      … as a download
//	POST   /admin/v1/memories?tenant=&session=        add {"category","text","importance"}
//	PATCH  /admin/v1/memories/{id}?tenant=&session=   edit {"text","category","importance"}
//	DELETE /admin/v1/memories/{id}?tenant=&session=   delete one
//	POST   /admin/v1/memories/{id}/boost?tenant=&session=
//	POST   /admin/v1/memories/batch-delete?tenant=&session=  {"ids":[…]}: core and system memories are skipped
//	GET    /admin/v1/stats?tenant=&session=|user=[&format=csv|json]  statistics by category
//	GET    /admin/v1/triples?tenant=&user=            the knowledge base's triples
//	DELETE /admin/v1/triples/{id}?tenant=&user=
//	GET    /admin/v1/reviews?tenant=&user=            the memory reviewer's decisions
//	GET    /admin/v1/kv                               KV cache, engine and memory counters, time series
//	GET    /admin/v1/resp[?tenant=]                   the RESP listener: store, totals, tenants, one tenant

const (
	// adminMaxSessions bounds the sessions one user-wide memory listing
	// reads.
	adminMaxSessions = 64
	// adminMaxBatch bounds the ids of one batch delete.
	adminMaxBatch = 1000
	// adminMaxList bounds lists (sessions, triples, reviews).
	adminMaxList = 1000
	// maxAdminBody bounds an admin request's body.
	maxAdminBody = 1 << 20
	// ConsoleWindows is how many sessions' last windows the console keeps
	// (NewWindows).
	ConsoleWindows = 1024
)

// adminAuthorized reports whether the request carries the admin token.
func (s *Server) adminAuthorized(ctx *fasthttp.RequestCtx) bool {
	h := bytes.TrimSpace(ctx.Request.Header.Peek("Authorization"))
	const prefix = "bearer "
	if len(h) <= len(prefix) || !bytes.EqualFold(h[:len(prefix)], []byte(prefix)) {
		return false
	}
	got := sha256.Sum256(bytes.TrimSpace(h[len(prefix):]))
	return subtle.ConstantTimeCompare(got[:], s.hash[:]) == 1
}

// handleAdmin serves /admin/v1/…; tail is the raw path after /admin/v1.
func (s *Server) handleAdmin(ctx *fasthttp.RequestCtx, tail []byte) {
	if !s.consoleOn() {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "console_disabled",
			"the admin API is off; start the sidecar with --admin-token (or SIDECAR_ADMIN_TOKEN) to turn it on")
		return
	}
	// Answers (errors included) are never cached; set last, as an error
	// answer resets the headers.
	defer ctx.Response.Header.Set("Cache-Control", "no-store")
	if !s.adminAuthorized(ctx) {
		writeError(ctx, fasthttp.StatusUnauthorized, typeInvalidRequest, "invalid_admin_token",
			"the admin API needs Authorization: Bearer <admin token> (the sidecar's --admin-token)")
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="kvsidecar-admin"`)
		return
	}
	segs, err := pathSegments(tail)
	if err != nil || slices.ContainsFunc(segs, isDotName) || len(segs) == 0 {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "not_found", "no admin route for this method and path")
		return
	}
	a := &adminReq{s: s, ctx: ctx, q: ctx.QueryArgs()}
	switch segs[0] {
	case "kv":
		a.only(len(segs) == 1, "GET").kv()
	case "tenants":
		a.only(len(segs) == 1, "GET").tenants()
	case "sessions":
		switch len(segs) {
		case 1:
			a.only(true, "GET").memory().tenant().sessions()
		case 2:
			a.only(true, "GET", "DELETE").memory().tenant().sessionByID(segs[1])
		default:
			a.notFound()
		}
	case "memories":
		switch {
		case len(segs) == 1:
			a.only(true, "GET", "POST").memory().tenant().memories()
		case len(segs) == 2 && segs[1] == "batch-delete":
			a.only(true, "POST").memory().tenant().sessionParam().batchDelete()
		case len(segs) == 2:
			a.only(true, "PATCH", "DELETE").memory().tenant().sessionParam().memoryUnit(segs[1])
		case len(segs) == 3 && segs[2] == "boost":
			a.only(true, "POST").memory().tenant().sessionParam().boost(segs[1])
		default:
			a.notFound()
		}
	case "stats":
		a.only(len(segs) == 1, "GET").memory().tenant().stats()
	case "triples":
		switch len(segs) {
		case 1:
			a.only(true, "GET").tenant().triples()
		case 2:
			a.only(true, "DELETE").tenant().deleteTriple(segs[1])
		default:
			a.notFound()
		}
	case "reviews":
		a.only(len(segs) == 1, "GET").tenant().reviews()
	case "resp":
		a.only(len(segs) == 1, "GET").resp()
	default:
		a.notFound()
	}
}

// adminReq is one admin call. Its checks chain: each returns the request,
// and once one answered an error the rest do nothing.
type adminReq struct {
	s       *Server
	ctx     *fasthttp.RequestCtx
	q       *fasthttp.Args
	done    bool
	tenantV string
	session string
}

func (a *adminReq) fail(status int, typ, code, msg string) {
	if !a.done {
		writeError(a.ctx, status, typ, code, msg)
		a.done = true
	}
}

func (a *adminReq) notFound() {
	a.fail(fasthttp.StatusNotFound, typeNotFound, "not_found", "no admin route for this method and path")
}

// only checks the route matched and the method is one of methods.
func (a *adminReq) only(matched bool, methods ...string) *adminReq {
	if !matched {
		a.notFound()
		return a
	}
	if !a.done && !slices.Contains(methods, string(a.ctx.Method())) {
		a.fail(fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use "+strings.Join(methods, " or "))
		a.ctx.Response.Header.Set("Allow", strings.Join(methods, ", "))
	}
	return a
}

func (a *adminReq) memory() *adminReq {
	if a.s.opts.Memory == nil {
		a.fail(fasthttp.StatusNotFound, typeNotFound, "memory_disabled", "session memory is disabled on this sidecar")
	}
	return a
}

// tenant reads the required ?tenant=.
func (a *adminReq) tenant() *adminReq {
	if a.done {
		return a
	}
	t := string(a.q.Peek("tenant"))
	if t == "" {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "missing_tenant", "name the tenant with ?tenant= (GET /admin/v1/tenants lists them)")
		return a
	}
	if err := validID(t); err != nil {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_tenant", "tenant: "+err.Error())
		return a
	}
	a.tenantV = t
	return a
}

// sessionParam reads the required ?session=.
func (a *adminReq) sessionParam() *adminReq {
	if a.done {
		return a
	}
	id := string(a.q.Peek("session"))
	if id == "" {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "missing_session", "name the session with ?session=")
		return a
	}
	if err := validID(id); err != nil {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_session_id", err.Error())
		return a
	}
	a.session = id
	return a
}

// user reads the optional ?user=: nil when absent (every user), else the
// user ("" is the tenant's default user).
func (a *adminReq) user() (user *string, ok bool) {
	if !a.q.Has("user") {
		return nil, true
	}
	u := string(a.q.Peek("user"))
	if u != "" {
		if err := validID(u); err != nil {
			a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_user", "user: "+err.Error())
			return nil, false
		}
	}
	return &u, true
}

// storeErr answers a memory error.
func (a *adminReq) storeErr(err error) {
	switch {
	case errors.Is(err, memory.ErrMemoryNotFound):
		a.fail(fasthttp.StatusNotFound, typeNotFound, "memory_not_found", "no such memory in this session of this tenant")
	case errors.Is(err, memory.ErrNotFound):
		a.fail(fasthttp.StatusNotFound, typeNotFound, "session_not_found", "no such session for this tenant")
	case errors.Is(err, memory.ErrBoostLimited):
		a.fail(fasthttp.StatusConflict, typeInvalidRequest, "boost_limited", strings.TrimPrefix(err.Error(), "memory: "))
	case errors.Is(err, memory.ErrInvalid):
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_memory", strings.TrimPrefix(err.Error(), "memory: "))
	case errors.Is(err, memory.ErrClosed):
		a.fail(fasthttp.StatusServiceUnavailable, typeServer, "shutting_down", "the sidecar is shutting down")
	default:
		a.s.log.Error("admin: memory store failed", "tenant", a.tenantV, "session", a.session, "err", err)
		a.fail(fasthttp.StatusInternalServerError, typeServer, "internal", "session store failed; see the sidecar's log")
	}
}

// decode reads a JSON body strictly into v.
func (a *adminReq) decode(v any) bool {
	d := json.NewDecoder(bytes.NewReader(a.ctx.Request.Body()))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_json", "body: "+err.Error())
		return false
	}
	if d.More() {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_json", "body: one JSON object expected")
		return false
	}
	return true
}

func (a *adminReq) ok(status int, v any) {
	if !a.done {
		writeJSON(a.ctx, status, v)
		a.done = true
	}
}

func list(v any) map[string]any { return map[string]any{"object": "list", "data": v} }

// --- tenants and sessions

// userInfo is one user of a tenant with its sessions.
type userInfo struct {
	User     string `json:"user"`
	Sessions int    `json:"sessions"`
}

func (a *adminReq) sessions() {
	if a.done {
		return
	}
	user, ok := a.user()
	if !ok {
		return
	}
	ss, err := a.s.opts.Memory.Sessions(a.tenantV, user, adminMaxList)
	if err != nil {
		a.storeErr(err)
		return
	}
	// The users of the tenant, from all its sessions when filtered.
	all := ss
	if user != nil {
		if all, err = a.s.opts.Memory.Sessions(a.tenantV, nil, adminMaxList); err != nil {
			a.storeErr(err)
			return
		}
	}
	byUser := map[string]int{}
	for _, x := range all {
		byUser[x.User]++
	}
	users := []userInfo{}
	for u, n := range byUser {
		users = append(users, userInfo{u, n})
	}
	slices.SortFunc(users, func(x, y userInfo) int { return strings.Compare(x.User, y.User) })
	a.ok(fasthttp.StatusOK, map[string]any{"object": "list", "data": ss, "users": users})
}

// sessionDetail is GET /admin/v1/sessions/{id}.
type sessionDetail struct {
	memory.SessionView
	// Tiers counts the session's messages in the window (focus) and its
	// memory units by tier.
	Tiers      map[string]int       `json:"tiers"`
	Engine     *engine.SessionStats `json:"engine,omitempty"`
	LastWindow *lastWindow          `json:"last_window,omitempty"`
	Categories map[string]int       `json:"categories"`
}

func (a *adminReq) sessionByID(id string) {
	if a.done {
		return
	}
	if err := validID(id); err != nil || id == "" {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_session_id", "session id must be one URL-escaped path segment of 1..256 bytes without control characters")
		return
	}
	a.session = id
	st := a.s.opts.Memory
	if a.ctx.IsDelete() {
		if err := a.s.opts.Sessions.DeleteSession(a.ctx, a.tenantV, id); err != nil {
			a.storeErr(err)
			return
		}
		a.s.log.Info("admin: session deleted", "tenant", a.tenantV, "session", id)
		a.ok(fasthttp.StatusOK, map[string]any{"id": id, "object": "session.deleted", "deleted": true})
		return
	}
	sv, err := st.Session(a.tenantV, id)
	if err != nil {
		a.storeErr(err)
		return
	}
	mv, err := st.Memory(a.tenantV, id)
	if err != nil {
		a.storeErr(err)
		return
	}
	d := sessionDetail{SessionView: sv, Tiers: map[string]int{"focus": mv.Focus, "working": mv.Working, "archive": mv.Archive},
		Categories: map[string]int{}}
	for _, u := range mv.Units {
		if u.Category != "" {
			d.Categories[string(u.Category)]++
		}
	}
	if a.s.opts.Engine != nil {
		if es, ok := a.s.opts.Engine.SessionStats(a.tenantV, id); ok {
			d.Engine = &es
		}
	}
	d.LastWindow = a.s.windows.get(a.tenantV, id)
	a.ok(fasthttp.StatusOK, d)
}

// --- KV

// kvView is GET /admin/v1/kv.
type kvView struct {
	KV           *kv.Stats             `json:"kv"`
	Amortization *kv.AmortizationStats `json:"amortization"`
	// Engine is the connector's Report (engine.Stats and its own
	// counters), EngineFacts what the page shows of it.
	Engine        engine.Report `json:"engine"`
	EngineFacts   *engine.Facts `json:"engine_facts,omitempty"`
	Memory        *memory.Stats `json:"memory"`
	Samples       []KVSample    `json:"samples"`
	SampleEveryMs int64         `json:"sample_every_ms"`
	// Thresholds are the design's alert thresholds, judged now.
	Thresholds []Threshold `json:"thresholds"`
}

func (a *adminReq) kv() {
	if a.done {
		return
	}
	var v kvView
	if c := a.s.opts.KV; c != nil {
		st, am := c.Stats(), c.AmortizationStats()
		v.KV, v.Amortization = &st, &am
	}
	if e := a.s.opts.Engine; e != nil {
		f := e.ConsoleFacts()
		v.Engine, v.EngineFacts = e.Report(), &f
	}
	if m := a.s.opts.Memory; m != nil {
		st := m.Stats()
		v.Memory = &st
	}
	v.Samples = a.s.series.snapshot()
	v.SampleEveryMs = a.s.opts.SampleEvery.Milliseconds()
	v.Thresholds = a.s.thresholds(time.Now())
	a.ok(fasthttp.StatusOK, v)
}
