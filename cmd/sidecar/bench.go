package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvsidecar/kvsidecar/bench"
)

const benchUsage = `usage: sidecar bench [workload] [flags]

workloads:
  amortization  cost per turn of a session's prefix KV, computed once then loaded, T = 1..64
  kv         KV tiers: hit rate vs Belady, tier latency, archive throughput, compression, amortization
  recall     LoCoMo evidence recall for bm25, vector and hybrid search (--data FILE)
  proxy      added latency of the sidecar and nginx over a direct upstream (--target name=host:port ...)
  gpu        Focus put/get latency and host<->device bandwidth (--device, --full)
  upstream   serve a scripted OpenAI-compatible upstream (for proxy benchmarks and demos)

With no workload, sidecar bench runs amortization (about 20 s on 2 cores). --json prints one JSON
object on stdout instead of tables.
`

func cmdBench(args []string) int {
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
	case "proxy":
		err = benchProxy(args)
	case "upstream":
		err = benchUpstream(args)
	case "gpu":
		err = benchGPU(args)
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

func benchKV(args []string) error {
	fs := flag.NewFlagSet("bench kv", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	full := fs.Bool("full", false, "full-size latency, throughput and amortization runs (minutes)")
	dir := fs.String("dir", "", "scratch folder for archive files (default: a temporary folder)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := bench.RunKV(bench.KVOptions{Quick: !*full, Dir: *dir})
	if err != nil {
		return err
	}
	return emit(*asJSON, r, bench.WriteKVTable)
}

func benchAmortization(args []string) error {
	fs := flag.NewFlagSet("bench amortization", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	quick := fs.Bool("quick", false, "a smaller model preset (seconds)")
	plot := fs.String("plot", "", "also write an SVG plot of cost per turn vs T to this file")
	prefix := fs.Int("prefix-tokens", 2048, "tokens of the session's stable prefix")
	preset := fs.String("preset", "", "shape preset of the reference KV computer (default llama3-8b scaled for CPU)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := bench.RunAmortization(bench.AmortOptions{Quick: *quick, PrefixTokens: *prefix, Preset: *preset})
	if err != nil {
		return err
	}
	if *plot != "" {
		f, err := os.Create(*plot)
		if err != nil {
			return err
		}
		if err := bench.WriteAmortSVG(f, r); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if *asJSON {
		return emit(true, map[string]any{"amortization": r}, nil)
	}
	return bench.WriteAmortTable(os.Stdout, r)
}

func benchRecall(args []string) error {
	fs := flag.NewFlagSet("bench recall", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	data := fs.String("data", "", "LoCoMo-format JSON file (required)")
	ctxTurns := fs.Int("context", 0, "preceding turns indexed with each turn (0: one; -1: the turn alone, as the LoCoMo paper)")
	scale := fs.Int("scale", 0, "also index this many recombined memories and report search latency")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *data == "" {
		return errors.New("--data FILE is required")
	}
	r, err := bench.RunRecall(bench.RecallOptions{Data: *data, ContextTurns: *ctxTurns})
	if err != nil {
		return err
	}
	if *scale <= 0 {
		return emit(*asJSON, r, bench.WriteRecallTable)
	}
	s, err := bench.RunRecallScale(bench.RecallScaleOptions{Data: *data, N: *scale})
	if err != nil {
		return err
	}
	// The scale figures ride along in the same object, beside "recall".
	both := recallWithScale{r, s}
	return emit(*asJSON, both, func(w io.Writer, b recallWithScale) error {
		if err := bench.WriteRecallTable(w, b.RecallReport); err != nil {
			return err
		}
		fmt.Fprintln(w)
		return bench.WriteRecallScaleTable(w, b.Scale)
	})
}

type recallWithScale struct {
	bench.RecallReport
	Scale bench.RecallScaleReport `json:"scale"`
}

// targetsFlag collects --target name=host:port[,metrics] values.
type targetsFlag []bench.ProxyTarget

func (t *targetsFlag) String() string { return fmt.Sprint(*t) }
func (t *targetsFlag) Set(v string) error {
	name, addr, ok := strings.Cut(v, "=")
	if !ok || name == "" || addr == "" {
		return fmt.Errorf("want name=host:port, got %q", v)
	}
	pt := bench.ProxyTarget{Name: name, Addr: addr}
	if a, m, ok := strings.Cut(addr, ",metrics"); ok && m == "" {
		pt.Addr, pt.MetricsAddr = a, a
	}
	*t = append(*t, pt)
	return nil
}

func benchProxy(args []string) error {
	fs := flag.NewFlagSet("bench proxy", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	var targets targetsFlag
	fs.Var(&targets, "target", "name=host:port to measure, repeated; 'direct' is the baseline; append ',metrics' to scrape its /metrics")
	n := fs.Int("requests", 10000, "non-streaming requests per target")
	ns := fs.Int("stream-requests", 2000, "streaming requests per target")
	c := fs.Int("concurrency", 8, "requests in flight")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := bench.RunProxy(bench.ProxyOptions{Targets: targets, Requests: *n, StreamRequests: *ns, Concurrency: *c})
	if err != nil {
		return err
	}
	return emit(*asJSON, r, bench.WriteProxyTable)
}

func benchUpstream(args []string) error {
	fs := flag.NewFlagSet("bench upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8000", "address to serve the scripted upstream on")
	events := fs.Int("events", 16, "chunks in a streamed answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	m := bench.NewMockUpstream(bench.MockUpstreamOptions{StreamEvents: *events})
	fmt.Fprintf(os.Stderr, "mock upstream listening on http://%s\n", ln.Addr())
	go func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		<-ch
		_ = m.Close()
	}()
	return m.Serve(ln)
}
