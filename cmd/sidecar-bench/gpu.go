package main

import (
	"flag"

	"github.com/kvsidecar/kvsidecar/bench/workload"
	"github.com/kvsidecar/kvsidecar/gpu/probe"
)

// deviceFlagUsage documents --device, as the sidecar's own flag does.
const deviceFlagUsage = "device for the Focus tier: cuda (fail without a GPU), cpu, or auto (a GPU if one opens, else cpu). " +
	"CUDA_VISIBLE_DEVICES chooses which GPUs are visible; the first visible one is used"

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
	r, err := probe.Run(probe.Options{Kind: *kind, Quick: !*full, Latency: workload.FocusLatency})
	if err != nil {
		return err
	}
	return emit(*asJSON, r, probe.WriteTable)
}
