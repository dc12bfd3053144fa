package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvsidecar/kvsidecar/admin"
	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/engine/connectors"
	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/adapters/fleet"
	"github.com/kvsidecar/kvsidecar/internal/adapters/llm"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/mcpserver"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/proxy"
	"github.com/kvsidecar/kvsidecar/remote"
	"github.com/kvsidecar/kvsidecar/tiers"
	"github.com/kvsidecar/kvsidecar/tiers/tracefile"
)

// serveConfig is everything `sidecar serve` reads from flags and environment.
type serveConfig struct {
	listen, upstream, dataDir string
	upstreamSet               bool      // --upstream or SIDECAR_UPSTREAM given
	demo                      bool      // --demo: see startDemo
	demoLookAt                string    // where --demo looks for a running upstream; "": defaultUpstream
	hints                     io.Writer // --demo's commands to try; nil: stderr
	upstreamTimeout, idleTO   time.Duration
	upstreamIdle              time.Duration
	upstreamMaxIdle           int
	eventLoop                 bool
	readTO, writeTO, connIdle time.Duration
	shutdownTimeout           time.Duration
	maxBody                   int
	maxResponse               int64
	logLevel, logFormat       string

	windowTokens    int
	recallShare     float64
	statementShare  float64
	recallK         int
	recallCoverage  float64
	evictTo         float64
	graphWeight     float64
	modelWindows    string
	userScope       string
	embedder        string
	embeddingURL    string
	embeddingModel  string
	embeddingDim    int
	embedTimeout    time.Duration
	embedQueryTO    time.Duration
	overflow, fsync string
	engineShifts    string
	shiftEvictTo    float64
	summaryKey      string
	kvStrategy      string
	kvTune          bool
	kvTuneEvery     time.Duration
	kvTrace         string
	maxKV           int
	maxSnapshot     byteSize

	engine  string
	slotDir string
	slots   int
	preload bool
	device  string

	extract        bool
	review         bool
	toolContext    bool
	l4             bool
	l4Threshold    int
	l4Similarity   float64
	l4Fidelity     float64
	poolContext    int
	poolStreams    int
	memoryModel    string
	memoryUpstream string
	pprof          string
	adminListen    string
	adminPprof     bool
	allowAnonymous bool
	contextProbe   bool
	adminToken     string
	consoleEvery   time.Duration
	mcp            bool

	sessionTTL   time.Duration
	maxDiskBytes int64
	memoryBudget byteSize

	resp resp

	remote         string
	remotePrefix   string
	remoteOwner    string
	remoteLeaseTTL time.Duration
	remoteChunk    int
}

func serveFlags(c *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&c.upstream, "upstream", defaultUpstream, "base URL of the OpenAI-compatible upstream")
	fs.StringVar(&c.dataDir, "data-dir", "./data", "folder for sessions, KV archive and indexes")
	fs.BoolVar(&c.demo, "demo", false, "with no --upstream given and none answering at "+defaultUpstream+", serve in front of an embedded demo upstream (no model: its answers describe what the sidecar sent it, and facts are extracted after every turn; data in <data-dir>/demo, the console on) and print commands to try; make run sets it")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", 10*time.Minute, "wait for the upstream's response headers before answering 504")
	fs.DurationVar(&c.idleTO, "stream-idle-timeout", 5*time.Minute, "longest silence inside an upstream response body before it is aborted")
	fs.DurationVar(&c.upstreamIdle, "upstream-idle-timeout", 2*time.Second, "pooled upstream connections idle this long are closed (keep it below the upstream's keep-alive timeout: 5s for llama-server, vLLM, SGLang)")
	fs.BoolVar(&c.eventLoop, "event-loop", true, "serve the pass-through (non-streamed chat and completions without a session) on an event loop of its own: one thread on epoll, nginx's design (Linux; needs a plain-HTTP upstream at an IP address and --engine generic or none, else off); every other request as before (false: all on Go's poller)")
	fs.IntVar(&c.upstreamMaxIdle, "upstream-max-idle", 256, "pooled upstream connections kept idle at most; requests beyond it in flight dial their own, closed after (docs/BENCHMARKS.md measures 8 to 256)")
	fs.DurationVar(&c.readTO, "read-timeout", 60*time.Second, "time to read a client's request")
	fs.DurationVar(&c.writeTO, "write-timeout", 60*time.Second, "time to write one response chunk to a client")
	fs.DurationVar(&c.connIdle, "idle-timeout", 120*time.Second, "idle keep-alive client connections are closed after this")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long in-flight requests and streams may finish")
	fs.IntVar(&c.maxBody, "max-body-bytes", 32<<20, "largest request body accepted (413 beyond)")
	fs.Int64Var(&c.maxResponse, "max-response-bytes", 256<<20, "largest non-streamed upstream response relayed (502 beyond; streams are not bounded as a whole)")
	fs.IntVar(&c.windowTokens, "window-tokens", 8192, "hard token limit of the window sent upstream (the Focus window)")
	fs.Float64Var(&c.recallShare, "recall-share", 0.08, "share of the window for the per-turn recall block next to the newest user message (0 turns recall off)")
	fs.Float64Var(&c.statementShare, "recall-statement-share", 0, "the part of --recall-share a message that asks nothing (no question mark) gets (0: the default, 0.25; negative: no block for such messages)")
	fs.IntVar(&c.recallK, "recall-k", 0, "most memories one recall block shows (0: the default)")
	fs.Float64Var(&c.recallCoverage, "recall-min-coverage", 0, "share of the question's information a memory must hold to be recalled on its words (0: the default)")
	fs.Float64Var(&c.evictTo, "evict-to", 0, "when history overflows the window it is cut to this share of its budget, in one step (0: the default)")
	fs.Float64Var(&c.shiftEvictTo, "shift-evict-to", 0, "--evict-to while the engine moves the KV a prompt keeps (see --engine-shifts): a small step, the engine reuses what stays (0: the default, 0.9)")
	fs.StringVar(&c.engineShifts, "engine-shifts", "auto", "whether the engine moves the KV a prompt keeps when history leaves the window (llama.cpp's KV shifting): auto (what the llamacpp connector learns from its answers; no for other connectors), yes or no. Yes: history leaves in small steps, oldest first")
	fs.Float64Var(&c.graphWeight, "recall-graph-weight", 0, "the knowledge graph's weight in hybrid recall, session and user scope (0: the default 0.2; negative turns graph recall off)")
	fs.StringVar(&c.userScope, "user-scope", "session", "who shares memory when a request names no end user (X-User-ID or the body's user): session (each session recalls only its own memory) or tenant (every session of an API key shares ONE memory: anyone holding the key recalls everyone's words)")
	fs.StringVar(&c.modelWindows, "model-window-tokens", "", "per-model window limits, e.g. 'gpt-4o=128000,llama-3*=32768' (a trailing * matches a prefix)")
	fs.StringVar(&c.embedder, "embedder", "offline", "memory recall embeddings: offline (built in, no model) or upstream (the upstream's /v1/embeddings)")
	fs.StringVar(&c.embeddingURL, "embedding-url", "", "base URL of the OpenAI-compatible /v1/embeddings for --embedder upstream (default: --upstream; llama-server needs --embeddings and a pooling, e.g. --pooling mean)")
	fs.StringVar(&c.embeddingModel, "embedding-model", "", "model name for --embedder upstream (empty: left out of the request, the server's own model)")
	fs.IntVar(&c.embeddingDim, "embedding-dim", 0, "vector size of --embedder upstream's model (0: learned from the answers, followed when the server changes model)")
	fs.DurationVar(&c.embedTimeout, "embedding-timeout", 10*time.Second, "bound on each request to the embeddings endpoint (indexing in the background)")
	fs.DurationVar(&c.embedQueryTO, "embedding-query-timeout", 500*time.Millisecond, "how long a turn's recall waits for its query's embedding before recalling by words")
	fs.StringVar(&c.overflow, "overflow", "importance", "when history overflows the window: importance, tail or summary")
	fs.StringVar(&c.fsync, "fsync", "always", "session log fsync policy: always, interval or never")
	fs.DurationVar(&c.sessionTTL, "session-ttl", 0, "delete a session (log and index) once nothing was written to it for this long (0: never)")
	c.memoryBudget = memory.DefaultMemoryBudget
	fs.Var(&c.memoryBudget, "memory-budget", "bound on the memory that loaded sessions and user indexes hold (estimated): idle ones beyond it leave RAM, least recently used first, and load again from disk on their next turn; bytes or with a unit, e.g. 256MiB (negative: no bound but 4,096 sessions)")
	fs.Int64Var(&c.maxDiskBytes, "max-disk-bytes", 0, "bound on the bytes of sessions and KV archive under --data-dir together; over it the KV archive is trimmed first, then the least recently written sessions are deleted (0: none)")
	fs.BoolVar(&c.extract, "extract", true, "extract facts and episodes from conversations in the background through the upstream model")
	fs.BoolVar(&c.review, "review", true, "review facts whose importance crossed 2.5 or fell below 0.5 in the background (promote to core, keep or delete; needs --extract)")
	fs.BoolVar(&c.toolContext, "tool-context", true, "condense a turn's tool calls and results in the background and show them in the next turn only (needs --extract)")
	fs.BoolVar(&c.l4, "l4", true, "compress a session's facts once they pass --l4-threshold, in the background: facts whose embeddings are similar are merged through the memory model, and a merge replaces them only if its fidelity (0.6 × embedding similarity + 0.4 × keyword retention) reaches --l4-fidelity (needs --extract)")
	fs.IntVar(&c.l4Threshold, "l4-threshold", 0, "facts a session holds before --l4 compresses them (0: the default 150)")
	fs.Float64Var(&c.l4Similarity, "l4-similarity", 0, "cosine similarity at which two facts join an --l4 cluster, in (0, 1] (0: the default 0.75)")
	fs.Float64Var(&c.l4Fidelity, "l4-fidelity", 0, "least fidelity an --l4 merge needs to replace its facts, in (0, 1] (0: the default 0.5)")
	fs.IntVar(&c.poolContext, "pool-context-tokens", 512, "tokens of the shared pool a chat request that names a prefix in X-Pool-Prefix gets in its stable block, newest entries first (negative: the pool is never shown)")
	fs.IntVar(&c.poolStreams, "pool-event-streams", 256, "most open shared pool event streams (GET /v1/pool/events) of all API keys together, 32 per key at most; more get 429 (0: the default)")
	fs.StringVar(&c.memoryModel, "memory-model", "", "model name for the sidecar's own summary and extraction calls (default: the session's model, or the upstream's default)")
	fs.StringVar(&c.memoryUpstream, "memory-upstream", "", "base URL for the sidecar's own summary and extraction calls (default: --upstream, routed through the engine connector)")
	fs.StringVar(&c.summaryKey, "summary-api-key", "", "bearer token for the sidecar's own summary calls to the upstream (local servers need none)")
	fs.StringVar(&c.kvStrategy, "kv-strategy", "", "KV eviction strategy: w-tinylfu (default), lru, lfu, weighted, lru-k or hybrid[:preset]")
	fs.BoolVar(&c.kvTune, "kv-tune", true, "AdaptiveTuner: every --kv-tune-every, move the KV tiers' eviction balance (weighted, hybrid), promotion threshold and Archive zstd level in bounded steps from the live hit rate, latencies and disk pressure (logged, in /metrics and the console)")
	fs.DurationVar(&c.kvTuneEvery, "kv-tune-every", 30*time.Second, "the AdaptiveTuner's epoch (--kv-tune)")
	fs.StringVar(&c.kvTrace, "kv-trace", "", "append every KV store access to this file, keys hashed, for hit-rate replay (bench/simulator; off when empty)")
	fs.IntVar(&c.maxKV, "max-kv-bytes", 64<<20, "largest KV API body accepted (413 beyond)")
	c.maxSnapshot = 64 << 20
	fs.Var(&c.maxSnapshot, "max-snapshot-bytes", "largest context snapshot (.hctx) imported with PUT /v1/sessions/{id}/snapshot (413 beyond), and what an export puts in one (the session's memory, then its newest KV states that fit); bytes or with a unit, e.g. 1GiB (a real model's KV is ~128 KiB a token: raise it)")
	fs.StringVar(&c.device, "device", "auto", deviceFlagUsage)
	fs.StringVar(&c.engine, "engine", "generic", "engine connector: "+connectors.All.Usage())
	fs.StringVar(&c.slotDir, "llamacpp-slot-dir", "", "the llama.cpp server's --slot-save-path, shared with the sidecar (--engine llamacpp)")
	fs.IntVar(&c.slots, "llamacpp-slots", 1, "the llama.cpp server's -np (parallel slots)")
	fs.BoolVar(&c.preload, "llamacpp-preload", true, "predictive preload: while no client request is in flight, restore the saved KV of the session expected to speak next (from the sessions' arrival history) into an idle slot, so its restore leaves the request path")
	fs.StringVar(&c.pprof, "pprof", "", "serve Go's /debug/pprof on a listener of its own at this loopback address, e.g. 127.0.0.1:6060 (heap dumps hold prompts: any other address is refused; off when empty); --admin-pprof serves it on the admin listener instead")
	fs.StringVar(&c.adminListen, "admin-listen", "", "address of the admin listener: the sidecar's own /metrics, the console (/ui), its API (/admin/v1), /healthz and /readyz; the main port's /metrics, /health and / are the engine's (default: 127.0.0.1 at the --listen port + 1000, e.g. 9080 for 8080; port 0 when --listen has port 0; off: none)")
	fs.BoolVar(&c.adminPprof, "admin-pprof", false, "serve Go's /debug/pprof on the admin listener (heap dumps hold prompts: keep the admin listener on loopback)")
	fs.BoolVar(&c.contextProbe, "context-probe", true, "ask the upstream for its context size and token counts (GET /props and /v1/models, POST /tokenize; at start and every few minutes) so memory is added only within what the engine holds; off: learned from answers and context errors alone")
	fs.BoolVar(&c.allowAnonymous, "allow-anonymous", false, "let requests without an API key share one tenant named \"anonymous\" (sessions, pool, KV open to every such client); off: they keep no state and the state APIs answer 401")
	fs.StringVar(&c.adminToken, "admin-token", "", "turn the operator console on at /ui of the admin listener, with its admin API under /admin/v1, for requests carrying Authorization: Bearer <this token> (at least 16 bytes; it sees every tenant); empty: both answer 404")
	fs.BoolVar(&c.mcp, "mcp", true, "serve the MCP endpoint at /mcp (Streamable HTTP): the tool session_recall(query, session_id) over the caller's own session memory, API key and X-User-ID as on every route")
	fs.DurationVar(&c.consoleEvery, "console-sample-every", 5*time.Second, "period of the console's KV time series (hit rate, tier occupancy); the last 720 samples are kept")
	fs.StringVar(&c.remote, "remote", "", "shared store of a fleet of sidecars: redis://[user:pass@]host:port/db, rediss://… (TLS), or redis://host1:port1?addr=host2:port2 (Redis Cluster); sessions and engine states are written through to it and any replica serves any session (empty: this machine only)")
	fs.StringVar(&c.remotePrefix, "remote-prefix", "kvs", "prefix of every key in the --remote store (several deployments can share one store)")
	fs.StringVar(&c.remoteOwner, "remote-owner", "", "this replica's address as the other replicas see it, written into its session leases (default: the --listen address); must be unique in the fleet")
	fs.DurationVar(&c.remoteLeaseTTL, "remote-lease-ttl", 10*time.Second, "how long a session lease outlives a replica that died holding it")
	fs.IntVar(&c.remoteChunk, "remote-chunk-bytes", 4<<20, "chunk size of engine states in the --remote store")
	respFlags(fs, &c.resp)
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or text")
	return fs
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

// parseServe reads serve's configuration from args and the environment.
func parseServe(args []string, getenv func(string) string) (serveConfig, error) {
	var c serveConfig
	fs := serveFlags(&c)
	if err := parseFlags(fs, args, getenv); err != nil {
		return c, err
	}
	fs.Visit(func(f *flag.Flag) { c.upstreamSet = c.upstreamSet || f.Name == "upstream" })
	return c, nil
}

func cmdServe(args []string) int {
	c, err := parseServe(args, os.Getenv)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "sidecar serve:", err)
		return 2
	}
	log, err := newLogger(c.logLevel, c.logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar serve:", err)
		return 2
	}
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go tuneProcs(ctx, log) // the process's own: tests that call serve keep theirs
	if err := serve(ctx, c, log, nil); err != nil {
		log.Error("sidecar stopped", "err", err)
		return 1
	}
	return 0
}

// serve opens every subsystem in order, serves until ctx ends, then closes
// them in reverse order, logging how long each step took. ready, when not
// nil, receives the listening address once the server accepts.
func serve(ctx context.Context, c serveConfig, log *slog.Logger, ready chan<- string) error {
	t0 := time.Now()
	var demo demoStart
	if c.demo {
		d, err := startDemo(&c, log) // first: it decides the upstream and says so
		if err != nil {
			return err
		}
		if demo = d; d.close != nil {
			defer func() { log.Info("closed demo upstream", "err", d.close()) }()
		}
	}
	dataDir, err := filepath.Abs(c.dataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}

	// Open in dependency order; close in reverse.
	var closers []func() error
	var names []string
	var shutdownDeadline time.Time // set when a shutdown starts
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			t := time.Now()
			err := closers[i]()
			log.Info("closed "+names[i], "ms", time.Since(t).Milliseconds(), "err", err)
		}
	}()
	onClose := func(name string, f func() error) { names, closers = append(names, name), append(closers, f) }

	if c.pprof != "" {
		ln, err := listenLoopback(c.pprof)
		if err != nil {
			return fmt.Errorf("--pprof: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		ps := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		served := make(chan error, 1)
		go func() { served <- ps.Serve(ln) }()
		onClose("pprof", func() error {
			err := ps.Close()
			if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, serr)
			}
			return err
		})
		log.Info("pprof listening", "addr", ln.Addr().String())
	}

	t := time.Now()
	dev, err := openDevice(c.device, log)
	if err != nil {
		return fmt.Errorf("open device: %w", err)
	}
	onClose("device "+dev.Name(), dev.Close)
	var focusDev gpu.Device
	if dev.Kind() == gpu.KindCUDA {
		focusDev = dev // on the CPU the store sizes its own host device to the Focus budget
		procsFloor.Store(gpu.CopyWays)
	}
	log.Info("opened device", "ms", time.Since(t).Milliseconds(), "device", dev.Name(), "kind", dev.Kind().String())

	var fl *fleet.Fleet
	var rstore *remote.Store
	var ln net.Listener
	if c.remote != "" {
		// Listen first: the lease owner's default is the bound address
		// (with --listen HOST:0, the port is known only now).
		if ln, err = net.Listen("tcp", c.listen); err != nil {
			return fmt.Errorf("listen %s: %w", c.listen, err)
		}
		defer func() {
			if ln != nil {
				ln.Close() // closed by Serve once serving; here on errors before
			}
		}()
		t = time.Now()
		owner := c.remoteOwner
		if owner == "" {
			owner = defaultOwner(ln.Addr().String())
		}
		remote.SetClientLogger(log)
		rs, err := remote.Open(context.Background(), remote.Options{URL: c.remote, Prefix: c.remotePrefix, TTL: c.sessionTTL,
			ChunkBytes: c.remoteChunk, Owner: owner, LeaseTTL: c.remoteLeaseTTL, Logger: log})
		if err != nil {
			return fmt.Errorf("--remote: %w", err)
		}
		onClose("remote store", rs.Close) // last: memory and the engine write through it until they close
		rstore = rs
		if fl, err = fleet.New(fleet.Options{Store: rs, Logger: log}); err != nil {
			return err
		}
		log.Info("opened remote store", "ms", time.Since(t).Milliseconds(), "prefix", c.remotePrefix, "owner", owner,
			"durability", rs.Durability(), "lease_ttl", c.remoteLeaseTTL.String(), "ttl", c.sessionTTL.String())
	}

	t = time.Now()
	// Blobs of the KV API are bounded by --max-kv-bytes at the HTTP layer;
	// the cache also keeps engine slot states, which can be larger.
	if c.maxDiskBytes < 0 || c.sessionTTL < 0 {
		return errors.New("--max-disk-bytes and --session-ttl must not be negative")
	}
	// With a disk budget the archive alone never exceeds it; the session
	// store's retention sweep trims it further to leave sessions room.
	reg := obs.New() // the one metrics registry /metrics writes
	storeOpts := tiers.Options{Dir: filepath.Join(dataDir, "kv"), Strategy: c.kvStrategy, Device: focusDev,
		Archive: tiers.Budget{MaxBytes: c.maxDiskBytes}, Metrics: reg}
	if c.kvTrace != "" {
		trace, err := tracefile.Create(c.kvTrace)
		if err != nil {
			return fmt.Errorf("--kv-trace: %w", err)
		}
		onClose("KV trace", trace.Close)
		storeOpts.Trace = trace.Record
		log.Info("recording KV accesses", "file", c.kvTrace)
	}
	kvo := kv.Options{Store: storeOpts, MaxBlobBytes: max(int64(c.maxKV), 1<<30)}
	if c.kvTune {
		kvo.Tuner = &tiers.TunerOptions{Every: c.kvTuneEvery, Logger: log}
	}
	kvc, err := kv.Open(kvo)
	if err != nil {
		return fmt.Errorf("open KV cache: %w", err)
	}
	onClose("KV cache", kvc.Close)
	log.Info("opened KV cache", "ms", time.Since(t).Milliseconds(), "dir", filepath.Join(dataDir, "kv"), "quarantined", len(kvc.Store().Quarantined()))

	respSrv, err := openRESP(c, dataDir, focusDev, rstore, reg, log, onClose)
	if err != nil {
		return err
	}

	ec := engine.Config{BaseURL: c.upstream, Cache: kvc, Logger: log, SlotDir: c.slotDir, Slots: c.slots, Preload: c.preload}
	if fl != nil {
		ec.Shared = fl.States()
	}
	conn, err := connectors.All.Open(c.engine, ec) // nil for --engine none
	if err != nil {
		return err
	}
	hooks := engine.Wrap(conn)
	if hooks != nil {
		onClose("engine connector", hooks.Close) // saves occupied slots before the KV cache closes
		log.Info("engine connector", "engine", hooks.Name())
	}

	// The sidecar's own model calls go through the engine connector when
	// they go to the upstream it manages, so that they never cost a session
	// its slot.
	memUp := c.memoryUpstream
	var router llm.Router
	apiRoot := func(u string) string { return strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/v1") }
	if memUp == "" || apiRoot(memUp) == apiRoot(c.upstream) {
		memUp = c.upstream
		if hooks != nil {
			router = hooks
		}
	}
	// Through a connector the calls are streamed, so that one a client
	// request takes the slot from stops at its next token.
	bg, err := llm.New(llm.Options{BaseURL: memUp, APIKey: c.summaryKey, Model: c.memoryModel, Logger: log, Router: router, Stream: router != nil})
	if err != nil {
		return err
	}
	onClose("memory model client", bg.Close)
	strategy, err := memory.ParseStrategy(c.overflow)
	if err != nil {
		return err
	}
	fsyncPolicy, err := memory.ParseFsyncPolicy(c.fsync)
	if err != nil {
		return err
	}
	modelLimits, err := parseModelLimits(c.modelWindows)
	if err != nil {
		return err
	}
	var extractor memory.Extractor
	if c.extract {
		extractor = bg
	}
	var tenantScope bool
	switch c.userScope {
	case "session", "":
	case "tenant":
		tenantScope = true
		log.Warn("--user-scope tenant: the sessions of each API key that name no end user share one memory; every client holding the key recalls the others' words")
	default:
		return fmt.Errorf("--user-scope %q: want session or tenant", c.userScope)
	}
	share := c.recallShare
	if share == 0 {
		share = -1 // off
	}
	idx := index.Options{GraphWeight: c.graphWeight, QueryTimeout: c.embedQueryTO}
	emb, err := openEmbedder(ctx, &c, log)
	if err != nil {
		return err
	}
	if emb != nil {
		idx.Embedder = emb
		onClose("embedder", emb.Close)
	}
	t = time.Now()
	var sharedLog memory.SharedLog
	if fl != nil {
		sharedLog = fl.Log()
	}
	if c.memoryBudget == 0 {
		return errors.New("--memory-budget 0: give a size, or a negative one for no bound")
	}
	// Memory evicts in small, ordered steps when the engine moves the KV a
	// prompt keeps (the llama.cpp connector learns it from the answers).
	var shifts func(model string) bool
	switch c.engineShifts {
	case "auto", "":
		if sk, ok := conn.(interface{ ShiftsKV(model string) bool }); ok {
			shifts = sk.ShiftsKV
		}
	case "yes":
		shifts = func(string) bool { return true }
	case "no":
	default:
		return fmt.Errorf("--engine-shifts %q: want auto, yes or no", c.engineShifts)
	}
	mem, err := memory.Open(memory.Options{
		Dir: filepath.Join(dataDir, "sessions"), Fsync: fsyncPolicy, SharedLog: sharedLog, MemoryBudget: int64(c.memoryBudget),
		Window: memory.WindowOptions{Limit: c.windowTokens, ModelLimits: modelLimits, Strategy: strategy, EvictTo: c.evictTo,
			EngineShifts: shifts, ShiftEvictTo: c.shiftEvictTo},
		Recall: memory.RecallOptions{Index: idx, Share: share, StatementShare: c.statementShare, K: c.recallK, MinCoverage: c.recallCoverage,
			TenantUserScope: tenantScope},
		Extraction:  memory.ExtractionOptions{Summarizer: bg, Extractor: extractor, Every: demo.extractEvery},
		Reviewer:    memory.ReviewerOptions{Enabled: c.review},
		ToolContext: memory.ToolContextOptions{Enabled: c.toolContext},
		L4:          memory.L4Options{Enabled: c.l4, Threshold: c.l4Threshold, Similarity: c.l4Similarity, Fidelity: c.l4Fidelity},
		Pool:        memory.PoolOptions{ContextTokens: c.poolContext, MaxSubscribers: c.poolStreams, MaxTenantSubscribers: min(32, max(c.poolStreams, 0))},
		Storage:     memory.StorageOptions{SessionTTL: c.sessionTTL, MaxDiskBytes: c.maxDiskBytes, Shared: kvc.Store()},
		Logger:      log,
	})
	if err != nil {
		return fmt.Errorf("open session memory: %w", err)
	}
	onClose("session memory", func() error {
		// Within what the shutdown grace leaves.
		ctx := context.Background()
		if !shutdownDeadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, shutdownDeadline)
			defer cancel()
		}
		return mem.Shutdown(ctx)
	})
	log.Info("opened session memory", "ms", time.Since(t).Milliseconds(), "window_tokens", c.windowTokens, "overflow", strategy.String(),
		"session_ttl", c.sessionTTL.String(), "max_disk_bytes", c.maxDiskBytes, "max_open_logs", mem.Stats().MaxOpenFiles, "memory_budget", int64(c.memoryBudget))

	var pf proxy.Fleet
	if fl != nil {
		pf = fl
	}
	var mcpSrv proxy.MCP
	if c.mcp {
		ms, err := mcpserver.New(mcpserver.Options{Memory: mem, Version: versionString(), Logger: log})
		if err != nil {
			return err
		}
		mcpSrv = ms
	}
	var windows *admin.Windows // the console's last windows, which the proxy fills
	var pw proxy.Windows       // a nil *admin.Windows would be a non-nil interface
	if c.adminToken != "" {
		windows = admin.NewWindows(admin.ConsoleWindows)
		pw = windows
	}
	srv, err := proxy.New(proxy.Options{
		MCP:               mcpSrv,
		Fleet:             pf,
		Memory:            mem,
		KV:                kvc,
		MaxKVBytes:        c.maxKV,
		MaxSnapshotBytes:  int(c.maxSnapshot),
		Engine:            conn,
		Upstream:          c.upstream,
		MaxBodyBytes:      c.maxBody,
		MaxResponseBytes:  c.maxResponse,
		UpstreamTimeout:   c.upstreamTimeout,
		StreamIdleTimeout: c.idleTO,
		ReadTimeout:       c.readTO,
		WriteTimeout:      c.writeTO,
		IdleTimeout:       c.connIdle,
		AllowAnonymous:    c.allowAnonymous,
		NoContextProbe:    !c.contextProbe,
		Windows:           pw,
		Logger:            log,
		Metrics:           reg,

		UpstreamIdleTimeout: c.upstreamIdle,
		MaxIdleConnsPerHost: c.upstreamMaxIdle,
		EventLoop:           c.eventLoop,
	})
	if err != nil {
		return err
	}
	ao := admin.Options{Token: c.adminToken, Pprof: c.adminPprof, SampleEvery: c.consoleEvery, MaxBodyBytes: c.maxBody,
		ReadTimeout: c.readTO, WriteTimeout: c.writeTO, IdleTimeout: c.connIdle, Logger: log,
		Front: srv, Health: srv, Metrics: srv.Metrics(), Sessions: srv, Windows: windows,
		Memory: mem, Knowledge: mem, KV: kvc}
	if hooks != nil { // a nil *engine.Hooks or *respstore.Server would be a non-nil interface
		ao.Engine = hooks
	}
	if respSrv != nil {
		ao.RESP = respSrv
	}
	adm, err := admin.New(ao)
	if err != nil {
		return err
	}
	if emb != nil {
		exportEmbedderMetrics(reg, emb)
	}
	if ln == nil {
		if ln, err = net.Listen("tcp", c.listen); err != nil {
			return fmt.Errorf("listen %s: %w", c.listen, err)
		}
	}
	for _, w := range exposureWarnings(ln.Addr(), c.allowAnonymous) {
		log.Warn(w, "listen", ln.Addr().String())
	}
	var aln net.Listener
	if addr := adminAddress(c.adminListen, c.listen); addr != "" {
		if aln, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("--admin-listen %s: %w (give another address, or --admin-listen off)", addr, err)
		}
		log.Info("admin listening", "addr", aln.Addr().String(), "metrics", "http://"+aln.Addr().String()+"/metrics")
		if !isLoopback(aln.Addr()) {
			log.Warn("the admin listener is not on loopback: the sidecar's metrics (and, with --admin-token, the console) are reachable from the network", "addr", aln.Addr().String())
		}
	} else if c.adminToken != "" {
		log.Warn("--admin-token is set but the admin listener is off (--admin-listen off): the console is unreachable")
	}
	if c.adminToken != "" && aln != nil {
		log.Info("console on", "url", consoleURL(aln.Addr().String()))
		if !isLoopback(aln.Addr()) {
			log.Warn("THE CONSOLE IS ON A NON-LOOPBACK ADDRESS over plain HTTP: the admin token, which reads and edits every tenant's memories, crosses the network in clear; put a TLS proxy in front or listen on 127.0.0.1", "listen", aln.Addr().String())
		}
	}
	log.Info("sidecar listening", "version", versionString(), "listen", ln.Addr().String(),
		"upstream", c.upstream, "data_dir", dataDir, "start_ms", time.Since(t0).Milliseconds())
	if demo.embedded {
		hints := c.hints
		if hints == nil {
			hints = os.Stderr
		}
		consoleAddr := ""
		if aln != nil {
			consoleAddr = aln.Addr().String()
		}
		writeDemoHints(hints, ln.Addr().String(), consoleAddr, c.adminToken)
	} else if err := dialUpstream(c.upstream, upstreamDialTimeout); err != nil {
		log.Warn(unreachableWarning(c.upstream, err))
	}
	if ready != nil {
		ready <- ln.Addr().String()
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	adminErr := make(chan error, 1)
	if aln != nil {
		go func() { adminErr <- adm.Serve(aln) }()
	} else {
		adminErr <- nil
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	log.Info("shutting down", "grace", c.shutdownTimeout.String())
	t = time.Now()
	// The grace covers the whole shutdown: the proxy's in-flight requests
	// get it less a reserve for closing session memory after them.
	deadline := t.Add(c.shutdownTimeout)
	reserve := min(5*time.Second, c.shutdownTimeout/4)
	sctx, cancel := context.WithDeadline(context.Background(), deadline.Add(-reserve))
	defer cancel()
	shutdownDeadline = deadline
	err = srv.Shutdown(sctx)
	err = errors.Join(err, adm.Shutdown(sctx)) // the admin listener stops with the proxy
	log.Info("closed proxy", "ms", time.Since(t).Milliseconds(), "err", err)
	if serr := <-errc; serr != nil && err == nil {
		err = serr
	}
	if aerr := <-adminErr; aerr != nil && err == nil {
		err = aerr
	}
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("shutdown grace ran out; remaining connections were closed")
		err = nil
	}
	return err
}

// adminAddress is where the admin listener listens: flag as given ("off":
// nowhere), else 127.0.0.1 at the main listener's port + 1000, or port 0
// when the main port is 0 or too high.
func adminAddress(flag, listen string) string {
	switch flag {
	case "off", "none", "false":
		return ""
	case "":
	default:
		return flag
	}
	port := 0
	if _, p, err := net.SplitHostPort(listen); err == nil {
		if n, err := strconv.Atoi(p); err == nil && n > 0 && n+1000 <= 65535 {
			port = n + 1000
		}
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// listenLoopback listens on addr only if it is a loopback address
// (127.0.0.0/8, ::1, or a name such as localhost that resolves to one); an
// empty host means every interface and is refused.
func listenLoopback(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if host == "" {
		return nil, fmt.Errorf("%q binds every interface; give a loopback address such as 127.0.0.1:6060", addr)
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() {
		return nil, fmt.Errorf("%q is not a loopback address; give one such as 127.0.0.1:6060", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if !isLoopback(ln.Addr()) {
		ln.Close()
		return nil, fmt.Errorf("%q resolved to %s, not a loopback address", addr, ln.Addr())
	}
	return ln, nil
}

// exposureWarnings returns what serve warns about when it listens on addr:
// the sidecar has no authentication of its own, so whoever reaches a
// non-loopback address uses the upstream and the state APIs under their
// own key, and with allowAnonymous without one.
func exposureWarnings(addr net.Addr, allowAnonymous bool) []string {
	if isLoopback(addr) {
		return nil
	}
	w := []string{"LISTENING ON A NON-LOOPBACK ADDRESS: the sidecar has no authentication of its own; anyone who can reach " +
		addr.String() + " can send requests upstream and use the session, pool and KV APIs under their own API key. " +
		"Put it behind a firewall or an authenticating proxy, or listen on 127.0.0.1."}
	if allowAnonymous {
		w = append(w, "--allow-anonymous ON A NON-LOOPBACK ADDRESS: every client on the network without an API key shares one tenant's sessions, pool and KV")
	}
	return w
}

// isLoopback reports whether a listener's address is a loopback one.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// parseModelLimits parses "name=tokens,prefix*=tokens".
func parseModelLimits(v string) (map[string]int, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	m := map[string]int{}
	for _, part := range strings.Split(v, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		tokens, err := strconv.Atoi(strings.TrimSpace(n))
		if !ok || strings.TrimSpace(name) == "" || err != nil || tokens <= 0 {
			return nil, fmt.Errorf("--model-window-tokens: want name=tokens[,…], got %q", part)
		}
		m[strings.TrimSpace(name)] = tokens
	}
	return m, nil
}

// defaultOwner is the lease owner of a replica listening on listen: the
// address itself, unless its host is loopback or unspecified (the same on
// every machine); then the host name with the port.
func defaultOwner(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || host == "localhost" || ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) {
		if h, err := os.Hostname(); err == nil && h != "" {
			return net.JoinHostPort(h, port)
		}
	}
	return listen
}
