package main

import (
	"flag"
	"io"
	"os"

	"github.com/kvsidecar/kvsidecar/bench/workload"
)

func benchKV(args []string) error {
	fs := flag.NewFlagSet("bench kv", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	full := fs.Bool("full", false, "full-size latency, throughput and amortization runs (minutes)")
	dir := fs.String("dir", "", "scratch folder for archive files (default: a temporary folder)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := workload.RunKV(workload.KVOptions{Quick: !*full, Dir: *dir})
	if err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteKVTable)
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
	r, err := workload.RunAmortization(workload.AmortOptions{Quick: *quick, PrefixTokens: *prefix, Preset: *preset})
	if err != nil {
		return err
	}
	if err := writePlot(*plot, func(w io.Writer) error { return workload.WriteAmortSVG(w, r) }); err != nil {
		return err
	}
	if *asJSON {
		return emit(true, map[string]any{"amortization": r}, nil)
	}
	return workload.WriteAmortTable(os.Stdout, r)
}
