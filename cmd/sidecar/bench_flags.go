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
)

// stringsFlag collects a repeated string flag.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, " ") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

// realFlags are the flags of the benchmarks that start real llama-servers
// and sidecars (bench sessions, bench fleet).
type realFlags struct {
	LlamaServer, Model, Dir string
	llamaArgs               string
	sidecarArgs             stringsFlag
	// After parse: the sidecar to start (this binary's serve), the extra
	// flags for each sidecar and for each llama-server.
	SidecarCommand, SidecarArgs, LlamaArgs []string
}

// register adds the flags to fs; servers names the llama-servers in the
// help ("both llama-servers", "every llama-server").
func (r *realFlags) register(fs *flag.FlagSet, servers string) {
	fs.StringVar(&r.LlamaServer, "llama-server", "", "llama-server binary (default $LLAMA_SERVER, else ../shared/llama/bin/llama-server found upwards)")
	fs.StringVar(&r.Model, "model", "", "GGUF model for "+servers+" (default: a tiny random model from ../shared/llama/tiny_gguf.py)")
	fs.StringVar(&r.llamaArgs, "llama-args", "--n-predict 128", "extra arguments for "+servers+", space-separated")
	fs.Var(&r.sidecarArgs, "sidecar-arg", "extra flag for each sidecar, repeated (e.g. --sidecar-arg=--extract=false)")
	fs.StringVar(&r.Dir, "dir", "", "folder for the servers' slots, data and logs (default: a temporary folder, removed)")
}

// parse parses args into fs, refuses positional arguments and fills in
// the sidecar command and the extra arguments.
func (r *realFlags) parse(fs *flag.FlagSet, args []string) error {
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
	r.SidecarCommand = []string{exe, "serve"}
	r.SidecarArgs = r.sidecarArgs
	r.LlamaArgs = strings.Fields(r.llamaArgs)
	if r.LlamaArgs == nil {
		r.LlamaArgs = []string{}
	}
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
