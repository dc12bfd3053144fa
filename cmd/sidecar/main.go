// Command sidecar runs kvsidecar: a memory-and-KV-cache sidecar in front of
// an OpenAI-compatible LLM server.
//
//	sidecar serve --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000 --data-dir ./data
//	sidecar bench [workload] [--json]     (runs sidecar-bench, cmd/sidecar-bench)
//	sidecar gpu [--device auto|cuda|cpu]
//	sidecar inspect DIR
//	sidecar snapshot export|import|inspect
//	sidecar version
//
// Every flag also reads an environment variable: --upstream-timeout reads
// SIDECAR_UPSTREAM_TIMEOUT, and so on. A flag given on the command line wins.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
)

// version is set at link time (-ldflags "-X main.version=…"); otherwise the
// module version or "devel".
var version = ""

func versionString() string {
	v := version
	if v == "" {
		v = "devel"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
	}
	return v
}

const usage = `usage: sidecar <command> [flags]

commands:
  serve     run the sidecar in front of an OpenAI-compatible server
  bench     run a benchmark workload through the sidecar-bench binary ("sidecar bench help" lists them)
  gpu       list GPUs, memory and a host<->device bandwidth probe
  inspect   report what a data dir holds (sessions, KV archive, quarantine)
  snapshot  export a session (memory and KV) from a running sidecar as a .hctx file, or import one
  version   print the version

Run "sidecar <command> -h" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return cmdServe(args[1:])
	case "bench":
		return cmdBench(args[1:])
	case "gpu":
		return cmdGPU(args[1:])
	case "inspect":
		return cmdInspect(args[1:])
	case "snapshot":
		return cmdSnapshot(args[1:])
	case "version", "--version", "-version":
		fmt.Println("sidecar", versionString())
		return 0
	case "help", "-h", "--help":
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "sidecar: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}
