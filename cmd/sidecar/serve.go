package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kvsidecar/kvsidecar/admin"
	"github.com/kvsidecar/kvsidecar/proxy"
)

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
//
// The order of start (each step's function says what it opens and
// registers its closing on cl): the demo upstream, the data folder,
// pprof, the device, the fleet's remote store (listening first), the KV
// cache and its tiers, the RESP store, the engine connector, session
// memory (its model client, the embedder), MCP, the proxy, the admin
// listener, the listeners; then serving (serveUntil). The stop is the
// reverse: the proxy and the admin listener first, within the grace, then
// cl's steps, the demo upstream last.
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
	cl := &closers{log: log}
	defer cl.closeAll()

	if err := openPprof(c.pprof, cl, log); err != nil {
		return err
	}
	focusDev, err := openGPU(c.device, cl, log)
	if err != nil {
		return err
	}
	fp, err := openFleet(c, cl, log)
	if err != nil {
		return err
	}
	defer func() {
		if fp.ln != nil {
			fp.ln.Close() // closed by Serve once serving; here on errors before
		}
	}()
	kvc, reg, err := openKV(c, dataDir, focusDev, cl, log)
	if err != nil {
		return err
	}
	respSrv, err := openRESP(c, dataDir, focusDev, fp.store, reg, log, cl.add)
	if err != nil {
		return err
	}
	eng, err := openEngine(c, kvc, fp.fleet, cl, log)
	if err != nil {
		return err
	}
	mem, emb, err := openMemory(ctx, c, dataDir, demo, eng, kvc.Store(), fp.fleet, cl, log)
	if err != nil {
		return err
	}
	mcpSrv, err := openMCP(c, mem, log)
	if err != nil {
		return err
	}
	srv, windows, err := openProxy(c, mem, kvc, eng.conn, mcpSrv, fp.fleet, reg, log)
	if err != nil {
		return err
	}
	adm, err := openAdmin(c, srv, windows, mem, kvc, eng.hooks, respSrv, log)
	if err != nil {
		return err
	}
	if emb != nil {
		exportEmbedderMetrics(reg, emb)
	}
	ln, aln, err := listen(c, fp.ln, log)
	if err != nil {
		return err
	}
	fp.ln = ln
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
	return serveUntil(ctx, c.shutdownTimeout, srv, adm, ln, aln, cl, log)
}

// serveUntil serves the proxy on ln and the admin listener on aln (none
// when nil) until ctx ends or the proxy fails, then shuts both down within
// the grace, less a reserve that cl's closing of session memory gets
// after them (cl.deadline).
func serveUntil(ctx context.Context, grace time.Duration, srv *proxy.Server, adm *admin.Server, ln, aln net.Listener, cl *closers, log *slog.Logger) error {
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

	log.Info("shutting down", "grace", grace.String())
	t := time.Now()
	// The grace covers the whole shutdown: the proxy's in-flight requests
	// get it less a reserve for closing session memory after them.
	deadline := t.Add(grace)
	reserve := min(5*time.Second, grace/4)
	sctx, cancel := context.WithDeadline(context.Background(), deadline.Add(-reserve))
	defer cancel()
	cl.deadline = deadline
	err := srv.Shutdown(sctx)
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

// closers are the close steps of what serve opened, run in reverse order
// by closeAll, each logged as "closed <name>" with how long it took.
type closers struct {
	log   *slog.Logger
	names []string
	fns   []func() error
	// deadline is when the shutdown's grace ends; zero until a shutdown
	// starts. Session memory's close works within it.
	deadline time.Time
}

// add registers the close step of something just opened.
func (c *closers) add(name string, f func() error) {
	c.names, c.fns = append(c.names, name), append(c.fns, f)
}

func (c *closers) closeAll() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		t := time.Now()
		err := c.fns[i]()
		c.log.Info("closed "+c.names[i], "ms", time.Since(t).Milliseconds(), "err", err)
	}
}
