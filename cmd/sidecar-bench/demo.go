package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

func benchDemoLlama(args []string) error {
	fs := flag.NewFlagSet("bench demo-llama", flag.ContinueOnError)
	var o workload.DemoOptions
	fs.StringVar(&o.LlamaServer, "llama-server", "", "llama-server binary (default $LLAMA_SERVER, else ../shared/llama/bin/llama-server found upwards, else llama-server on PATH)")
	fs.StringVar(&o.Model, "model", "", "GGUF model (default: the tiny random model of ../shared/llama/tiny_gguf.py)")
	fs.StringVar(&o.Dir, "dir", "", "keep the servers' logs, slots and data here (default: a temporary folder, removed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.LlamaServer == "" {
		if _, err := llamaserver.FindServer(); err != nil {
			p, perr := exec.LookPath("llama-server")
			if perr != nil {
				return fmt.Errorf("no llama-server: %w, and none on PATH", err)
			}
			o.LlamaServer = p
		}
	}
	cmd, err := sidecarCommand()
	if err != nil {
		return err
	}
	o.SidecarCommand, o.Out = cmd, os.Stdout
	ctx, stop := interruptible()
	defer stop()
	return workload.RunLlamaDemo(ctx, o)
}
