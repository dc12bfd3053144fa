package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/kvsidecar/kvsidecar/bench/workload"
	"github.com/kvsidecar/kvsidecar/index"
)

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
	r, err := workload.RunRecall(workload.RecallOptions{Data: *data, ContextTurns: *ctxTurns, Index: index.Options{GraphWeight: *graphWeight}})
	if err != nil {
		return err
	}
	if *scale <= 0 {
		return emit(*asJSON, r, workload.WriteRecallTable)
	}
	s, err := workload.RunRecallScale(workload.RecallScaleOptions{Data: *data, N: *scale})
	if err != nil {
		return err
	}
	// The scale figures ride along in the same object, beside "recall".
	both := recallWithScale{r, s}
	return emit(*asJSON, both, func(w io.Writer, b recallWithScale) error {
		if err := workload.WriteRecallTable(w, b.RecallReport); err != nil {
			return err
		}
		fmt.Fprintln(w)
		return workload.WriteRecallScaleTable(w, b.Scale)
	})
}

type recallWithScale struct {
	workload.RecallReport
	Scale workload.RecallScaleReport `json:"scale"`
}
