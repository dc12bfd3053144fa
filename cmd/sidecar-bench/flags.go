package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// stringsFlag collects a repeated string flag.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, " ") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

// realFlags are the flags of the benchmarks that start real llama-servers
// and sidecars (bench sessions, bench fleet), parsed into the
// workload.RealParts their options embed. Sessions, rounds and threads, whose
// defaults differ, each benchmark registers itself.
type realFlags struct {
	p           *workload.RealParts
	llamaArgs   string
	sidecarArgs stringsFlag
}

// newRealFlags registers the shared flags on fs; servers names the
// llama-servers in the help ("both llama-servers", "every llama-server").
func newRealFlags(fs *flag.FlagSet, p *workload.RealParts, servers string) *realFlags {
	r := &realFlags{p: p}
	fs.IntVar(&p.Slots, "slots", 2, "each llama-server's -np (and its sidecar's --llamacpp-slots)")
	fs.IntVar(&p.DocTokens, "doc-tokens", 1500, "tokens of each session's document (its system message)")
	fs.IntVar(&p.CacheRAMMiB, "cache-ram", 8, "each llama-server's --cache-ram in MiB (its own RAM prompt cache; -1: off)")
	fs.IntVar(&p.MaxTokens, "max-tokens", 8, "max_tokens of each reply")
	fs.StringVar(&p.LlamaServer, "llama-server", "", "llama-server binary (default $LLAMA_SERVER, else ../shared/llama/bin/llama-server found upwards)")
	fs.StringVar(&p.Model, "model", "", "GGUF model for "+servers+" (default: a tiny random model from ../shared/llama/tiny_gguf.py)")
	fs.StringVar(&r.llamaArgs, "llama-args", "", "extra arguments for "+servers+", space-separated (default none: the server's own defaults, no --n-predict cap)")
	fs.BoolVar(&p.PerUser, "per-user", false, "name each session its own end user (OpenAI user field); default: one API key and no user id, as most apps call")
	fs.BoolVar(&p.SharedUser, "shared-user", false, "name every session the same end user: one person with several conversations, recalling across them")
	fs.BoolVar(&p.DrainBeforeKill, "drain-before-kill", false, "before each engine kill -9, wait until the sidecar's background queue drained (default: kill right after the round's last answer)")
	fs.Var(&r.sidecarArgs, "sidecar-arg", "extra flag for each sidecar, repeated (e.g. --sidecar-arg=--extract=false)")
	fs.StringVar(&p.Dir, "dir", "", "folder for the servers' slots, data and logs (default: a temporary folder, removed)")
	return r
}

// parse parses args into fs, refuses positional arguments and fills in
// the sidecar command (the sidecar binary's serve: sidecarBinary), the
// extra arguments and the progress output (stderr).
func (r *realFlags) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cmd, err := sidecarCommand()
	if err != nil {
		return err
	}
	r.p.SidecarCommand = cmd
	r.p.SidecarArgs = r.sidecarArgs
	r.p.LlamaArgs = strings.Fields(r.llamaArgs)
	if r.p.LlamaArgs == nil {
		r.p.LlamaArgs = []string{}
	}
	r.p.Progress = os.Stderr
	return nil
}

// interruptible is a context cancelled by SIGINT or SIGTERM, so a
// benchmark stops its servers before the process exits.
func interruptible() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// writePlot writes a plot to path with write; an empty path writes none.
func writePlot(path string, write func(io.Writer) error) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
