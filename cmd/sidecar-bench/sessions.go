package main

import (
	"flag"
	"io"

	"github.com/kvsidecar/kvsidecar/bench/workload"
)

func benchSessions(args []string) error {
	fs := flag.NewFlagSet("bench sessions", flag.ContinueOnError)
	var o workload.SessionsOptions
	asJSON := fs.Bool("json", false, "print one JSON object")
	plot := fs.String("plot", "", "also write an SVG bar chart of tokens reprocessed per round to this file")
	fs.IntVar(&o.Sessions, "sessions", 8, "conversations, each with its own document")
	fs.IntVar(&o.Rounds, "rounds", 4, "turns per session, round-robin")
	fs.IntVar(&o.Threads, "threads", 0, "each llama-server's -t (default: half the CPUs, as the two run side by side)")
	fs.IntVar(&o.EngineRestartAfter, "engine-restart-after", 0, "kill -9 and restart both llama-servers after this round, right after its last answer (0: never)")
	fs.IntVar(&o.SidecarRestartAfter, "sidecar-restart-after", 0, "kill -9 and restart the sidecar after this round, once its background queue drained (0: never)")
	fs.BoolVar(&o.FollowUp, "follow-up", false, "follow each turn at once with a second question (on each side): the resident turns that returning sessions' time to first token is measured against")
	fs.StringVar(&o.Order, "order", workload.OrderRoundRobin, "order of the sessions in a round: round-robin (the same each round) or shuffled (a new permutation each round: no arrival history predicts it)")
	fs.DurationVar(&o.Pause, "pause", 0, "wait this long before each question (both sides), as a person reads and types; 0: back to back")
	if err := newRealFlags(fs, &o.RealParts, "both llama-servers").parse(fs, args); err != nil {
		return err
	}
	ctx, stop := interruptible()
	defer stop()
	r, err := workload.RunSessions(ctx, o)
	if err != nil {
		return err
	}
	if err := writePlot(*plot, func(w io.Writer) error { return workload.WriteSessionsSVG(w, r) }); err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteSessionsTable)
}
