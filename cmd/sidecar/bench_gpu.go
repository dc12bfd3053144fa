package main

import (
	"encoding/json"
	"flag"
	"os"

	"github.com/kvsidecar/kvsidecar/gpu/probe"
	"github.com/kvsidecar/kvsidecar/internal/bench"
)

// benchGPU implements `sidecar bench gpu`: Focus put/get latency and
// bandwidth for 1, 16 and 256 MiB blocks on the device --device selects.
func benchGPU(args []string) error {
	fs := flag.NewFlagSet("bench gpu", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	full := fs.Bool("full", false, "more repetitions (tens of seconds on a GPU, minutes on the CPU device)")
	kind := fs.String("device", "auto", deviceFlagUsage)
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := probe.Run(probe.Options{Kind: *kind, Quick: !*full, Latency: bench.FocusLatency})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return probe.WriteTable(os.Stdout, r)
}
