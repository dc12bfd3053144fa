package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// handleKV serves the KV API for engine-side connectors:
// PUT|GET|HEAD|DELETE /v1/kv/{namespace}/{key}, octet-stream bodies with
// optional X-KV-Dtype and X-KV-Shape; reads add X-KV-Tier. Namespaces are
// scoped by tenant like sessions. A PUT answered 201 is durable (fsynced to
// the archive) and survives kill -9. tail is the raw path after /v1/kv (see
// route.go).
func (s *Server) handleKV(ctx *fasthttp.RequestCtx, tail []byte) {
	c := s.opts.KV
	if c == nil {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "kv_disabled", "the KV API is disabled on this sidecar")
		return
	}
	// tail is "/{namespace}/{key}": the namespace one escaped segment, the
	// key the rest (plain or escaped slashes alike); no dot segments, which
	// clients and servers resolve differently.
	segs, err := pathSegments(tail)
	if err != nil || len(segs) < 2 || segs[0] == "" || slices.Contains(segs[1:], "") || slices.ContainsFunc(segs, isDotName) {
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_path", "KV path must be /v1/kv/{namespace}/{key}, both URL-escaped, not empty, without . or .. segments")
		return
	}
	key := strings.Join(segs[1:], "/")
	tenant, ok := s.requireTenant(ctx)
	if !ok {
		return
	}
	ns := tenant + "/" + segs[0]

	switch string(ctx.Method()) {
	case fasthttp.MethodPut, fasthttp.MethodPost:
		meta, err := kvMetaFromHeaders(ctx)
		if err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_kv_meta", err.Error())
			return
		}
		if err := c.PutBlob(ns, key, meta, ctx.Request.Body()); err != nil {
			s.kvError(ctx, err)
			return
		}
		ctx.SetStatusCode(fasthttp.StatusCreated)
	case fasthttp.MethodGet:
		meta, data, tier, err := c.GetBlob(ns, key)
		if err != nil {
			s.kvError(ctx, err)
			return
		}
		setKVHeaders(ctx, meta, tier)
		ctx.SetBody(data)
	case fasthttp.MethodHead:
		meta, tier, err := c.StatBlob(ns, key)
		if err != nil {
			s.kvError(ctx, err)
			return
		}
		setKVHeaders(ctx, meta, tier)
		ctx.Response.SkipBody = true
		ctx.Response.Header.SetContentLength(int(meta.Size))
	case fasthttp.MethodDelete:
		if err := c.DeleteBlob(ns, key); err != nil {
			s.kvError(ctx, err)
			return
		}
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	default:
		ctx.Response.Header.Set("Allow", "PUT, GET, HEAD, DELETE")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use PUT, GET, HEAD or DELETE")
	}
}

func kvMetaFromHeaders(ctx *fasthttp.RequestCtx) (kv.BlobMeta, error) {
	var meta kv.BlobMeta
	dt, err := tiers.ParseDType(string(ctx.Request.Header.Peek("X-KV-Dtype")))
	if err != nil {
		return meta, fmt.Errorf("X-KV-Dtype: want f16, bf16, f32 or q8")
	}
	meta.DType = dt
	if sh := strings.TrimSpace(string(ctx.Request.Header.Peek("X-KV-Shape"))); sh != "" {
		for _, f := range strings.Split(sh, ",") {
			d, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil || d <= 0 {
				return meta, fmt.Errorf("X-KV-Shape: want comma-separated positive integers, got %q", sh)
			}
			meta.Shape = append(meta.Shape, d)
		}
	}
	return meta, nil
}

func setKVHeaders(ctx *fasthttp.RequestCtx, meta kv.BlobMeta, tier tiers.Tier) {
	ctx.SetContentType("application/octet-stream")
	if s := meta.DType.String(); s != "" {
		ctx.Response.Header.Set("X-KV-Dtype", s)
	}
	if len(meta.Shape) > 0 {
		parts := make([]string, len(meta.Shape))
		for i, d := range meta.Shape {
			parts[i] = strconv.FormatInt(d, 10)
		}
		ctx.Response.Header.Set("X-KV-Shape", strings.Join(parts, ","))
	}
	ctx.Response.Header.Set("X-KV-Tier", tier.String())
}

func (s *Server) kvError(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, kv.ErrNotFound):
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "kv_not_found", "no such KV entry")
	case errors.Is(err, kv.ErrInvalid):
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_kv", strings.TrimPrefix(err.Error(), "kv: "))
	case errors.Is(err, kv.ErrTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, typeInvalidRequest, "kv_too_large", strings.TrimPrefix(err.Error(), "kv: "))
	default:
		s.log.Error("KV API failed", "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "kv_store_failed", "the KV store failed; see the sidecar's log")
	}
}
