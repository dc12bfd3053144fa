package workload

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
)

// The table `sidecar bench memory` prints.

// WriteMemoryTable prints r for people.
func WriteMemoryTable(w io.Writer, r MemoryReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "LoCoMo replayed through the sidecar: %s\n", r.Data)
	per := "all questions after one replay"
	if r.QuestionsPerReplay > 0 {
		per = fmt.Sprintf("a new replay every %d questions", r.QuestionsPerReplay)
	}
	fmt.Fprintf(&b, "%d conversations, %d client turns per replay, %d questions (%s); window %d tokens, model %q; %d requests in %.0f s\n\n",
		r.Conversations, r.Turns, r.Questions, per, r.WindowTokens, r.Model, r.Requests, r.Seconds)
	cats := make([]string, 0, len(r.CategoryQuestions))
	for c := range r.CategoryQuestions {
		cats = append(cats, c)
	}
	order := func(name string) int {
		for c := 1; c <= 5; c++ {
			if LocomoCategoryName(c) == name {
				return c
			}
		}
		return 100
	}
	slices.SortFunc(cats, func(a, b string) int { return cmp.Or(cmp.Compare(order(a), order(b)), cmp.Compare(a, b)) })
	fmt.Fprintf(&b, "context recall (%% of evidence turns in the upstream's prompt)\n%-15s %7s %7s %8s", "client", "recall", "all-ev", "tokens")
	for _, c := range cats {
		fmt.Fprintf(&b, " %12s", fmt.Sprintf("%s(%d)", c, r.CategoryQuestions[c]))
	}
	b.WriteByte('\n')
	for _, c := range r.Clients {
		fmt.Fprintf(&b, "%-15s %7.1f %7.1f %8.0f", c.Name, c.ContextRecall, c.AllEvidence, c.PromptTokens)
		for _, cat := range cats {
			fmt.Fprintf(&b, " %12.1f", c.ByCategory[cat])
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%-15s %7s %7s %8s", "index R@10", fmt.Sprintf("%.1f", r.IndexRecall["10"]), "", "")
	for _, cat := range cats {
		fmt.Fprintf(&b, " %12.1f", r.IndexRecallByCategory[cat]["10"])
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "%-15s %7s %7s %8s", "index R@25", fmt.Sprintf("%.1f", r.IndexRecall["25"]), "", "")
	for _, cat := range cats {
		fmt.Fprintf(&b, " %12.1f", r.IndexRecallByCategory[cat]["25"])
	}
	b.WriteString("\n\nprompt prefix: tokens of the previous prompt its successor repeats from the start (shared%..prompt: on turns where nothing left the window; cached%: every turn, of the new prompt's tokens; shift%: the same for an engine that moves the KV a prompt keeps, llama.cpp's n_cache_reuse)\n")
	fmt.Fprintf(&b, "%-15s %6s %7s %9s %7s %7s %7s %7s %8s %8s %8s %8s\n", "client", "turns", "stable", "evictions", "shared%", "mean%", "p10%", "min%", "shared", "prompt", "cached%", "shift%")
	for _, n := range []string{"drop-in", "full-history"} {
		p, ok := r.Prefix[n]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "%-15s %6d %7d %9d %7.1f %7.1f %7.1f %7.1f %8.0f %8.0f %8.1f %8.1f\n", n, p.Turns, p.Stable, p.Evictions, p.SharedPct, p.MeanPct, p.P10Pct, p.MinPct, p.SharedTokens, p.PromptTokens, p.CachedPct, p.ShiftCachedPct)
	}
	fmt.Fprintf(&b, "\nappends detected without a header: %d; sidecar's own model calls: %d for %d client turns (%.3f per turn), by model %v\n",
		r.DetectedAppends, r.BackgroundCalls, r.ClientTurns, r.CallsPerTurn, r.BackgroundByModel)
	_, err := io.WriteString(w, b.String())
	return err
}
