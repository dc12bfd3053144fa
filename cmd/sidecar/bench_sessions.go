package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvsidecar/kvsidecar/internal/bench"
)

// stringsFlag collects a repeated string flag.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, " ") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

func benchSessions(args []string) error {
	fs := flag.NewFlagSet("bench sessions", flag.ContinueOnError)
	var o bench.SessionsOptions
	asJSON := fs.Bool("json", false, "print one JSON object")
	plot := fs.String("plot", "", "also write an SVG bar chart of tokens reprocessed per round to this file")
	fs.IntVar(&o.Sessions, "sessions", 8, "conversations, each with its own document")
	fs.IntVar(&o.Rounds, "rounds", 4, "turns per session, round-robin")
	fs.IntVar(&o.Slots, "slots", 2, "each llama-server's -np (and the sidecar's --llamacpp-slots)")
	fs.IntVar(&o.DocTokens, "doc-tokens", 1500, "tokens of each session's document (its system message)")
	fs.IntVar(&o.CacheRAMMiB, "cache-ram", 8, "each llama-server's --cache-ram in MiB (its own RAM prompt cache; -1: off)")
	fs.IntVar(&o.MaxTokens, "max-tokens", 8, "max_tokens of each reply")
	fs.BoolVar(&o.SharedUser, "shared-user", false, "send every session as one end user (no OpenAI user field): sessions then recall one another's turns")
	fs.IntVar(&o.Threads, "threads", 0, "each llama-server's -t (default: half the CPUs, as the two run side by side)")
	fs.IntVar(&o.EngineRestartAfter, "engine-restart-after", 0, "kill -9 and restart both llama-servers after this round (0: never)")
	fs.IntVar(&o.SidecarRestartAfter, "sidecar-restart-after", 0, "kill -9 and restart the sidecar after this round, once its background queue drained (0: never)")
	fs.StringVar(&o.LlamaServer, "llama-server", "", "llama-server binary (default $LLAMA_SERVER, else ../shared/llama/bin/llama-server found upwards)")
	fs.StringVar(&o.Model, "model", "", "GGUF model for both servers (default: a tiny random model from ../shared/llama/tiny_gguf.py)")
	llamaArgs := fs.String("llama-args", "--n-predict 128", "extra arguments for both llama-servers, space-separated")
	var sidecarArgs stringsFlag
	fs.Var(&sidecarArgs, "sidecar-arg", "extra flag for the sidecar under test, repeated (e.g. --sidecar-arg=--extract=false)")
	fs.StringVar(&o.Dir, "dir", "", "folder for the servers' slots and logs and the sidecar's data (default: a temporary folder, removed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the sidecar binary to start: %w", err)
	}
	o.SidecarCommand = []string{exe, "serve"}
	o.SidecarArgs = sidecarArgs
	o.LlamaArgs = strings.Fields(*llamaArgs)
	if o.LlamaArgs == nil {
		o.LlamaArgs = []string{}
	}
	o.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := bench.RunSessions(ctx, o)
	if err != nil {
		return err
	}
	if *plot != "" {
		f, err := os.Create(*plot)
		if err != nil {
			return err
		}
		if err := bench.WriteSessionsSVG(f, r); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return emit(*asJSON, r, bench.WriteSessionsTable)
}
