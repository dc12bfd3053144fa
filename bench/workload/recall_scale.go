package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
)

// RecallScaleOptions configure RunRecallScale. The zero value (with Data
// set) indexes 100,000 memories and runs 1,000 queries per mode.
type RecallScaleOptions struct {
	// Data is a LoCoMo-format file: its turns are recombined into the
	// memories, its questions are the queries. Required.
	Data string
	// N is the number of memories indexed; 0 selects 100,000.
	N int
	// Queries per mode; 0 selects 1,000.
	Queries int
	// Embedder; nil selects the offline one.
	Embedder index.Embedder
	// Index options (Embedder above, when set, overrides Index.Embedder).
	Index index.Options
}

// RecallScaleReport is query latency and memory at scale.
type RecallScaleReport struct {
	Memories int    `json:"memories"`
	Queries  int    `json:"queries"`
	Embedder string `json:"embedder"`
	// Graph reports whether vector search walked the HNSW graph (above
	// index.Options.ExactBelow) rather than scanning.
	Graph        bool    `json:"graph"`
	BuildSeconds float64 `json:"build_seconds"`
	// HeapBytes is the growth of the live Go heap for the index (after
	// GC); ApproxBytes the index's own estimate (index.Stats).
	HeapBytes   int64 `json:"heap_bytes"`
	ApproxBytes int64 `json:"approx_bytes"`
	// Latency is mode → search latency for k=10, sequential queries.
	Latency map[string]RecallLatency `json:"latency"`
}

// RunRecallScale builds one index of N memories and times searches in
// every mode.
func RunRecallScale(opts RecallScaleOptions) (RecallScaleReport, error) {
	if opts.Data == "" {
		return RecallScaleReport{}, errors.New("bench: recall scale: no data file")
	}
	if opts.N == 0 {
		opts.N = 100_000
	}
	if opts.Queries == 0 {
		opts.Queries = 1000
	}
	if opts.N < 0 || opts.Queries < 0 {
		return RecallScaleReport{}, fmt.Errorf("bench: recall scale: N %d, Queries %d", opts.N, opts.Queries)
	}
	convs, err := LoadLocomo(opts.Data)
	if err != nil {
		return RecallScaleReport{}, err
	}
	var texts, questions []string
	for _, c := range convs {
		for _, t := range c.Turns {
			texts = append(texts, LocomoTurnText(t, true, true))
		}
		for _, q := range c.QA {
			questions = append(questions, q.Question)
		}
	}
	if len(texts) == 0 || len(questions) == 0 {
		return RecallScaleReport{}, errors.New("bench: recall scale: no turns or questions in data")
	}
	iopts := opts.Index
	if opts.Embedder != nil {
		iopts.Embedder = opts.Embedder
	}
	// Each memory joins the words of two random turns at a random cut, so
	// the index holds realistic vocabulary without exact duplicates (which
	// no real memory store holds in bulk and which degrade HNSW walks).
	rng := rand.New(rand.NewSource(1))
	words := make([][]string, len(texts))
	for i, t := range texts {
		words[i] = strings.Fields(t)
	}
	docs := make([]index.Doc, opts.N)
	for i := range docs {
		a, b := words[rng.Intn(len(words))], words[rng.Intn(len(words))]
		w := append(slices.Clone(a[:rng.Intn(len(a)+1)]), b[rng.Intn(len(b)+1):]...)
		docs[i] = index.Doc{ID: strconv.Itoa(i), Text: strings.Join(w, " ")}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	x, err := index.New(iopts)
	if err != nil {
		return RecallScaleReport{}, fmt.Errorf("bench: recall scale: %w", err)
	}
	ctx := context.Background()
	const batch = 1000
	for i := 0; i < len(docs); i += batch {
		if err := x.Add(ctx, docs[i:min(i+batch, len(docs))]...); err != nil {
			return RecallScaleReport{}, fmt.Errorf("bench: recall scale: %w", err)
		}
	}
	build := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := x.Stats()
	rep := RecallScaleReport{
		Memories:     x.Len(),
		Queries:      opts.Queries,
		Embedder:     st.Embedder,
		Graph:        st.Graph,
		BuildSeconds: build.Seconds(),
		HeapBytes:    int64(after.HeapAlloc) - int64(before.HeapAlloc),
		ApproxBytes:  st.ApproxBytes,
		Latency:      map[string]RecallLatency{},
	}
	for _, m := range RecallModes {
		lat := make([]time.Duration, 0, opts.Queries)
		for i := 0; i < opts.Queries; i++ {
			t0 := time.Now()
			if _, err := x.Search(ctx, questions[i%len(questions)], 10, m); err != nil {
				return RecallScaleReport{}, fmt.Errorf("bench: recall scale: %w", err)
			}
			lat = append(lat, time.Since(t0))
		}
		rep.Latency[m.String()] = RecallLatency{P50us: 1000 * percentileMs(lat, 0.5), P99us: 1000 * percentileMs(lat, 0.99)}
	}
	runtime.KeepAlive(x)
	return rep, nil
}

// WriteRecallScaleTable prints a RecallScaleReport for humans.
func WriteRecallScaleTable(w io.Writer, r RecallScaleReport) error {
	fmt.Fprintf(w, "%d memories, %d queries per mode, embedder %s, graph %v: built in %.1f s, heap +%.0f MiB (index estimate %.0f MiB)\n",
		r.Memories, r.Queries, r.Embedder, r.Graph, r.BuildSeconds, float64(r.HeapBytes)/(1<<20), float64(r.ApproxBytes)/(1<<20))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "mode\tp50 µs\tp99 µs\t\n")
	for _, m := range []string{"bm25", "vector", "hybrid"} {
		if l, ok := r.Latency[m]; ok {
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t\n", m, l.P50us, l.P99us)
		}
	}
	return tw.Flush()
}
