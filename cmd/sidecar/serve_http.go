package main

// The sidecar's network surface, opened last by serve: MCP, the proxy,
// the admin listener, then the listeners themselves.

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/kvsidecar/kvsidecar/admin"
	"github.com/kvsidecar/kvsidecar/cmd/sidecar/internal/fleet"
	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/mcpserver"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/proxy"
	"github.com/kvsidecar/kvsidecar/respstore"
)

// openMCP builds the MCP endpoint over session memory (--mcp); nil
// without it. The proxy serves it and nothing closes it.
func openMCP(c serveConfig, mem *memory.Store, log *slog.Logger) (proxy.MCP, error) {
	if !c.mcp {
		return nil, nil
	}
	ms, err := mcpserver.New(mcpserver.Options{Memory: mem, Version: versionString(), Logger: log})
	if err != nil {
		return nil, err
	}
	return ms, nil
}

// openProxy builds the proxy over what serve opened. windows, the
// console's last windows that the proxy fills, is nil without
// --admin-token. The proxy stops in serveUntil.
func openProxy(c serveConfig, mem *memory.Store, kvc *kv.Cache, conn engine.Plugin, mcpSrv proxy.MCP, fl *fleet.Fleet,
	reg *obs.Registry, log *slog.Logger) (*proxy.Server, *admin.Windows, error) {
	var pf proxy.Fleet
	if fl != nil {
		pf = fl
	}
	var windows *admin.Windows
	var pw proxy.Windows // a nil *admin.Windows would be a non-nil interface
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
		return nil, nil, err
	}
	return srv, windows, nil
}

// openAdmin builds the admin listener's server (package admin) over the
// proxy and what the console shows. It stops with the proxy (serveUntil).
func openAdmin(c serveConfig, srv *proxy.Server, windows *admin.Windows, mem *memory.Store, kvc *kv.Cache, hooks *engine.Hooks,
	respSrv *respstore.Server, log *slog.Logger) (*admin.Server, error) {
	o := admin.Options{Token: c.adminToken, Pprof: c.adminPprof, SampleEvery: c.consoleEvery, MaxBodyBytes: c.maxBody,
		ReadTimeout: c.readTO, WriteTimeout: c.writeTO, IdleTimeout: c.connIdle, Logger: log,
		Front: srv, Health: srv, Metrics: srv.Metrics(), Sessions: srv, Windows: windows,
		Memory: mem, Knowledge: mem, KV: kvc}
	// A nil *engine.Hooks or *respstore.Server would be a non-nil interface.
	if hooks != nil {
		o.Engine = hooks
	}
	if respSrv != nil {
		o.RESP = respSrv
	}
	return admin.New(o)
}

// listen binds the main listener (unless --remote bound it first: ln) and
// the admin listener (nil with --admin-listen off), and logs where they
// are and what is exposed.
func listen(c serveConfig, ln net.Listener, log *slog.Logger) (main, adminLn net.Listener, err error) {
	if ln == nil {
		if ln, err = net.Listen("tcp", c.listen); err != nil {
			return nil, nil, fmt.Errorf("listen %s: %w", c.listen, err)
		}
	}
	for _, w := range exposureWarnings(ln.Addr(), c.allowAnonymous) {
		log.Warn(w, "listen", ln.Addr().String())
	}
	var aln net.Listener
	if addr := adminAddress(c.adminListen, c.listen); addr != "" {
		if aln, err = net.Listen("tcp", addr); err != nil {
			return ln, nil, fmt.Errorf("--admin-listen %s: %w (give another address, or --admin-listen off)", addr, err)
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
	return ln, aln, nil
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
