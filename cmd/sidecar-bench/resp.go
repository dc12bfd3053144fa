package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/workload"
)

func benchRESP(args []string) error {
	fs := flag.NewFlagSet("bench resp", flag.ContinueOnError)
	var o workload.RESPOptions
	asJSON := fs.Bool("json", false, "print one JSON object")
	phases := fs.String("phases", "grid,ws,kill", "phases, comma-separated: grid (SET/GET GB/s and p50/p99 by value size and connections), ws (a working set 4x the RAM budget: hit ratio), kill (kill -9 mid-traffic: acknowledged values served again)")
	sizes := fs.String("sizes", "1,8,32", "value sizes of the grid, MiB")
	conns := fs.String("conns", "1,8,32", "connection counts of the grid")
	cell := fs.Int64("cell-mib", 256, "MiB one grid cell writes (at least one value per connection)")
	fs.IntVar(&o.Rounds, "rounds", 3, "times each grid cell runs, the servers taking turns (GB/s: the median)")
	gridRAM := fs.Int64("grid-ram-mib", 2048, "the sidecar's --kv-ram-bytes in the grid, MiB")
	fs.Int64Var(&o.WSRAM, "ws-ram-bytes", 1<<30, "RAM budget of the working-set phase: the sidecar's --kv-ram-bytes and redis-server's maxmemory (allkeys-lru)")
	fs.IntVar(&o.WSFactor, "ws-factor", 4, "the working set over the RAM budget")
	fs.DurationVar(&o.KillAfter, "kill-after", 3*time.Second, "how long the kill phase writes before SIGKILL")
	fs.StringVar(&o.RedisServer, "redis-server", "", "redis-server binary (default $REDIS_SERVER, else redis-server or valkey-server on PATH)")
	fs.StringVar(&o.Dir, "dir", "", "folder for the servers' files (default: a temporary folder, removed)")
	var sidecarArgs, extra stringsFlag
	fs.Var(&sidecarArgs, "sidecar-arg", "extra flag for each sidecar, repeated (e.g. --sidecar-arg=--resp-unsynced-bytes=1GiB)")
	fs.Var(&extra, "extra", "another RESP server for the grid, name=host:port (password bench), repeated: e.g. the redcon yardstick of bench/respparser")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	o.Phases = strings.Split(*phases, ",")
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("--sizes: %q", s)
		}
		o.Sizes = append(o.Sizes, n<<20)
	}
	for _, s := range strings.Split(*conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("--conns: %q", s)
		}
		o.Conns = append(o.Conns, n)
	}
	o.CellBytes, o.GridRAM = *cell<<20, *gridRAM<<20
	o.SidecarArgs = sidecarArgs
	for _, e := range extra {
		name, addr, ok := strings.Cut(e, "=")
		if !ok {
			return fmt.Errorf("--extra %q: want name=host:port", e)
		}
		if o.Extra == nil {
			o.Extra = map[string]string{}
		}
		o.Extra[name] = addr
	}
	cmd, err := sidecarCommand()
	if err != nil {
		return err
	}
	o.SidecarCommand = cmd
	o.Progress = os.Stderr
	ctx, stop := interruptible()
	defer stop()
	r, err := workload.RunRESP(ctx, o)
	if err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteRESPTables)
}
