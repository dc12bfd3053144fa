package main

import (
	"flag"
	"os"

	"github.com/kvsidecar/kvsidecar/internal/bench"
)

func benchFleet(args []string) error {
	fs := flag.NewFlagSet("bench fleet", flag.ContinueOnError)
	var o bench.FleetOptions
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.BoolVar(&o.Verbose, "v", false, "one progress line per turn")
	fs.IntVar(&o.Replicas, "replicas", 2, "replicas per fleet, each a sidecar before its own llama-server")
	fs.IntVar(&o.Sessions, "sessions", 4, "conversations, each with its own document")
	fs.IntVar(&o.Rounds, "rounds", 6, "turns per session; round r of session i goes to replica (i+r) mod replicas")
	fs.IntVar(&o.Slots, "slots", 2, "each llama-server's -np")
	fs.IntVar(&o.DocTokens, "doc-tokens", 1500, "tokens of each session's document (its system message)")
	fs.IntVar(&o.CacheRAMMiB, "cache-ram", 8, "each llama-server's --cache-ram in MiB (-1: off)")
	fs.IntVar(&o.MaxTokens, "max-tokens", 8, "max_tokens of each reply")
	fs.IntVar(&o.Threads, "threads", 1, "each llama-server's -t")
	fs.IntVar(&o.KillAfter, "kill-after", 0, "kill -9 replica 1 (sidecar and llama-server) after this round in both fleets (0: never)")
	fs.IntVar(&o.RedisRestartAfter, "redis-restart-after", 0, "kill -9 redis-server after this round and restart it on its AOF (0: never)")
	fs.StringVar(&o.AppendFsync, "appendfsync", "always", "redis-server's AOF fsync policy: always or everysec")
	fs.StringVar(&o.RedisServer, "redis-server", "", "redis-server binary (default $REDIS_SERVER, else redis-server or valkey-server on PATH)")
	var rf realFlags
	rf.register(fs, "every llama-server")
	if err := rf.parse(fs, args); err != nil {
		return err
	}
	o.LlamaServer, o.Model, o.Dir = rf.LlamaServer, rf.Model, rf.Dir
	o.SidecarCommand, o.SidecarArgs, o.LlamaArgs = rf.SidecarCommand, rf.SidecarArgs, rf.LlamaArgs
	o.Progress = os.Stderr
	ctx, stop := interruptible()
	defer stop()
	r, err := bench.RunFleet(ctx, o)
	if err != nil {
		return err
	}
	return emit(*asJSON, r, bench.WriteFleetTable)
}
