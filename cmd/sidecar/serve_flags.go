package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/engine/connectors"
	"github.com/kvsidecar/kvsidecar/memory"
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
