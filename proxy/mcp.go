package proxy

import (
	"context"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/internal/httpapi"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/mcpserver"
)

// MCP serves the Model Context Protocol endpoint at /mcp (package
// mcpserver). The proxy authenticates each request as it does every other
// route, the bearer's tenant (tenantOf) and the X-User-ID end user, and
// bounds its body before handing it over.
type MCP interface {
	// Serve answers one request for caller, synchronously.
	Serve(parent context.Context, ctx *fasthttp.RequestCtx, c mcpserver.Caller)
	// MaxBodyBytes is the largest body Serve takes.
	MaxBodyBytes() int
	// Stats are the tool's counters, for /metrics.
	Stats() mcpserver.Stats
}

// handleMCP serves /mcp: 404 when the endpoint is off, 413 over its body
// limit, 401 without an API key (anonymous callers only with
// AllowAnonymous, as the sessions API), 400 for a malformed X-User-ID.
func (s *Server) handleMCP(ctx *fasthttp.RequestCtx) {
	if s.opts.MCP == nil {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "mcp_disabled", "the MCP endpoint is off on this sidecar")
		return
	}
	if httpapi.TooLarge(ctx, min(s.opts.MaxBodyBytes, s.opts.MCP.MaxBodyBytes())) {
		return
	}
	tenant, ok := s.requireTenant(ctx)
	if !ok {
		return
	}
	user := string(ctx.Request.Header.Peek("X-User-ID"))
	if user != "" {
		if err := validSessionID(user); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_user_id", fmt.Sprintf("X-User-ID: %v", err))
			return
		}
	}
	s.opts.MCP.Serve(s.stopping, ctx, mcpserver.Caller{Tenant: tenant, User: user})
}

// exportMCPMetrics mirrors the MCP tool's counters into reg at each
// scrape.
func exportMCPMetrics(reg *obs.Registry, m MCP) {
	reg.OnScrape(func() {
		st := m.Stats()
		for _, c := range []struct {
			outcome string
			v       int64
		}{{"full", st.Full}, {"reuse", st.Reuse}, {"none", st.None}, {"not_found", st.NotFound}, {"invalid", st.Invalid}, {"error", st.Errors}} {
			reg.SetCounter(fmt.Sprintf("sidecar_mcp_tool_calls_total{tool=\"session_recall\",outcome=%q}", c.outcome),
				"MCP tool calls by outcome: full and reuse recalled (a full retrieval, or the working memory's active set), none found nothing, not_found named no session of the caller, invalid had bad arguments, error failed.", c.v)
		}
	})
}
