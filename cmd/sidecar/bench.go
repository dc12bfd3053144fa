package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/bench"
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
	if err := writePlot(*plot, func(w io.Writer) error { return bench.WriteAmortSVG(w, r) }); err != nil {
		return err
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
	graphWeight := fs.Float64("graph-weight", 0, "the entity graph's weight in the hybrid+graph column (0: the index default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *data == "" {
		return errors.New("--data FILE is required")
	}
	r, err := bench.RunRecall(bench.RecallOptions{Data: *data, ContextTurns: *ctxTurns, Index: index.Options{GraphWeight: *graphWeight}})
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

// targetsFlag collects --target name=host:port[,metrics][,session][,pid=N…]
// values.
type targetsFlag []bench.ProxyTarget

func (t *targetsFlag) String() string { return fmt.Sprint(*t) }
func (t *targetsFlag) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	parts := strings.Split(rest, ",")
	if !ok || name == "" || parts[0] == "" {
		return fmt.Errorf("want name=host:port[,metrics][,session][,pid=N], got %q", v)
	}
	pt := bench.ProxyTarget{Name: name, Addr: parts[0]}
	for _, opt := range parts[1:] {
		switch {
		case opt == "metrics":
			pt.MetricsAddr = pt.Addr
		case opt == "session":
			pt.Session = true
		case strings.HasPrefix(opt, "pid="):
			pid, err := strconv.Atoi(strings.TrimPrefix(opt, "pid="))
			if err != nil || pid < 1 {
				return fmt.Errorf("bad %q in %q", opt, v)
			}
			pt.PIDs = append(pt.PIDs, pid)
		default:
			return fmt.Errorf("unknown %q in %q: want metrics, session or pid=N", opt, v)
		}
	}
	*t = append(*t, pt)
	return nil
}

func benchProxy(args []string) error {
	fs := flag.NewFlagSet("bench proxy", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	var targets targetsFlag
	var conc, upPIDs intsFlag
	fs.Var(&targets, "target", "name=host:port to measure, repeated; 'direct' is the baseline, 'sidecar' and 'nginx' are compared; append ',metrics' to scrape its /metrics, ',session' to send an API key and session ids (the session path), ',pid=N' (repeatable) for the CPU of its processes")
	n := fs.Int("requests", 10000, "non-streaming requests per target and concurrency")
	ns := fs.Int("stream-requests", 2000, "streaming requests per target and concurrency")
	fs.Var(&conc, "concurrency", "connections (requests in flight), a comma-separated list measured one after the other (default 8,64)")
	fs.Var(&upPIDs, "upstream-pid", "the upstream's process ids, comma-separated: its CPU per request over every path")
	rounds := fs.Int("rounds", 5, "rounds the targets are interleaved in")
	warmup := fs.Int("warmup", 500, "warm-up requests per target and concurrency")
	sessionTurns := fs.Int("session-turns", 16, "requests per session on a session path")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := bench.RunProxy(bench.ProxyOptions{Targets: targets, Requests: *n, StreamRequests: *ns, Concurrency: conc,
		UpstreamPIDs: upPIDs, Rounds: *rounds, Warmup: *warmup, SessionTurns: *sessionTurns})
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

func benchMemory(args []string) error {
	fs := flag.NewFlagSet("bench memory", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sidecar bench memory --data FILE [flags] [-- serve flags]\n\n"+
			"Replays LoCoMo conversations through a sidecar whose upstream is the scripted mock, then asks the\n"+
			"questions. Without --sidecar it runs `sidecar serve` in this process with its defaults (flags after\n"+
			"-- are passed to it) on a temporary data dir.\n\n")
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print one JSON object")
	data := fs.String("data", "", "LoCoMo-format JSON file (required)")
	window := fs.Int("window-tokens", 8192, "the sidecar's window (passed to the sidecar it starts; used by the trimming baseline)")
	perReplay := fs.Int("questions-per-replay", 0, "questions asked per replay of a conversation (0: all, one after the other)")
	convs := fs.Int("conversations", 0, "replay only the first N conversations (0: all)")
	only := fs.String("only", "", "replay only these conversations: comma-separated zero-based positions in the file (leave-one-out tuning)")
	target := fs.String("sidecar", "", "base URL of a sidecar already running (its upstream must be --upstream-listen)")
	upListen := fs.String("upstream-listen", "127.0.0.1:0", "address of the scripted upstream")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	engineURL := fs.String("engine-url", "", "instead: replay (drop-in, no questions) through a sidecar in front of this llama.cpp server and report its prompt-cache figures")
	turns := fs.Int("turns", 0, "with --engine-url: turns per conversation (0: all)")
	noDirect := fs.Bool("no-direct", false, "with --engine-url: skip the direct full-history replay after the sidecar's")
	triples := fs.Bool("triples", false, "the scripted upstream answers extraction with each turn as a fact and rule-based triples on it (bench.LocomoExtraction), for graph recall; -- --recall-graph-weight -1 turns the graph off")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *data == "" {
		return errors.New("--data FILE is required")
	}
	upstream := *engineURL
	var up *bench.MockUpstream
	if upstream == "" {
		ln, err := net.Listen("tcp", *upListen)
		if err != nil {
			return err
		}
		mo := bench.MockUpstreamOptions{KeepPrompts: true, BackgroundReply: "[SKIP]"}
		if *triples {
			convs, err := bench.LoadLocomo(*data)
			if err != nil {
				return err
			}
			mo.Background = bench.LocomoExtraction(convs)
		}
		up = bench.NewMockUpstream(mo)
		go func() { _ = up.Serve(ln) }()
		defer up.Close()
		upstream = "http://" + ln.Addr().String()
	}

	sidecar := *target
	if sidecar == "" {
		dir, err := os.MkdirTemp("", "bench-memory-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		var c serveConfig
		sf := serveFlags(&c)
		base := []string{"--listen", "127.0.0.1:0", "--upstream", upstream, "--data-dir", dir,
			"--window-tokens", strconv.Itoa(*window), "--log-level", "warn", "--log-format", "text"}
		if err := parseFlags(sf, append(base, fs.Args()...), func(string) string { return "" }); err != nil {
			return fmt.Errorf("serve flags: %w", err)
		}
		log, err := newLogger(c.logLevel, c.logFormat)
		if err != nil {
			return err
		}
		ctx, stop := context.WithCancel(context.Background())
		ready := make(chan string, 1)
		done := make(chan error, 1)
		go func() { done <- serve(ctx, c, log, ready) }()
		select {
		case addr := <-ready:
			sidecar = "http://" + addr
		case err := <-done:
			stop()
			return fmt.Errorf("sidecar: %w", err)
		}
		defer func() {
			stop()
			<-done
		}()
	} else if fs.NArg() > 0 {
		return errors.New("serve flags after -- need no --sidecar")
	}
	var progress io.Writer = os.Stderr
	if *quiet {
		progress = nil
	}
	if *engineURL != "" {
		direct := ""
		if !*noDirect {
			direct = *engineURL
		}
		r, err := bench.RunEngine(bench.EngineOptions{Data: *data, Sidecar: sidecar, Direct: direct, Conversations: *convs, Turns: *turns, Progress: progress})
		if err != nil {
			return err
		}
		return emit(*asJSON, r, bench.WriteEngineTable)
	}
	var onlyIdx []int
	for _, f := range strings.Split(*only, ",") {
		if f = strings.TrimSpace(f); f != "" {
			i, err := strconv.Atoi(f)
			if err != nil {
				return fmt.Errorf("--only %q: %w", *only, err)
			}
			onlyIdx = append(onlyIdx, i)
		}
	}
	r, err := bench.RunMemory(bench.MemoryOptions{Data: *data, Sidecar: sidecar, Upstream: up, WindowTokens: *window,
		QuestionsPerReplay: *perReplay, Conversations: *convs, Only: onlyIdx, Progress: progress})
	if err != nil {
		return err
	}
	return emit(*asJSON, r, bench.WriteMemoryTable)
}
