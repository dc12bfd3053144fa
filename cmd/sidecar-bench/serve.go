package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/kvsidecar/kvsidecar/bench/workload"
)

// serveTargetsFlag collects --target [name=]URL values.
type serveTargetsFlag []workload.ServeTarget

func (t *serveTargetsFlag) String() string { return fmt.Sprint(*t) }
func (t *serveTargetsFlag) Set(v string) error {
	name, u, ok := strings.Cut(v, "=")
	if !ok || strings.Contains(name, "/") {
		name, u = "", v
	}
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
		return fmt.Errorf("want [name=]http://host:port[/v1], got %q", v)
	}
	if name == "" {
		name = pu.Host
	}
	*t = append(*t, workload.ServeTarget{Name: name, URL: u})
	return nil
}

// intsFlag parses a comma-separated list of integers.
type intsFlag []int

func (s *intsFlag) String() string { return fmt.Sprint(*s) }
func (s *intsFlag) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("want positive integers separated by commas, got %q", v)
		}
		*s = append(*s, n)
	}
	return nil
}

func benchServe(args []string) error {
	fs := flag.NewFlagSet("bench serve", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sidecar bench serve --target [name=]URL [--target …] [flags]\n\n"+
			"Streams multi-turn conversations to each target (an OpenAI-compatible server, or a sidecar in front\n"+
			"of one) and reports TTFT, TPOT, ITL and E2EL (mean, median, p90, p99), request and token\n"+
			"throughput and the engine's cached prompt tokens, named as vLLM's benchmark_serving.py names them.\n"+
			"Every conversation sends X-Session-ID and Authorization, so a sidecar keeps it as a session.\n\n")
		fs.PrintDefaults()
	}
	var o workload.ServeOptions
	var targets serveTargetsFlag
	var conc intsFlag
	fs.Var(&targets, "target", "[name=]base URL to measure, repeated (e.g. direct=http://127.0.0.1:8000 sidecar=http://127.0.0.1:8080)")
	fs.StringVar(&o.Dataset, "dataset", "", "ShareGPT-format JSON file of conversations (default: synthetic conversations)")
	fs.IntVar(&o.Conversations, "conversations", 16, "conversations per run")
	fs.IntVar(&o.Turns, "turns", 0, "user turns per conversation (0: 4 synthetic, every turn of a dataset's)")
	fs.IntVar(&o.SystemWords, "system-words", 300, "words of a synthetic conversation's system message (its own document)")
	fs.IntVar(&o.UserWords, "user-words", 20, "words of a synthetic user message")
	fs.IntVar(&o.MaxTokens, "max-tokens", 128, "max_tokens of every request")
	fs.StringVar(&o.Model, "model", "", "model of every request (default: the first the first target's /v1/models lists)")
	apiKey := fs.String("api-key", "", "bearer token of every request (default $OPENAI_API_KEY, else bench-serve)")
	extra := fs.String("extra-body", "", `JSON object merged into every request body, e.g. '{"grammar":"root ::= [a-z ]+"}'`)
	fs.Float64Var(&o.RequestRate, "request-rate", 0, "mean requests/s, Poisson arrivals (0: no pacing)")
	fs.Var(&conc, "concurrency", "cap on requests in flight; a comma-separated list runs a sweep, e.g. 1,4,16 (default: no cap)")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the synthetic conversations, the dataset's sample and the arrivals")
	fs.DurationVar(&o.RequestTimeout, "timeout", 0, "bound on one request, to the end of its stream (0: 10m)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	plot := fs.String("plot", "", "also write an SVG plot of the latencies and throughput against concurrency to this file")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if len(targets) == 0 {
		return errors.New("--target URL is required")
	}
	o.Targets, o.Concurrency = targets, conc
	o.APIKey = *apiKey
	if o.APIKey == "" {
		o.APIKey = os.Getenv("OPENAI_API_KEY")
	}
	if *extra != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(*extra), &m); err != nil || m == nil {
			return fmt.Errorf("--extra-body: want a JSON object, got %q", *extra)
		}
		o.ExtraBody = json.RawMessage(*extra)
	}
	if !*quiet {
		o.Progress = os.Stderr
	}
	ctx, stop := interruptible()
	defer stop()
	r, err := workload.RunServe(ctx, o)
	if err != nil {
		return err
	}
	if err := writePlot(*plot, func(w io.Writer) error { return workload.WriteServeSVG(w, r) }); err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteServeTable)
}
