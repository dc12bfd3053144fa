package main

// The subsystems serve opens before the HTTP surface, in its order: each
// function opens one, registers its close step(s) on cl and returns what
// it opened.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/cmd/sidecar/internal/fleet"
	"github.com/kvsidecar/kvsidecar/cmd/sidecar/internal/llm"
	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/engine/connectors"
	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/remote"
	"github.com/kvsidecar/kvsidecar/tiers"
	"github.com/kvsidecar/kvsidecar/tiers/tracefile"
)

// openPprof serves Go's /debug/pprof on a loopback listener of its own
// (--pprof); nothing when addr is "".
func openPprof(addr string, cl *closers, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	ln, err := listenLoopback(addr)
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
	cl.add("pprof", func() error {
		err := ps.Close()
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	})
	log.Info("pprof listening", "addr", ln.Addr().String())
	return nil
}

// openGPU opens the device (--device) and returns the one the KV tiers'
// Focus tier uses: the device on CUDA, nil on the CPU (the store sizes its
// own host device to the Focus budget).
func openGPU(kind string, cl *closers, log *slog.Logger) (focus gpu.Device, err error) {
	t := time.Now()
	dev, err := openDevice(kind, log)
	if err != nil {
		return nil, fmt.Errorf("open device: %w", err)
	}
	cl.add("device "+dev.Name(), dev.Close)
	if dev.Kind() == gpu.KindCUDA {
		focus = dev
		procsFloor.Store(gpu.CopyWays)
	}
	log.Info("opened device", "ms", time.Since(t).Milliseconds(), "device", dev.Name(), "kind", dev.Kind().String())
	return focus, nil
}

// fleetParts is what --remote opens: the main listener (bound first, as
// the lease owner's default is its address), the remote store and the
// fleet over it. All nil without --remote.
type fleetParts struct {
	ln    net.Listener
	store *remote.Store
	fleet *fleet.Fleet
}

// openFleet opens the fleet's shared store (--remote); nothing without it.
func openFleet(c serveConfig, cl *closers, log *slog.Logger) (fleetParts, error) {
	var p fleetParts
	if c.remote == "" {
		return p, nil
	}
	// Listen first: the lease owner's default is the bound address
	// (with --listen HOST:0, the port is known only now).
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return p, fmt.Errorf("listen %s: %w", c.listen, err)
	}
	p.ln = ln // serve closes it on errors from here
	t := time.Now()
	owner := c.remoteOwner
	if owner == "" {
		owner = defaultOwner(ln.Addr().String())
	}
	remote.SetClientLogger(log)
	rs, err := remote.Open(context.Background(), remote.Options{URL: c.remote, Prefix: c.remotePrefix, TTL: c.sessionTTL,
		ChunkBytes: c.remoteChunk, Owner: owner, LeaseTTL: c.remoteLeaseTTL, Logger: log})
	if err != nil {
		return p, fmt.Errorf("--remote: %w", err)
	}
	cl.add("remote store", rs.Close) // last: memory and the engine write through it until they close
	p.store = rs
	if p.fleet, err = fleet.New(fleet.Options{Store: rs, Logger: log}); err != nil {
		return p, err
	}
	log.Info("opened remote store", "ms", time.Since(t).Milliseconds(), "prefix", c.remotePrefix, "owner", owner,
		"durability", rs.Durability(), "lease_ttl", c.remoteLeaseTTL.String(), "ttl", c.sessionTTL.String())
	return p, nil
}

// openKV opens the KV cache over its tiers (and --kv-trace's file) and the
// one metrics registry, which every later subsystem writes its families to.
func openKV(c serveConfig, dataDir string, focusDev gpu.Device, cl *closers, log *slog.Logger) (*kv.Cache, *obs.Registry, error) {
	t := time.Now()
	// Blobs of the KV API are bounded by --max-kv-bytes at the HTTP layer;
	// the cache also keeps engine slot states, which can be larger.
	if c.maxDiskBytes < 0 || c.sessionTTL < 0 {
		return nil, nil, errors.New("--max-disk-bytes and --session-ttl must not be negative")
	}
	// With a disk budget the archive alone never exceeds it; the session
	// store's retention sweep trims it further to leave sessions room.
	reg := obs.New() // the one metrics registry /metrics writes
	storeOpts := tiers.Options{Dir: filepath.Join(dataDir, "kv"), Strategy: c.kvStrategy, Device: focusDev,
		Archive: tiers.Budget{MaxBytes: c.maxDiskBytes}, Metrics: reg}
	if c.kvTrace != "" {
		trace, err := tracefile.Create(c.kvTrace)
		if err != nil {
			return nil, nil, fmt.Errorf("--kv-trace: %w", err)
		}
		cl.add("KV trace", trace.Close)
		storeOpts.Trace = trace.Record
		log.Info("recording KV accesses", "file", c.kvTrace)
	}
	kvo := kv.Options{Store: storeOpts, MaxBlobBytes: max(int64(c.maxKV), 1<<30)}
	if c.kvTune {
		kvo.Tuner = &tiers.TunerOptions{Every: c.kvTuneEvery, Logger: log}
	}
	kvc, err := kv.Open(kvo)
	if err != nil {
		return nil, nil, fmt.Errorf("open KV cache: %w", err)
	}
	cl.add("KV cache", kvc.Close)
	log.Info("opened KV cache", "ms", time.Since(t).Milliseconds(), "dir", filepath.Join(dataDir, "kv"), "quarantined", len(kvc.Store().Quarantined()))
	return kvc, reg, nil
}

// engineParts is the engine connector (--engine): conn as the registry
// opened it, hooks the proxy's and the console's handle on it. Both nil
// for --engine none.
type engineParts struct {
	conn  engine.Plugin
	hooks *engine.Hooks
}

// openEngine opens the engine connector over the KV cache (and the
// fleet's shared states).
func openEngine(c serveConfig, kvc *kv.Cache, fl *fleet.Fleet, cl *closers, log *slog.Logger) (engineParts, error) {
	ec := engine.Config{BaseURL: c.upstream, Cache: kvc, Logger: log, SlotDir: c.slotDir, Slots: c.slots, Preload: c.preload}
	if fl != nil {
		ec.Shared = fl.States()
	}
	conn, err := connectors.All.Open(c.engine, ec) // nil for --engine none
	if err != nil {
		return engineParts{}, err
	}
	hooks := engine.Wrap(conn)
	if hooks != nil {
		cl.add("engine connector", hooks.Close) // saves occupied slots before the KV cache closes
		log.Info("engine connector", "engine", hooks.Name())
	}
	return engineParts{conn: conn, hooks: hooks}, nil
}

// openMemory opens session memory: the client of its own model calls,
// the embedder of its index, then the store. emb is nil with the offline
// embedder.
func openMemory(ctx context.Context, c serveConfig, dataDir string, demo demoStart, eng engineParts, shared *tiers.Store,
	fl *fleet.Fleet, cl *closers, log *slog.Logger) (mem *memory.Store, emb *index.OpenAIEmbedder, err error) {
	// The sidecar's own model calls go through the engine connector when
	// they go to the upstream it manages, so that they never cost a session
	// its slot.
	memUp := c.memoryUpstream
	var router llm.Router
	apiRoot := func(u string) string { return strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/v1") }
	if memUp == "" || apiRoot(memUp) == apiRoot(c.upstream) {
		memUp = c.upstream
		if eng.hooks != nil {
			router = eng.hooks
		}
	}
	// Through a connector the calls are streamed, so that one a client
	// request takes the slot from stops at its next token.
	bg, err := llm.New(llm.Options{BaseURL: memUp, APIKey: c.summaryKey, Model: c.memoryModel, Logger: log, Router: router, Stream: router != nil})
	if err != nil {
		return nil, nil, err
	}
	cl.add("memory model client", bg.Close)
	strategy, err := memory.ParseStrategy(c.overflow)
	if err != nil {
		return nil, nil, err
	}
	fsyncPolicy, err := memory.ParseFsyncPolicy(c.fsync)
	if err != nil {
		return nil, nil, err
	}
	modelLimits, err := parseModelLimits(c.modelWindows)
	if err != nil {
		return nil, nil, err
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
		return nil, nil, fmt.Errorf("--user-scope %q: want session or tenant", c.userScope)
	}
	share := c.recallShare
	if share == 0 {
		share = -1 // off
	}
	idx := index.Options{GraphWeight: c.graphWeight, QueryTimeout: c.embedQueryTO}
	emb, err = openEmbedder(ctx, &c, log)
	if err != nil {
		return nil, nil, err
	}
	if emb != nil {
		idx.Embedder = emb
		cl.add("embedder", emb.Close)
	}
	t := time.Now()
	var sharedLog memory.SharedLog
	if fl != nil {
		sharedLog = fl.Log()
	}
	if c.memoryBudget == 0 {
		return nil, nil, errors.New("--memory-budget 0: give a size, or a negative one for no bound")
	}
	// Memory evicts in small, ordered steps when the engine moves the KV a
	// prompt keeps (the llama.cpp connector learns it from the answers).
	var shifts func(model string) bool
	switch c.engineShifts {
	case "auto", "":
		if sk, ok := eng.conn.(interface{ ShiftsKV(model string) bool }); ok {
			shifts = sk.ShiftsKV
		}
	case "yes":
		shifts = func(string) bool { return true }
	case "no":
	default:
		return nil, nil, fmt.Errorf("--engine-shifts %q: want auto, yes or no", c.engineShifts)
	}
	mem, err = memory.Open(memory.Options{
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
		Storage:     memory.StorageOptions{SessionTTL: c.sessionTTL, MaxDiskBytes: c.maxDiskBytes, Shared: shared},
		Logger:      log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("open session memory: %w", err)
	}
	cl.add("session memory", func() error {
		// Within what the shutdown grace leaves.
		ctx := context.Background()
		if !cl.deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, cl.deadline)
			defer cancel()
		}
		return mem.Shutdown(ctx)
	})
	log.Info("opened session memory", "ms", time.Since(t).Milliseconds(), "window_tokens", c.windowTokens, "overflow", strategy.String(),
		"session_ttl", c.sessionTTL.String(), "max_disk_bytes", c.maxDiskBytes, "max_open_logs", mem.Stats().MaxOpenFiles, "memory_budget", int64(c.memoryBudget))
	return mem, emb, nil
}
