package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/remote"
	"github.com/kvsidecar/kvsidecar/respstore"
)

// resp holds the flags of the RESP listener (package respstore).
type resp struct {
	listen     string
	ramBytes   byteSize
	diskBytes  byteSize
	fsync      string
	unsynced   byteSize
	maxValue   byteSize
	quota      byteSize
	saltQuota  byteSize
	usersFile  string
	maxConns   int
	focusBytes byteSize
}

func respFlags(fs *flag.FlagSet, r *resp) {
	fs.StringVar(&r.listen, "resp-listen", "", "serve a Redis-protocol (RESP) KV store on this address for LMCache's resp, redis:// and valkey:// clients (vLLM, SGLang), its values in the KV tiers under --data-dir/resp; e.g. 127.0.0.1:6380 (off when empty; a non-loopback address is warned about)")
	r.ramBytes = 1 << 30
	fs.Var(&r.ramBytes, "kv-ram-bytes", "host RAM for the values of --resp-listen (the Working tier); beyond it the least used go to disk only; bytes or with a unit, e.g. 8GiB")
	fs.Var(&r.diskBytes, "resp-disk-bytes", "disk for the values of --resp-listen (the Archive); beyond it the least recently used are deleted (0: 16GiB)")
	fs.StringVar(&r.fsync, "resp-fsync", "background", "when a SET's value reaches the disk: background (answered once in RAM, written to the file system right behind and fsynced every second: a kill -9 loses at most --resp-unsynced-bytes, a power loss also the last second) or always (answered once fsynced)")
	fs.Var(&r.unsynced, "resp-unsynced-bytes", "with --resp-fsync background: most bytes of answered SETs not yet written to the file system (SETs wait beyond it): what a kill -9 can lose, and the burst answered at RAM speed (0: 256MiB, at most half of --kv-ram-bytes)")
	r.maxValue = 512 << 20
	fs.Var(&r.maxValue, "resp-max-value-bytes", "largest value a SET may carry (a protocol error beyond, as Redis's proto-max-bulk-len)")
	fs.Var(&r.quota, "resp-quota", "bytes each RESP tenant's keys may hold; past it the tenant's own least recently used keys are evicted (0: none; --resp-users sets one per user)")
	fs.Var(&r.saltQuota, "resp-salt-quota", "bytes each (tenant, LMCache cache_salt) pair may hold; past it that salt's least recently used keys are evicted (0: none)")
	fs.StringVar(&r.usersFile, "resp-users", "", "file of RESP accounts, one a line: name password [quota]; only they may AUTH, each its own tenant (empty: any credentials name a tenant of their own, their hash, as API keys do on HTTP)")
	fs.IntVar(&r.maxConns, "resp-max-conns", 1024, "most open RESP connections")
	fs.Var(&r.focusBytes, "resp-focus-bytes", "with a CUDA device: GPU memory for the values of --resp-listen above the Working tier (0: 256MiB)")
}

// openRESP opens the RESP listener when --resp-listen is set and serves it
// until the sidecar closes; nil when it is off.
func openRESP(c serveConfig, dataDir string, dev gpu.Device, rs *remote.Store, reg *obs.Registry, log *slog.Logger, onClose func(string, func() error)) (*respstore.Server, error) {
	r := c.resp
	if r.listen == "" {
		return nil, nil
	}
	t := time.Now()
	var users []respstore.User
	if r.usersFile != "" {
		f, err := os.Open(r.usersFile)
		if err != nil {
			return nil, fmt.Errorf("--resp-users: %w", err)
		}
		users, err = respstore.ParseUsers(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("--resp-users: %w", err)
		}
		if users == nil {
			return nil, errors.New("--resp-users: the file lists no account")
		}
	}
	opts := respstore.Options{
		Dir: filepath.Join(dataDir, "resp"), RAMBytes: int64(r.ramBytes), DiskBytes: int64(r.diskBytes),
		Device: dev, FocusBytes: int64(r.focusBytes), Strategy: c.kvStrategy,
		Fsync: respstore.Fsync(r.fsync), MaxUnsyncedBytes: int64(r.unsynced), MaxValueBytes: int64(r.maxValue),
		MaxConns: r.maxConns, Users: users, AllowAnonymous: c.allowAnonymous,
		Quota: int64(r.quota), SaltQuota: int64(r.saltQuota),
		Metrics: reg, Logger: log, Version: versionString(),
	}
	if rs != nil {
		opts.Remote = rs
	}
	for _, v := range []byteSize{r.ramBytes, r.diskBytes, r.unsynced, r.maxValue, r.quota, r.saltQuota, r.focusBytes} {
		if v < 0 {
			return nil, errors.New("--kv-ram-bytes and the --resp-* sizes must not be negative")
		}
	}
	srv, err := respstore.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("--resp-listen: %w", err)
	}
	ln, err := net.Listen("tcp", r.listen)
	if err != nil {
		srv.Close()
		return nil, fmt.Errorf("--resp-listen %s: %w", r.listen, err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	onClose("RESP listener", func() error {
		err := srv.Close()
		if serr := <-served; serr != nil {
			err = errors.Join(err, serr)
		}
		return err
	})
	if !isLoopback(ln.Addr()) {
		log.Warn("THE RESP LISTENER IS ON A NON-LOOPBACK ADDRESS: plain TCP, passwords cross the network in clear"+
			map[bool]string{true: "", false: ", and without --resp-users any password opens a tenant of its own on this disk"}[users != nil],
			"resp_listen", ln.Addr().String())
		if c.allowAnonymous {
			log.Warn("--allow-anonymous ON A NON-LOOPBACK RESP ADDRESS: every client on the network that never AUTHs shares one tenant's keys", "resp_listen", ln.Addr().String())
		}
	}
	limit := respMemoryLimit(opts, c.engine == "llamacpp")
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(limit)
	}
	log.Info("RESP listening", "resp_listen", ln.Addr().String(), "ms", time.Since(t).Milliseconds(), "dir", opts.Dir,
		"loaded", srv.Loaded(), "ram_bytes", int64(r.ramBytes), "fsync", r.fsync, "users", len(users), "go_memory_limit", limit)
	return srv, nil
}

// respMemoryLimit is the Go runtime's soft memory limit with the RESP
// listener on: its values in RAM (--kv-ram-bytes) and an eighth more for
// values being received and decoded from disk, the engine states' KV
// cache when a llama.cpp connector fills it, and 320 MiB for the rest of
// the sidecar (the codec's pooled buffers, session memory). Without it the garbage of replaced and evicted values lets
// the heap grow to twice what is live before a collection; with it the
// collector keeps the process near its budget (docs/BENCHMARKS.md
// measures the peak RSS). GOMEMLIMIT in the environment wins.
func respMemoryLimit(o respstore.Options, engineStates bool) int64 {
	limit := o.RAMBytes + o.RAMBytes/8 + 320<<20
	if engineStates {
		limit += 1<<30 + 256<<20 // the states' cache: the tiers' Working and Focus defaults
	}
	return limit
}
