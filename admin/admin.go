package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/frontdoor"
	"github.com/kvsidecar/kvsidecar/internal/histogram"
	"github.com/kvsidecar/kvsidecar/internal/httpapi"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/respstore"
)

// Options configure a Server. The zero value of each field is the default
// its comment gives; EnsureDefaults fills them and Validate checks them
// (New does both). Front, Health, Metrics and Sessions are required.
type Options struct {
	// Token is the console's bearer token (--admin-token): the page at
	// /ui and its API under /admin/v1 answer only with it, and 404 when it
	// is "". At least 16 bytes, without spaces or control characters.
	Token string
	// Pprof serves Go's /debug/pprof (--admin-pprof). Heap dumps hold
	// prompts: keep the admin listener on loopback.
	Pprof bool
	// SampleEvery is the period of the console's KV time series (hit rate,
	// tier occupancy), kept for the last Samples samples. Default 5 s and
	// 720 (an hour).
	SampleEvery time.Duration
	Samples     int
	// MaxBodyBytes bounds an admin API call's body: at most (and by
	// default) 1 MiB. The sidecar gives it the main listener's bound, so
	// that a smaller one holds here too.
	MaxBodyBytes int
	// ReadTimeout, WriteTimeout and IdleTimeout are the listener's
	// connection timeouts: default 60 s, 60 s and 120 s, as the main
	// listener's. Writes get at least a minute: a CPU profile takes 30 s.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// Front, Health and Metrics are the proxy's (*proxy.Server and its
	// Metrics): the front door every connection is read through, the
	// request counters, /healthz, /readyz and the one metrics registry.
	Front   Front
	Health  Health
	Metrics Metrics
	// Sessions is the proxy's part of the console (*proxy.Server).
	Sessions Sessions
	// Windows keeps the last window of recently served sessions; the proxy
	// fills it (proxy.Options.Windows). Nil: the console shows none.
	Windows *Windows
	// Memory, Knowledge, KV, Engine and RESP are what the console shows;
	// each nil when the sidecar runs without it.
	Memory    Memory
	Knowledge Knowledge
	KV        KV
	Engine    Engine
	RESP      RESP
}

// EnsureDefaults fills the zero fields with their defaults and returns o.
func (o *Options) EnsureDefaults() *Options {
	if o.SampleEvery == 0 {
		o.SampleEvery = 5 * time.Second
	}
	if o.Samples == 0 {
		o.Samples = 720
	}
	if o.MaxBodyBytes == 0 || o.MaxBodyBytes > maxAdminBody {
		o.MaxBodyBytes = maxAdminBody
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
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate checks o after EnsureDefaults.
func (o *Options) Validate() error {
	if o.Front == nil || o.Health == nil || o.Metrics == nil || o.Sessions == nil {
		return errors.New("admin: Front, Health, Metrics and Sessions are required")
	}
	if o.SampleEvery < 0 || o.ReadTimeout < 0 || o.WriteTimeout < 0 || o.IdleTimeout < 0 {
		return errors.New("admin: the console sample period and the timeouts must not be negative")
	}
	if o.Samples < 0 || o.MaxBodyBytes < 0 {
		return errors.New("admin: sizes must not be negative")
	}
	if o.Token != "" {
		if len(o.Token) < minTokenLen {
			return fmt.Errorf("admin: the admin token must be at least %d bytes long, got %d", minTokenLen, len(o.Token))
		}
		if strings.TrimSpace(o.Token) != o.Token || strings.ContainsFunc(o.Token, func(r rune) bool { return r < 0x21 || r == 0x7f }) {
			return errors.New("admin: the admin token must not contain spaces or control characters")
		}
	}
	return nil
}

// minTokenLen is the shortest admin token accepted.
const minTokenLen = 16

// Front is what the admin listener reads its requests through and counts
// them in: the proxy's strict front door (package frontdoor, so that the
// admin listener refuses hostile bytes as the main one does), its answer to
// a body fasthttp could not read, and its request metrics. *proxy.Server
// implements it.
type Front interface {
	// FrontListener serves ln's connections through the front door.
	FrontListener(ln net.Listener) net.Listener
	// HandleParseError answers a request fasthttp could not read.
	HandleParseError(ctx *fasthttp.RequestCtx, err error)
	// CountRequest counts a request in flight; done counts it as ended
	// under the route of that name with its status.
	CountRequest() (done func(route string, status int))
}

// Health answers /healthz and /readyz (the upstream's readiness) as the
// proxy does. *proxy.Server implements it.
type Health interface {
	HandleHealth(ctx *fasthttp.RequestCtx)
	HandleReady(ctx *fasthttp.RequestCtx)
}

// Metrics writes the sidecar's metrics in the Prometheus text format
// (*proxy.Metrics, over the one registry).
type Metrics interface {
	WritePrometheus(w io.Writer)
}

// Sessions is the proxy's part of the console: deleting a session with
// what follows it (its last window, the engine's saved KV), and the
// cumulative counters of the windows it built, which the KV series and
// the thresholds read. *proxy.Server implements it.
type Sessions interface {
	DeleteSession(ctx context.Context, tenant, id string) error
	// WindowCounters returns the windows built, their tokens and their
	// limits, and the memory.Prepare latencies of the turns that recalled.
	WindowCounters() (turns, windowTokens, windowLimit uint64, recall histogram.Snapshot)
}

// Memory is the session store as the console reads and edits it;
// *memory.Store implements it.
type Memory interface {
	Stats() memory.Stats
	Tenants() ([]memory.TenantInfo, error)
	Sessions(tenant string, user *string, limit int) ([]memory.SessionInfo, error)
	Session(tenant, sessionID string) (memory.SessionView, error)
	Memory(tenant, sessionID string) (memory.MemoryView, error)
	AddMemory(tenant, sessionID string, c memory.Category, text string, importance float64) (memory.Unit, error)
	UpdateMemory(tenant, sessionID, unitID string, e memory.MemoryEdit) (memory.Unit, error)
	DeleteMemory(tenant, sessionID, unitID string) error
	Boost(tenant, sessionID, unitID string) (float64, error)
}

// KV is the KV cache's counters; *kv.Cache implements it.
type KV interface {
	Stats() kv.Stats
	AmortizationStats() kv.AmortizationStats
}

// Engine is the engine connector's figures; *engine.Hooks implements it.
type Engine interface {
	Report() engine.Report
	Stats() engine.Stats
	ConsoleFacts() engine.Facts
	SessionStats(tenant, sessionID string) (engine.SessionStats, bool)
}

// RESP is the RESP listener's figures (package respstore: the admin
// listener reads its Stats as they are); *respstore.Server implements it.
type RESP interface {
	Stats() respstore.Stats
}

var (
	_ Memory    = (*memory.Store)(nil)
	_ Knowledge = (*memory.Store)(nil)
	_ KV        = (*kv.Cache)(nil)
	_ Engine    = (*engine.Hooks)(nil)
	_ RESP      = (*respstore.Server)(nil)
)

// Server is the admin listener. Make one with New, serve with Serve, stop
// with Shutdown. Its methods are safe for concurrent use.
type Server struct {
	opts Options
	log  *slog.Logger
	srv  *fasthttp.Server
	// hash is the token's; series is the console's KV time series, filled
	// by the sampler that Serve starts and Shutdown waits for.
	hash    [32]byte
	series  *kvSeries
	windows *Windows

	stopping    context.Context
	stop        context.CancelFunc
	samplerOnce sync.Once
	sampler     sync.WaitGroup
	// mu protects served: what Serve serves, which Shutdown closes (one
	// fasthttp had not taken yet).
	mu     sync.Mutex
	served []net.Listener
}

// New validates opts and builds a Server; nothing listens yet.
func New(opts Options) (*Server, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, series: newKVSeries(0), windows: opts.Windows}
	s.stopping, s.stop = context.WithCancel(context.Background())
	if s.consoleOn() {
		s.hash = sha256.Sum256([]byte(opts.Token))
		s.series = newKVSeries(opts.Samples)
	}
	s.srv = &fasthttp.Server{
		Handler:               s.handle,
		ErrorHandler:          opts.Front.HandleParseError,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		MaxRequestBodySize:    maxAdminBody,
		// As the main listener: the front door hands over heads of up to
		// its MaxHead, rewritten with CRLF line ends.
		ReadBufferSize:  2 * frontdoor.DefaultMaxHead,
		ReadTimeout:     opts.ReadTimeout,
		WriteTimeout:    max(opts.WriteTimeout, time.Minute), // a CPU profile takes 30 s
		IdleTimeout:     opts.IdleTimeout,
		CloseOnShutdown: true,
		Logger:          fasthttpLogger{opts.Logger},
	}
	return s, nil
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
}

// Serve serves the operational endpoints on ln, through the proxy's front
// door, until Shutdown; it returns nil after a clean shutdown. With the
// console on it starts the sampler of its KV series.
func (s *Server) Serve(ln net.Listener) error {
	if s.consoleOn() {
		s.samplerOnce.Do(func() {
			if s.stopping.Err() != nil {
				return // shut down before it served
			}
			s.sampler.Add(1)
			go func() {
				defer s.sampler.Done()
				s.runSampler(s.stopping, s.opts.SampleEvery)
			}()
		})
	}
	s.mu.Lock()
	if s.stopping.Err() != nil {
		s.mu.Unlock()
		_ = ln.Close()
		return nil // shut down before it served
	}
	s.served = append(s.served, ln)
	s.mu.Unlock()
	err := s.srv.Serve(s.opts.Front.FrontListener(ln))
	if err != nil && s.stopping.Err() != nil {
		err = nil // the listener Shutdown closed
	}
	return err
}

// Shutdown stops the sampler and the listener, letting in-flight requests
// finish until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	s.samplerOnce.Do(func() {}) // none starts after this
	s.sampler.Wait()
	s.mu.Lock() // after stop: no Serve starts from here
	served := s.served
	s.mu.Unlock()
	err := s.srv.ShutdownWithContext(ctx)
	for _, ln := range served {
		_ = ln.Close() // one fasthttp had not taken yet
	}
	return err
}

// consoleOn reports whether the console is enabled.
func (s *Server) consoleOn() bool { return s.opts.Token != "" }

// Route names, as the proxy's request metrics label them.
const (
	routeHealthz  = "healthz"
	routeReadyz   = "readyz"
	routeMetrics  = "metrics"
	routeConsole  = "console"
	routeAdmin    = "admin"
	routeNotFound = "not_found"
)

// handle is the listener's handler: it counts the request in the proxy's
// metrics as the main listener counts its own.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	done := s.opts.Front.CountRequest()
	r := s.dispatch(ctx)
	done(r, ctx.Response.StatusCode())
}

// dispatch serves ctx by its raw path and returns its route's name.
func (s *Server) dispatch(ctx *fasthttp.RequestCtx) string {
	raw := ctx.URI().PathOriginal()
	switch string(raw) {
	case "/healthz":
		s.opts.Health.HandleHealth(ctx)
		return routeHealthz
	case "/readyz":
		s.opts.Health.HandleReady(ctx)
		return routeReadyz
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
		s.opts.Metrics.WritePrometheus(ctx)
		return routeMetrics
	}
	if string(raw) == "/ui" || bytes.HasPrefix(raw, []byte("/ui/")) {
		s.handleConsole(ctx, raw)
		return routeConsole
	}
	if string(raw) == "/admin/v1" || bytes.HasPrefix(raw, []byte("/admin/v1/")) {
		if !httpapi.TooLarge(ctx, s.opts.MaxBodyBytes) {
			s.handleAdmin(ctx, raw[len("/admin/v1"):])
		}
		return routeAdmin
	}
	if s.opts.Pprof && bytes.HasPrefix(raw, []byte("/debug/pprof/")) {
		pprofhandler.PprofHandler(ctx)
		return routeAdmin
	}
	writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "not_found",
		"no such path on the admin listener: /healthz, /readyz, /metrics, /ui/, /admin/v1/ and, with --admin-pprof, /debug/pprof/")
	return routeNotFound
}
