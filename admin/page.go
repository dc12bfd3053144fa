package admin

import (
	"io/fs"
	"mime"
	"path"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/ui"
)

// The console's page: package ui's embedded files at /ui/, for anyone (the
// page holds no data and asks for the token), under a strict policy.

// handleConsole serves /ui and /ui/… from package ui.
func (s *Server) handleConsole(ctx *fasthttp.RequestCtx, raw []byte) {
	if !s.consoleOn() {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "console_disabled",
			"the console is off; start the sidecar with --admin-token (or SIDECAR_ADMIN_TOKEN) to turn it on")
		return
	}
	if !ctx.IsGet() && !ctx.IsHead() {
		writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use GET")
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		return
	}
	if string(raw) == "/ui" {
		ctx.Redirect("/ui/", fasthttp.StatusMovedPermanently)
		return
	}
	name := strings.TrimPrefix(string(raw), "/ui/")
	if name == "" {
		name = "index.html"
	}
	if !fs.ValidPath(name) || strings.ContainsAny(name, `%\`) {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "not_found", "no such console file")
		return
	}
	b, err := fs.ReadFile(ui.Files, name)
	if err != nil {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "not_found", "no such console file")
		return
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	h := &ctx.Response.Header
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; form-action 'none'; base-uri 'none'")
	ctx.SetBody(b)
}
