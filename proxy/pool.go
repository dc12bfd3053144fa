package proxy

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/memory"
)

// handlePool serves the tenant's shared memory pool:
//
//	GET    /v1/pool?prefix=P&limit=N   list entries by key
//	GET    /v1/pool/{key}              one entry
//	PUT    /v1/pool/{key}              write {"value":…, "metadata":…, "expected_version":n}
//	DELETE /v1/pool/{key}[?expected_version=n]
//	GET    /v1/pool/events?prefix=P     the pool's writes and deletes as server-sent events (poolevents.go)
//
// Writes are last-writer-wins unless expected_version is given; a mismatch
// is 409 with the current entry. X-Session-ID names the writer. tail is the
// raw path after /v1/pool (see route.go).
func (s *Server) handlePool(ctx *fasthttp.RequestCtx, tail []byte) {
	st := s.opts.Memory
	if st == nil {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "memory_disabled", "session memory is disabled on this sidecar")
		return
	}
	// tail is "" or "/" (the list), else "/{key}" where the key may hold
	// escaped or plain slashes but no dot segments.
	segs, err := pathSegments(tail)
	if len(segs) == 1 && segs[0] == "" {
		segs = nil // GET /v1/pool/ lists too
	}
	if err != nil || slices.ContainsFunc(segs, isDotName) {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_path", "pool key must be URL-escaped, without . or .. segments")
		return
	}
	key := strings.Join(segs, "/")
	tenant, ok := s.requireTenant(ctx)
	if !ok {
		return
	}
	var v any
	switch {
	case key == "events" && ctx.IsGet():
		// The event stream: a key named "events" is still written,
		// deleted and listed as any other, but not read alone.
		s.handlePoolEvents(ctx, tenant)
		return
	case key == "" && ctx.IsGet():
		limit, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("limit")))
		var list []memory.PoolEntry
		list, err = st.PoolList(tenant, string(ctx.QueryArgs().Peek("prefix")), limit)
		if list == nil {
			list = []memory.PoolEntry{}
		}
		v = map[string]any{"object": "list", "data": list}
	case key == "":
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_path", "pool path must be /v1/pool/{key}")
		return
	case ctx.IsGet():
		v, err = st.PoolGet(tenant, key)
	case ctx.IsPut() || ctx.IsPost():
		var w memory.PoolWrite
		if err := json.Unmarshal(ctx.Request.Body(), &w); err != nil || len(w.Value) == 0 {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_pool_write",
				`body must be a JSON object {"value": any JSON, "metadata": {…}, "expected_version": n}`)
			return
		}
		w.Session = string(ctx.Request.Header.Peek("X-Session-ID"))
		var e memory.PoolEntry
		e, err = st.PoolPut(tenant, key, w)
		if errors.Is(err, memory.ErrConflict) {
			ctx.SetStatusCode(fasthttp.StatusConflict)
			b, _ := json.Marshal(map[string]any{"error": apiErrorBody{
				Message: "expected_version does not match the entry's version", Type: typeInvalidRequest, Code: "version_conflict",
			}, "current": e})
			ctx.SetContentType("application/json")
			ctx.SetBody(b)
			return
		}
		v = e
	case ctx.IsDelete():
		var ev uint64
		if q := ctx.QueryArgs().Peek("expected_version"); len(q) > 0 {
			if ev, err = strconv.ParseUint(string(q), 10, 64); err != nil || ev == 0 {
				writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_expected_version", "expected_version must be a positive integer")
				return
			}
		}
		err = st.PoolDelete(tenant, key, ev)
		v = map[string]any{"key": key, "object": "pool.entry.deleted", "deleted": err == nil}
	default:
		ctx.Response.Header.Set("Allow", "GET, PUT, DELETE")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use GET, PUT or DELETE")
		return
	}
	switch {
	case err == nil:
		writeJSON(ctx, fasthttp.StatusOK, v)
	case errors.Is(err, memory.ErrConflict):
		writeError(ctx, fasthttp.StatusConflict, typeInvalidRequest, "version_conflict", "expected_version does not match the entry's version")
	case errors.Is(err, memory.ErrNotFound):
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "pool_key_not_found", "no pool entry of this key for this API key")
	case errors.Is(err, memory.ErrInvalid):
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_pool_write", strings.TrimPrefix(err.Error(), "memory: "))
	default:
		s.log.Error("pool failed", "key", key, "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "the memory pool failed; see the sidecar's log")
	}
}
