package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/memory"
)

// Recaller runs the working-memory gated recall of one session for one
// caller; *memory.Store is one. Errors: memory.ErrNotFound (no such session
// for this tenant and end user), memory.ErrInvalid (a bad query), others.
type Recaller interface {
	Recall(ctx context.Context, tenant, sessionID, user, query string) (memory.RecallResult, error)
}

// Caller is whom a request acts for, as the HTTP front authenticated it:
// Tenant is the API key's tenant (never empty), User the end user the
// request names ("" for none).
type Caller struct {
	Tenant, User string
}

// Options configures a Server. Every zero value is a documented default,
// except Memory, which is required (New applies EnsureDefaults and
// Validate).
type Options struct {
	// Memory answers the recalls. Required.
	Memory Recaller
	// Version is the server version announced at initialisation.
	// Default "devel".
	Version string
	// MaxBodyBytes bounds one request body (413 beyond). Default 1 MiB:
	// a tool call is a few hundred bytes.
	MaxBodyBytes int
	// MaxResponseBytes bounds one buffered response (500 beyond; with the
	// other bounds a recall is far below it). Default 4 MiB.
	MaxResponseBytes int
	// MaxMemories bounds the memories one call answers, best first.
	// Default 32.
	MaxMemories int
	// MaxTextBytes bounds each memory's text (cut at a rune boundary,
	// marked with "…"). Default 2000, as a recall block shows it.
	MaxTextBytes int
	// Timeout bounds one MCP request, the recall included. Default 30 s.
	Timeout time.Duration
	// Logger receives the failures. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. New calls it; calling it twice changes nothing.
func (o *Options) EnsureDefaults() *Options {
	if o.Version == "" {
		o.Version = "devel"
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 1 << 20
	}
	if o.MaxResponseBytes == 0 {
		o.MaxResponseBytes = 4 << 20
	}
	if o.MaxMemories == 0 {
		o.MaxMemories = 32
	}
	if o.MaxTextBytes == 0 {
		o.MaxTextBytes = 2000
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *Options) Validate() error {
	switch {
	case o.Memory == nil:
		return errors.New("mcpserver: Memory is required")
	case o.MaxBodyBytes < 0 || o.MaxResponseBytes < 0 || o.MaxMemories < 0 || o.MaxTextBytes < 0 || o.Timeout < 0:
		return errors.New("mcpserver: bounds must not be negative")
	case o.MaxTextBytes < 16:
		return fmt.Errorf("mcpserver: MaxTextBytes %d is below 16", o.MaxTextBytes)
	}
	return nil
}

// Server is the MCP endpoint. Make one with New; Serve is safe for
// concurrent use. It holds no goroutine and no per-client state, so it
// needs no Close.
type Server struct {
	opts Options
	mcp  *mcp.Server
	h    http.Handler
	st   stats
}

// New builds the server and its one tool.
func New(opts Options) (*Server, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "kvsidecar", Title: "kvsidecar session memory", Version: opts.Version},
		&mcp.ServerOptions{Instructions: instructions})
	mcp.AddTool(s.mcp, recallTool, s.recall)
	s.h = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Stateless:           true,
		JSONResponse:        true,
		MaxRequestBodyBytes: int64(opts.MaxBodyBytes),
		Logger:              opts.Logger,
		// The SDK refuses a request that reached a loopback address under
		// another Host name (DNS rebinding). Here every call needs an API
		// key, as on all the sidecar's routes, and a sidecar is often
		// reached through a proxy on the same machine under the public
		// name; the key is the protection.
		DisableLocalhostProtection: true,
	})
	return s, nil
}

// MaxBodyBytes is the largest request body Serve accepts; the front
// answers 413 beyond it before calling Serve.
func (s *Server) MaxBodyBytes() int { return s.opts.MaxBodyBytes }

type callerKey struct{}

// callerOf returns the caller Serve put in the request's context; the SDK
// passes the HTTP request's context values to the tool handler
// (stateless mode connects each request with it).
func callerOf(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok && c.Tenant != ""
}

// Serve answers one MCP request (POST /mcp, and GET or DELETE, which a
// stateless server refuses with 405) for caller, synchronously: the SDK's
// handler runs in this goroutine under a context derived from parent and
// bounded by Options.Timeout, and its buffered answer is copied to ctx.
// The caller must have authenticated the request and bounded its body.
func (s *Server) Serve(parent context.Context, ctx *fasthttp.RequestCtx, c Caller) {
	if c.Tenant == "" {
		writeError(ctx, fasthttp.StatusUnauthorized, "invalid_request_error", "missing_api_key", "the MCP endpoint needs an API key (Authorization: Bearer …)")
		return
	}
	if id, ok := isListen(ctx); ok {
		// A subscription stream (protocol 2026-07-28) stays open until the
		// client leaves; this server sends no notifications and answers
		// in one buffered body, so it refuses one at once.
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id,
			"error": map[string]any{"code": -32601, "message": "subscriptions/listen is not offered: this server sends no notifications"}})
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
		return
	}
	rctx, cancel := context.WithTimeout(context.WithValue(parent, callerKey{}, c), s.opts.Timeout)
	defer cancel()
	r, err := httpRequest(rctx, ctx)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "invalid_request", "could not read the request: "+err.Error())
		return
	}
	w := &bufWriter{h: http.Header{}, limit: s.opts.MaxResponseBytes}
	s.h.ServeHTTP(w, r)
	status, hdr, body, over := w.finish()
	if over {
		s.opts.Logger.Error("mcp: response over the limit", "limit", s.opts.MaxResponseBytes)
		writeError(ctx, fasthttp.StatusInternalServerError, "server_error", "response_too_large", "the MCP answer exceeded the server's limit")
		return
	}
	if status >= 400 && isPlainText(hdr.Get("Content-Type")) {
		// The transport's own refusals (wrong method, media type, Accept,
		// body too large) come as plain text; answer them in the shape
		// every other error of the sidecar has.
		writeError(ctx, status, errorType(status), errorCode(status), string(bytes.TrimSpace(body)))
		if a := hdr.Get("Allow"); a != "" {
			ctx.Response.Header.Set("Allow", a)
		}
		return
	}
	ctx.SetStatusCode(status)
	for k, vs := range hdr {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Content-Length", "Transfer-Encoding", "Keep-Alive":
			continue // the front owns the connection's framing
		}
		for _, v := range vs {
			ctx.Response.Header.Add(k, v)
		}
	}
	ctx.SetBody(body)
}

// isListen reports whether the request asks for a subscription stream
// (subscriptions/listen, alone or in a batch), and its id.
func isListen(ctx *fasthttp.RequestCtx) (json.RawMessage, bool) {
	if string(ctx.Request.Header.Peek("Mcp-Method")) == methodListen {
		return json.RawMessage("null"), true
	}
	body := bytes.TrimSpace(ctx.PostBody())
	if !bytes.Contains(body, []byte(methodListen)) {
		return nil, false
	}
	type msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	var msgs []msg
	if len(body) > 0 && body[0] == '[' {
		_ = json.Unmarshal(body, &msgs)
	} else {
		var m msg
		if json.Unmarshal(body, &m) == nil {
			msgs = append(msgs, m)
		}
	}
	for _, m := range msgs {
		if m.Method == methodListen {
			if len(m.ID) == 0 {
				m.ID = json.RawMessage("null")
			}
			return m.ID, true
		}
	}
	return nil, false
}

const methodListen = "subscriptions/listen"

// httpRequest copies the fasthttp request into a net/http one with ctx:
// strings and body are copies, so nothing refers to the fasthttp buffers
// once Serve returns.
func httpRequest(ctx context.Context, fc *fasthttp.RequestCtx) (*http.Request, error) {
	body := bytes.Clone(fc.PostBody())
	r, err := http.NewRequestWithContext(ctx, string(fc.Method()), "http://"+string(fc.Host())+string(fc.RequestURI()), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	r.RequestURI = string(fc.RequestURI())
	r.Host = string(fc.Host())
	r.RemoteAddr = fc.RemoteAddr().String()
	for k, v := range fc.Request.Header.All() {
		r.Header.Add(string(k), string(v))
	}
	return r, nil
}

// bufWriter is the http.ResponseWriter Serve hands the SDK: the answer is
// kept in memory up to limit bytes (the responses are JSON, never a
// stream). Writes after finish fail.
type bufWriter struct {
	// mu protects the fields below: the SDK may write from the goroutine
	// that handles the message.
	mu     sync.Mutex
	h      http.Header
	status int
	buf    bytes.Buffer
	limit  int
	over   bool
	done   bool
}

var errWriterDone = errors.New("mcpserver: response already sent")

func (w *bufWriter) Header() http.Header { return w.h }

func (w *bufWriter) WriteHeader(code int) {
	w.mu.Lock()
	if w.status == 0 {
		w.status = code
	}
	w.mu.Unlock()
}

func (w *bufWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return 0, errWriterDone
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.buf.Len()+len(p) > w.limit {
		w.over = true
		return 0, fmt.Errorf("mcpserver: response over %d bytes", w.limit)
	}
	return w.buf.Write(p)
}

// finish ends the response and returns it.
func (w *bufWriter) finish() (status int, h http.Header, body []byte, over bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	status = w.status
	if status == 0 {
		status = http.StatusOK
	}
	return status, w.h.Clone(), w.buf.Bytes(), w.over
}

func isPlainText(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/plain"
}

func errorType(status int) string {
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

func errorCode(status int) string {
	switch status {
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case http.StatusRequestEntityTooLarge:
		return "body_too_large"
	case http.StatusUnsupportedMediaType:
		return "unsupported_media_type"
	case http.StatusNotAcceptable:
		return "not_acceptable"
	case http.StatusNotFound:
		return "not_found"
	}
	if status >= 500 {
		return "internal"
	}
	return "invalid_request"
}

// writeError answers an OpenAI-shaped error, as the rest of the sidecar.
func writeError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	b, _ := json.Marshal(map[string]map[string]string{"error": {"message": msg, "type": typ, "code": code}})
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// Stats are the tool's counters since New.
type Stats struct {
	// Calls of session_recall by outcome: Full and Reuse answered with
	// memories found by a full retrieval or by the working memory's
	// reuse, None found nothing, NotFound named no session of the caller,
	// Invalid had a bad query, Errors failed.
	Full, Reuse, None, NotFound, Invalid, Errors int64
}

type stats struct {
	full, reuse, none, notFound, invalid, errors atomic.Int64
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	return Stats{Full: s.st.full.Load(), Reuse: s.st.reuse.Load(), None: s.st.none.Load(),
		NotFound: s.st.notFound.Load(), Invalid: s.st.invalid.Load(), Errors: s.st.errors.Load()}
}
