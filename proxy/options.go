package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Options configures a Server. The zero value of every field but Upstream is
// a documented default.
type Options struct {
	// Upstream is the base URL of the OpenAI-compatible server, e.g.
	// http://127.0.0.1:8000. A path is kept and each route is appended to
	// it (as nginx's proxy_pass with a URI): http://gw/prefix forwards
	// /v1/chat/completions to /prefix/v1/chat/completions. A trailing /v1
	// names the API root and is not doubled: http://gw/prefix/v1 forwards
	// to the same place. Required.
	Upstream string

	// MaxBodyBytes bounds a request body; larger bodies get 413.
	// Default 32 MiB.
	MaxBodyBytes int

	// MaxResponseBytes bounds a buffered (non-streamed) upstream response;
	// a larger one is a 502. Streams are not bounded as a whole.
	// Default 256 MiB.
	MaxResponseBytes int64

	// UpstreamTimeout bounds the wait for the upstream's response headers;
	// past it the client gets 504. Default 10 minutes (long generations
	// without streaming answer only when done).
	UpstreamTimeout time.Duration

	// StreamIdleTimeout bounds the silence between two reads of a response
	// body (streamed or not); past it the stream is aborted. Default 5 minutes.
	StreamIdleTimeout time.Duration

	// DialTimeout bounds connecting to the upstream. Default 5 seconds.
	DialTimeout time.Duration

	// ReadTimeout and WriteTimeout bound reading a client's request and
	// writing one chunk of the response. IdleTimeout bounds an idle
	// keep-alive client connection. Defaults 60 s, 60 s and 120 s.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	IdleTimeout  time.Duration

	// EventLoop serves the pass-through — a non-streamed chat or
	// completions POST without a session — on an event loop of its own
	// (one locked thread on epoll, Linux), and every other request on the
	// fasthttp server as before. It needs a TCP listener, a plain-HTTP
	// upstream at an IP address and no engine connector, or one whose
	// hooks never block (engine.NonBlocking: the generic one); otherwise
	// it stays off (logged). Default off.
	EventLoop bool

	// MaxIdleConnsPerHost is the upstream connection pool size.
	// Default 256.
	MaxIdleConnsPerHost int

	// UpstreamIdleTimeout closes a pooled upstream connection idle this
	// long. Default 2 seconds: below the 5 s after which llama-server and
	// uvicorn (vLLM, SGLang) close idle keep-alive connections, so the
	// pool seldom holds one the upstream already closed. (One it does hold
	// is found on checkout, and a request that meets one anyway is sent
	// again on a fresh connection.)
	UpstreamIdleTimeout time.Duration

	// ReadyCacheTTL is how long a /readyz probe result is reused.
	// Default 2 seconds.
	ReadyCacheTTL time.Duration

	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger

	// Memory keeps session history and builds each chat request's window
	// (sessions named by X-Session-ID or prompt_cache_key), usually a
	// *memory.Store. Nil: every request is a stateless passthrough and
	// /v1/sessions answers 404; GET /v1/sessions lists only when it is
	// also a SessionLister. The Server does not close it.
	Memory Memory

	// KV serves PUT|GET|HEAD|DELETE /v1/kv/{namespace}/{key}, usually a
	// *kv.Cache. Nil: 404 there. The Server does not close it.
	KV KV

	// MaxKVBytes bounds a KV API body (413 beyond); the server reads bodies
	// up to max(MaxBodyBytes, MaxKVBytes, MaxSnapshotBytes) and checks per
	// route. Default 64 MiB.
	MaxKVBytes int

	// MaxSnapshotBytes bounds a context snapshot (.hctx) imported with
	// PUT /v1/sessions/{id}/snapshot (413 beyond) and what an export puts
	// in one: the session's memory, then its newest KV states that fit.
	// Default 64 MiB (about 500 tokens of Llama-3-8B KV in fp16, 30,000 of
	// a tiny test model): raise it for real models.
	MaxSnapshotBytes int

	// Engine is the engine connector (package engine: a plugin such as
	// engine/llamacpp, which moves a session's prefix KV in and out of the
	// LLM server around each chat and completions request, or
	// engine/generic, which only keeps stats); the Server calls the hooks
	// it implements (engine.Wrap). Nil: none. The Server does not close
	// it. DELETE /v1/sessions/{id} also has it Forget the session's KV.
	Engine engine.Plugin

	// Metrics is the registry /metrics writes (package obs): the Server
	// adds its own families and those of what it was given (memory, KV,
	// engine, MCP). Nil: a registry of its own.
	Metrics *obs.Registry

	// MCP serves the Model Context Protocol endpoint at /mcp (package
	// mcpserver: the tool session_recall over the caller's own memory),
	// usually a *mcpserver.Server over the same Memory. Nil: /mcp answers
	// 404. The Server does not close it.
	MCP MCP

	// Fleet, when set, serializes each session's turns across the replicas
	// of a fleet that share one store (package fleet): a chat or
	// completions request of a session holds the session's lease from
	// before its messages are recorded until its reply is recorded and the
	// engine settled its KV (the connector's engine.Settler hook), so the replica that
	// serves the next turn finds both. Nil: one machine, no lease.
	Fleet Fleet

	// AllowAnonymous lets requests without a bearer token (no
	// Authorization header, an empty one, or "Bearer" alone) share one
	// tenant named "anonymous": its sessions, pool and KV are open to every
	// such client. Default false: those requests keep no state — chat and
	// completions go through statelessly even with a session id, and the
	// sessions, pool and KV APIs answer 401.
	AllowAnonymous bool
	// NoContextProbe stops the sidecar from asking the upstream for its
	// context and token counts (GET /props and /v1/models, POST /tokenize,
	// at start and every few minutes; see ctxlimit.go). The context is then
	// learned only from answers and context errors. Default false.
	NoContextProbe bool

	// Windows is told of each window built for a session and of each
	// session deleted: the operator console keeps the last windows
	// (package admin's Windows). Nil: nobody is told.
	Windows Windows

	// PoolEventsHeartbeat is the period of the comment line a pool event
	// stream (GET /v1/pool/events) sends while no event comes, so that
	// proxies keep it open and a client that left is noticed. Zero: 15 s.
	PoolEventsHeartbeat time.Duration
}

// EnsureDefaults fills the zero fields with the defaults their comments
// give and returns o (pebble's idiom, as memory.Options).
func (o *Options) EnsureDefaults() *Options {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 32 << 20
	}
	if o.MaxKVBytes == 0 {
		o.MaxKVBytes = 64 << 20
	}
	if o.MaxSnapshotBytes == 0 {
		o.MaxSnapshotBytes = 64 << 20
	}
	if o.MaxResponseBytes == 0 {
		o.MaxResponseBytes = 256 << 20
	}
	if o.UpstreamTimeout == 0 {
		o.UpstreamTimeout = 10 * time.Minute
	}
	if o.StreamIdleTimeout == 0 {
		o.StreamIdleTimeout = 5 * time.Minute
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = 60 * time.Second
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = 60 * time.Second
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 120 * time.Second
	}
	if o.MaxIdleConnsPerHost == 0 {
		o.MaxIdleConnsPerHost = 256
	}
	if o.UpstreamIdleTimeout == 0 {
		o.UpstreamIdleTimeout = 2 * time.Second
	}
	if o.ReadyCacheTTL == 0 {
		o.ReadyCacheTTL = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.PoolEventsHeartbeat == 0 {
		o.PoolEventsHeartbeat = 15 * time.Second
	}
	return o
}

// Validate checks the options after EnsureDefaults: the upstream URL,
// and no negative timeout or size.
func (o *Options) Validate() error {
	_, err := o.upstreamURL()
	return err
}

// upstreamURL checks the options and returns the parsed upstream base URL:
// without a trailing "/" or "/v1", its path as escaped on the wire.
func (o *Options) upstreamURL() (*url.URL, error) {
	if o.Upstream == "" {
		return nil, errors.New("proxy: upstream URL is required")
	}
	u, err := url.Parse(o.Upstream)
	if err != nil {
		return nil, fmt.Errorf("proxy: upstream %q: %w", o.Upstream, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("proxy: upstream %q: scheme must be http or https", o.Upstream)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("proxy: upstream %q: missing host", o.Upstream)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("proxy: upstream %q: must not carry a query or fragment", o.Upstream)
	}
	// The path as escaped on the wire: "/a%2Fb" stays one segment.
	p := strings.TrimSuffix(strings.TrimSuffix(u.EscapedPath(), "/"), "/v1")
	if u.Path, err = url.PathUnescape(p); err != nil {
		return nil, fmt.Errorf("proxy: upstream %q: %w", o.Upstream, err)
	}
	u.RawPath = p
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"upstream timeout", o.UpstreamTimeout}, {"stream idle timeout", o.StreamIdleTimeout},
		{"dial timeout", o.DialTimeout}, {"read timeout", o.ReadTimeout},
		{"write timeout", o.WriteTimeout}, {"idle timeout", o.IdleTimeout},
		{"ready cache TTL", o.ReadyCacheTTL},
		{"upstream idle timeout", o.UpstreamIdleTimeout},
	} {
		if d.v < 0 {
			return nil, fmt.Errorf("proxy: %s must not be negative, got %s", d.name, d.v)
		}
	}
	if o.MaxBodyBytes < 0 || o.MaxKVBytes < 0 || o.MaxSnapshotBytes < 0 || o.MaxResponseBytes < 0 || o.MaxIdleConnsPerHost < 0 {
		return nil, errors.New("proxy: size limits must not be negative")
	}
	return u, nil
}

// Fleet is what the proxy needs of a fleet's shared store.
type Fleet interface {
	// Acquire takes the session's lease for one turn, waiting (bounded)
	// while another replica holds it. release is called exactly once,
	// when the turn's reply and KV are written through. An error means
	// the lease stayed elsewhere: the request is answered 503.
	Acquire(ctx context.Context, tenant, session string) (release func(), err error)
}

// Memory is what the chat path, the sessions API and the pool need of
// session memory (package memory's Store).
type Memory interface {
	// Prepare builds a chat turn's window; the turn is then completed or
	// aborted exactly once.
	Prepare(ctx context.Context, req memory.TurnRequest) (*memory.Turn, error)
	CountTokensContext(ctx context.Context, model, text string) (int, error)
	// MaxReplyBytes bounds the reply text recorded for one turn.
	MaxReplyBytes() int
	Stats() memory.Stats

	Session(tenant, sessionID string) (memory.SessionView, error)
	Memory(tenant, sessionID string) (memory.MemoryView, error)
	Delete(tenant, sessionID string) error

	PoolGet(tenant, key string) (memory.PoolEntry, error)
	PoolPut(tenant, key string, w memory.PoolWrite) (memory.PoolEntry, error)
	PoolDelete(tenant, key string, expectedVersion uint64) error
	PoolList(tenant, prefix string, limit int) ([]memory.PoolEntry, error)
	// PoolSubscribe follows the pool's writes and deletes under a prefix
	// (GET /v1/pool/events).
	PoolSubscribe(tenant, prefix string, after uint64) (*memory.PoolSubscription, error)
}

// SessionLister is what GET /v1/sessions needs beyond Memory: a tenant's
// sessions (of one user), newest first.
type SessionLister interface {
	Sessions(tenant string, user *string, limit int) ([]memory.SessionInfo, error)
}

// Windows is told of the windows the chat path builds and of the sessions
// it deletes (Options.Windows); *admin.Windows implements it. Window runs
// on the request path, before the request goes upstream: it must be cheap.
type Windows interface {
	Window(tenant, session string, at time.Time, turn *memory.Turn)
	Forget(tenant, session string)
}

// KV is what the KV API and the metrics need of the KV cache
// (package kv's Cache).
type KV interface {
	PutBlob(ns, key string, meta kv.BlobMeta, data []byte) error
	GetBlob(ns, key string) (kv.BlobMeta, []byte, tiers.Tier, error)
	StatBlob(ns, key string) (kv.BlobMeta, tiers.Tier, error)
	DeleteBlob(ns, key string) error
	Stats() kv.Stats
	AmortizationStats() kv.AmortizationStats
}

var (
	_ Memory        = (*memory.Store)(nil)
	_ SessionLister = (*memory.Store)(nil)
	_ KV            = (*kv.Cache)(nil)
)
