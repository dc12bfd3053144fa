package main

import (
	"flag"

	"github.com/kvsidecar/kvsidecar/bench/workload"
)

func benchFleet(args []string) error {
	fs := flag.NewFlagSet("bench fleet", flag.ContinueOnError)
	var o workload.FleetOptions
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.BoolVar(&o.Verbose, "v", false, "one progress line per turn")
	fs.IntVar(&o.Replicas, "replicas", 2, "replicas per fleet, each a sidecar before its own llama-server")
	fs.IntVar(&o.Sessions, "sessions", 4, "conversations, each with its own document")
	fs.IntVar(&o.Rounds, "rounds", 6, "turns per session; round r of session i goes to replica (i+r) mod replicas")
	fs.IntVar(&o.Threads, "threads", 1, "each llama-server's -t")
	fs.IntVar(&o.KillAfter, "kill-after", 0, "kill -9 replica 1 (sidecar and llama-server) after this round in both fleets, right after its last answer (0: never)")
	fs.IntVar(&o.RedisRestartAfter, "redis-restart-after", 0, "kill -9 redis-server after this round and restart it on its AOF (0: never)")
	fs.StringVar(&o.AppendFsync, "appendfsync", "always", "redis-server's AOF fsync policy: always or everysec")
	fs.StringVar(&o.RedisServer, "redis-server", "", "redis-server binary (default $REDIS_SERVER, else redis-server or valkey-server on PATH)")
	if err := newRealFlags(fs, &o.RealParts, "every llama-server").parse(fs, args); err != nil {
		return err
	}
	ctx, stop := interruptible()
	defer stop()
	r, err := workload.RunFleet(ctx, o)
	if err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteFleetTable)
}
