package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"

	"github.com/kvsidecar/kvsidecar/frontdoor"
	"github.com/kvsidecar/kvsidecar/internal/httpapi"
	"github.com/valyala/fasthttp"
)

// maxSessionIDLen bounds a client-chosen session id. Ids are never used as
// file names (storage hashes them), but they are logged and echoed.
const maxSessionIDLen = httpapi.MaxIDLen

// anonymousTenant is the one tenant that requests without a bearer token
// share when Options.AllowAnonymous is set.
const anonymousTenant = "anonymous"

// sessionRef identifies a session: its id as the client named it, scoped by
// the tenant that owns it. The zero value means "no session" (stateless).
type sessionRef struct {
	Tenant string
	ID     string
}

// session is the session step: the request's session (none: stateless)
// and, in a fleet, the session's lease, held for the whole turn (until
// release). It answers 400 for a bad session id and 503 when the lease
// stays with another replica.
func (f *flow) session(ctx *fasthttp.RequestCtx) bool {
	s := f.s
	sess, anonymous, err := s.sessionOf(ctx, f.info)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_session_id", err.Error())
		return false
	}
	if anonymous {
		s.metrics.anonymous.Add(1)
		if s.anonWarned.CompareAndSwap(false, true) {
			s.log.Warn("a request named a session without an API key: it goes through without session state (send Authorization: Bearer …, or start with --allow-anonymous to share one anonymous tenant); further ones are counted in sidecar_anonymous_stateless_requests_total")
		}
	}
	f.sess = sess
	if sess.ID != "" {
		f.log = []any{"session", sess.ID, "tenant", sess.Tenant}
	}
	if s.opts.Fleet == nil || sess.ID == "" || !f.turnRoute(ctx) {
		return true
	}
	lease, err := s.opts.Fleet.Acquire(s.stopping, sess.Tenant, sess.ID)
	if err != nil && s.stopping.Err() != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "shutting_down", "the sidecar is shutting down; retry")
		return false
	}
	if err != nil {
		s.metrics.fleetBusy.Add(1)
		s.log.Warn("session busy on another replica", append(f.log, "err", err)...)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "session_busy",
			"another replica is serving this session and did not finish in time; retry")
		ctx.Response.Header.Set("Retry-After", "1")
		return false
	}
	f.lease = lease
	return true
}

// tenantOf hashes the Authorization bearer token so that one key never sees
// another key's sessions and no secret is kept or logged. It returns ""
// when the header carries no token (absent, empty, "Bearer" alone).
func tenantOf(authorization []byte) string {
	const prefix = "bearer"
	tok := bytes.TrimSpace(authorization)
	if len(tok) >= len(prefix) && frontdoor.FoldEq(tok[:len(prefix)], prefix) &&
		(len(tok) == len(prefix) || tok[len(prefix)] == ' ') {
		tok = bytes.TrimSpace(tok[len(prefix):])
	}
	if len(tok) == 0 {
		return ""
	}
	sum := sha256.Sum256(tok)
	return "t_" + hex.EncodeToString(sum[:8])
}

// validSessionID reports whether id may name a session: 1..256 bytes of
// UTF-8 without control characters.
var validSessionID = httpapi.ValidID

// tenant returns the request's tenant. ok is false for a request without
// a bearer token unless Options.AllowAnonymous makes it the shared
// anonymous tenant: anonymous requests keep no state by default, since any
// client could read another's.
func (s *Server) tenant(ctx *fasthttp.RequestCtx) (tenant string, ok bool) {
	if t := tenantOf(ctx.Request.Header.Peek("Authorization")); t != "" {
		return t, true
	}
	if s.opts.AllowAnonymous {
		return anonymousTenant, true
	}
	return "", false
}

// requireTenant is tenant for the state APIs (sessions, pool, KV): without
// one it answers 401 and returns ok false.
func (s *Server) requireTenant(ctx *fasthttp.RequestCtx) (string, bool) {
	t, ok := s.tenant(ctx)
	if !ok {
		writeError(ctx, fasthttp.StatusUnauthorized, typeInvalidRequest, "missing_api_key",
			"this API keeps per-key state and needs an API key (Authorization: Bearer …); anonymous requests get no shared state")
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="kvsidecar"`)
	}
	return t, ok
}

// sessionKey is the session a request names: its X-Session-ID header
// (the value as sent), else its body's prompt_cache_key; "" for none, a
// stateless request. The event loop serves only requests without one
// (loopBackend.Start).
func sessionKey(header []byte, info requestInfo) string {
	if len(header) > 0 {
		return string(header)
	}
	return info.PromptCacheKey
}

// sessionOf finds the request's session: the X-Session-ID header, else the
// body's prompt_cache_key. It returns the zero sessionRef when neither is
// set, and also, with anonymous true, for a request that names a session
// but has no tenant (see Server.tenant): it goes through statelessly.
func (s *Server) sessionOf(ctx *fasthttp.RequestCtx, info requestInfo) (ref sessionRef, anonymous bool, err error) {
	id := sessionKey(ctx.Request.Header.Peek("X-Session-ID"), info)
	if id == "" {
		return sessionRef{}, false, nil
	}
	if err := validSessionID(id); err != nil {
		return sessionRef{}, false, err
	}
	tenant, ok := s.tenant(ctx)
	if !ok {
		return sessionRef{}, true, nil
	}
	return sessionRef{Tenant: tenant, ID: id}, false, nil
}
