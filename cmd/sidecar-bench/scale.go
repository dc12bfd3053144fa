package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kvsidecar/kvsidecar/bench/workload"
)

func benchScale(args []string) error {
	fs := flag.NewFlagSet("bench scale", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sidecar bench scale [flags]\n\n"+
			"Starts `sidecar serve` (its defaults, --fsync always) before a scripted upstream and\n"+
			"creates sessions in batches with drop-in clients; per batch: new-session, hot and returning-session\n"+
			"turn latency, requests/s, the sidecar's RSS, open files, disk (and Redis memory with --remote).\n\n")
		fs.PrintDefaults()
	}
	var o workload.ScaleOptions
	asJSON := fs.Bool("json", false, "print one JSON object")
	batches := fs.String("batches", "", "sizes of the successive batches of new sessions, comma-separated (default 1000,3000,3000,3000; see --target)")
	target := fs.Int("target", 0, "instead of --batches: batches of --batch sessions up to this many sessions")
	batch := fs.Int("batch", 10000, "with --target: sessions per batch")
	fs.IntVar(&o.Turns, "turns", 3, "turns of each new session")
	fs.IntVar(&o.Clients, "clients", 8, "clients sending at once")
	fs.IntVar(&o.Returning, "returning", 200, "the oldest sessions that take one more turn after each batch (-1: none)")
	fs.BoolVar(&o.NoUser, "no-user", false, "send no X-User-ID (one API key, no user id: every session private); default: each session its own end user")
	fs.BoolVar(&o.Remote, "remote", false, "run a redis-server and give the sidecar --remote; report Redis memory per session")
	fs.StringVar(&o.RedisServer, "redis-server", "", "redis-server binary for --remote (default $REDIS_SERVER, else redis-server or valkey-server on PATH)")
	fs.StringVar(&o.ProfileDir, "profile", "", "save a CPU profile of each batch (its first --profile-seconds) and a heap profile after it in this folder (sidecar --pprof)")
	fs.IntVar(&o.ProfileSeconds, "profile-seconds", 10, "length of each CPU profile")
	fs.StringVar(&o.Dir, "dir", "", "folder for the sidecar's data and log (default: a temporary folder, removed)")
	var sidecarArgs stringsFlag
	fs.Var(&sidecarArgs, "sidecar-arg", "extra flag for the sidecar, repeated (e.g. --sidecar-arg=--memory-budget=64MiB)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	switch {
	case *target > 0:
		if *batch < 1 {
			return fmt.Errorf("--batch %d: want at least 1", *batch)
		}
		for left := *target; left > 0; left -= *batch {
			o.Batches = append(o.Batches, min(left, *batch))
		}
	case *batches != "":
		for _, f := range strings.Split(*batches, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				return fmt.Errorf("--batches %q: %w", *batches, err)
			}
			o.Batches = append(o.Batches, n)
		}
	}
	cmd, err := sidecarCommand()
	if err != nil {
		return err
	}
	o.SidecarCommand = cmd
	o.SidecarArgs = sidecarArgs
	o.Progress = os.Stderr
	ctx, stop := interruptible()
	defer stop()
	r, err := workload.RunScale(ctx, o)
	if err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteScaleTable)
}
