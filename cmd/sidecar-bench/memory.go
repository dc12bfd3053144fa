package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/kvsidecar/kvsidecar/bench/workload"
	"github.com/kvsidecar/kvsidecar/internal/mockup"
)

func benchMemory(args []string) error {
	fs := flag.NewFlagSet("bench memory", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: sidecar bench memory --data FILE [flags] [-- serve flags]\n\n"+
			"Replays LoCoMo conversations through a sidecar whose upstream is the scripted mock, then asks the\n"+
			"questions. Without --sidecar it starts `sidecar serve` (the sidecar binary, see sidecar bench help) with\n"+
			"its defaults (flags after -- are passed to it) on a temporary data dir.\n\n")
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
	questions := fs.String("questions", "", "write a JSON line per question of the drop-in client (category, evidence, evidence found) to this file")
	perTurn := fs.Bool("per-turn", false, "with --engine-url --json: each turn's cached and computed engine tokens in the report")
	triples := fs.Bool("triples", false, "the scripted upstream answers extraction with each turn as a fact and rule-based triples on it (workload.LocomoExtraction), for graph recall; -- --recall-graph-weight -1 turns the graph off")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *data == "" {
		return errors.New("--data FILE is required")
	}
	upstream := *engineURL
	var up *mockup.Server
	if upstream == "" {
		ln, err := net.Listen("tcp", *upListen)
		if err != nil {
			return err
		}
		mo := mockup.Options{KeepPrompts: true, BackgroundReply: "[SKIP]"}
		if *triples {
			convs, err := workload.LoadLocomo(*data)
			if err != nil {
				return err
			}
			mo.Background = workload.LocomoExtraction(convs)
		}
		up = mockup.New(mo)
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
		extra := append([]string{"--window-tokens", strconv.Itoa(*window), "--log-level", "warn", "--log-format", "text"}, fs.Args()...)
		sc, err := startDefaultSidecar(context.Background(), upstream, dir, extra, os.Stderr)
		if err != nil {
			return fmt.Errorf("sidecar: %w", err)
		}
		defer func() {
			sc.Stop()
			sc.Close()
		}()
		sidecar = "http://" + sc.Addr()
	} else if fs.NArg() > 0 {
		return errors.New("serve flags after -- need no --sidecar")
	}
	var progress io.Writer = os.Stderr
	if *quiet {
		progress = nil
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
	if *engineURL != "" {
		direct := ""
		if !*noDirect {
			direct = *engineURL
		}
		r, err := workload.RunEngine(workload.EngineOptions{Data: *data, Sidecar: sidecar, Direct: direct, Conversations: *convs, Turns: *turns, Only: onlyIdx, Progress: progress, PerTurn: *perTurn})
		if err != nil {
			return err
		}
		return emit(*asJSON, r, workload.WriteEngineTable)
	}
	var qw io.Writer
	if *questions != "" {
		f, err := os.Create(*questions)
		if err != nil {
			return err
		}
		defer f.Close()
		qw = f
	}
	r, err := workload.RunMemory(workload.MemoryOptions{Data: *data, Sidecar: sidecar, Upstream: up, WindowTokens: *window,
		QuestionsPerReplay: *perReplay, Conversations: *convs, Only: onlyIdx, Progress: progress, Questions: qw})
	if err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteMemoryTable)
}
