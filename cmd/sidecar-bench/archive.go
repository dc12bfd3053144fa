package main

import (
	"errors"
	"flag"

	"github.com/kvsidecar/kvsidecar/bench/workload"
)

func benchArchive(args []string) error {
	fs := flag.NewFlagSet("bench archive", flag.ContinueOnError)
	var o workload.ArchiveOptions
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.StringVar(&o.Data, "data", "", "LoCoMo-format JSON file (required), e.g. ../shared/data/locomo-dev.json")
	fs.Float64Var(&o.TrainShare, "train-share", 0.5, "share of each conversation's sessions, oldest first, the text dictionary is trained on (the rest is compressed with it)")
	fs.IntVar(&o.DictBytes, "dict-bytes", 16<<10, "size bound of the trained zstd dictionary")
	fs.IntVar(&o.PQBytes, "pq-bytes", 0, "bytes per vector code (product-quantisation subspaces); 0: a sixteenth of the float32 vector (16:1)")
	fs.Float64Var(&o.SummaryShare, "summary-share", 0.1, "extractive summary budget, a share of its document's bytes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Data == "" {
		return errors.New("--data FILE is required")
	}
	r, err := workload.RunArchive(o)
	if err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteArchiveTable)
}
