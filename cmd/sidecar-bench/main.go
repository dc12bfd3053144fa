// Command sidecar-bench runs kvsidecar's benchmark workloads: everything
// `sidecar bench` does. It is a binary of its own so that the serving binary
// links none of their dependencies (gorgonia.org/tensor, gonum, arrow and
// protobuf come with the reference KV computer); `sidecar bench ARGS` runs
// the sidecar-bench next to it (else on PATH) with the same ARGS, so the
// documented command keeps working, and `make build` builds both into bin/.
//
//	sidecar-bench [workload] [flags]     (the same as sidecar bench [workload] [flags])
//
// The workloads that start sidecars (memory without --sidecar, sessions,
// fleet, scale) start the sidecar binary as a child process: the one in
// $SIDECAR_BINARY (sidecar bench sets it to its own executable), else the
// sidecar next to this binary, else the one on PATH.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

const benchUsage = `usage: sidecar bench [workload] [flags]

workloads:
  amortization  cost per turn of a session's prefix KV, computed once then loaded, T = 1..64
  kv         KV tiers: hit rate vs Belady, tier latency, archive throughput, compression, amortization
  recall     LoCoMo evidence recall for bm25, vector, hybrid and hybrid+graph search (--data FILE)
  memory     LoCoMo replayed through a sidecar: context recall per client, prompt prefix sharing (--data FILE)
  proxy      added latency of the sidecar and nginx over a direct upstream (--target name=host:port ...)
  gpu        Focus put/get latency and host<->device bandwidth (--device, --full)
  sessions   sessions on a real llama-server, direct vs through the sidecar, with restarts (tokens reprocessed)
  archive    archive compression on LoCoMo: text with zstd and a trained dictionary, vectors with PQ, summaries (ratio, decode speed, recall@10 loss)
  fleet      sessions moving between replicas (sidecar + llama-server each) with and without a shared Redis store
  scale      sessions in batches up to 100,000 on a scripted upstream: turn latency, RSS, open files, disk per session
  serve      a serving benchmark of your own deployment: multi-turn streamed conversations, TTFT/ITL/E2EL as vLLM reports them (--target URL ...)
  resp       the RESP listener (--resp-listen) beside redis-server: SET/GET GB/s and p50/p99 at 1/8/32 MiB and 1/8/32 connections, a working set 4x RAM, kill -9
  upstream   serve a scripted OpenAI-compatible upstream (for proxy benchmarks and demos)
  demo-llama a demo on a real llama-server: three people, two slots, KV restored, memory recalled (make demo-llama)

With no workload, sidecar bench runs amortization (about 20 s on 2 cores). --json prints one JSON
object on stdout instead of tables. The workloads that start sidecars (memory, sessions, fleet, scale)
run the sidecar binary named by $SIDECAR_BINARY (sidecar bench sets it to itself), else the sidecar
next to this binary, else the one on PATH.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

// run runs one workload: args are what follows `sidecar bench`.
func run(args []string) int {
	name := "amortization"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	var err error
	switch name {
	case "amortization", "amort":
		err = benchAmortization(args)
	case "kv":
		err = benchKV(args)
	case "recall":
		err = benchRecall(args)
	case "memory":
		err = benchMemory(args)
	case "proxy":
		err = benchProxy(args)
	case "serve":
		err = benchServe(args)
	case "upstream":
		err = benchUpstream(args)
	case "gpu":
		err = benchGPU(args)
	case "sessions":
		err = benchSessions(args)
	case "fleet":
		err = benchFleet(args)
	case "scale":
		err = benchScale(args)
	case "archive":
		err = benchArchive(args)
	case "resp":
		err = benchRESP(args)
	case "demo-llama":
		err = benchDemoLlama(args)
	case "help", "-h", "--help":
		fmt.Print(benchUsage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "sidecar bench: unknown workload %q\n\n%s", name, benchUsage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar bench "+name+":", err)
		return 1
	}
	return 0
}

// emit writes r as one JSON object, or as tables through table.
func emit[R any](asJSON bool, r R, table func(io.Writer, R) error) error {
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return table(os.Stdout, r)
}
