package workload

import (
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"
)

// WriteFleetTable writes r as a table for people.
func WriteFleetTable(w io.Writer, r FleetReport) error {
	cache := cacheRAMText(r.CacheRAMMiB)
	fmt.Fprintf(w, "A fleet of %d sidecars, each before its own llama-server, with a shared Redis store (appendfsync %s) and without, and one replica where sessions never move: %d sessions × %d rounds, round r of session i on replica (i+r) mod %d, %d slots each, %d-token documents, %s, %s, -t %d, model %s\n",
		r.Replicas, r.AppendFsync, r.Sessions, r.Rounds, r.Replicas, r.Slots, r.DocTokens, clientText(r.PerUser, r.SharedUser), cache, r.Threads, filepath.Base(r.Model))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "round\tevent\tmoved turns\treprocessed on them shared\tlocal\tshared/local\tnew tokens\tprompt tokens\tTTFT p50 ms s/l\tTTFT p99 ms s/l\terrors s/l\t\n")
	for _, rs := range r.RoundStats {
		ev := rs.Event
		if ev == "" {
			ev = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%.3f\t%d\t%d\t%.0f / %.0f\t%.0f / %.0f\t%d / %d\t\n", rs.Round, ev, rs.Shared.Moved,
			rs.Shared.Reprocessed, rs.Local.Reprocessed, rs.Ratio, rs.Shared.NewTokens, rs.Shared.Prompt,
			rs.Shared.TTFTP50Ms, rs.Local.TTFTP50Ms, rs.Shared.TTFTP99Ms, rs.Local.TTFTP99Ms, rs.Shared.Errors, rs.Local.Errors)
	}
	s, l := r.Shared, r.Local
	fmt.Fprintf(tw, "all\t(rounds ≥ 2)\t%d\t%d\t%d\t%.3f\t%d\t%d\t%.0f / %.0f\t%.0f / %.0f\t%d / %d\t\n", s.Moved, s.Reprocessed, l.Reprocessed, r.Ratio,
		s.NewTokens, s.Prompt, s.TTFTP50Ms, l.TTFTP50Ms, s.TTFTP99Ms, l.TTFTP99Ms, s.Errors, l.Errors)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "the same %d turns on one replica where sessions never move: reprocessed %d of %d prompt tokens\n", r.Sticky.Moved, r.Sticky.Reprocessed, r.Sticky.Prompt)
	for _, rs := range r.RoundStats {
		for _, e := range []struct{ side, err string }{{"shared", rs.Shared.FirstError}, {"local", rs.Local.FirstError}} {
			if e.err != "" {
				fmt.Fprintf(w, "round %d %s: first error: %s\n", rs.Round, e.side, e.err)
			}
		}
	}
	if k := r.AfterKill; k.Turns > 0 {
		fmt.Fprintf(w, "first turns of the killed replica's sessions elsewhere: %d turns, reprocessed %d of %d prompt tokens (%.3f of a cold start; without the store %.3f), TTFT p50 %.0f ms (without the store %.0f ms)\n",
			k.Turns, k.Reprocessed, k.Prompt, k.Ratio, k.LocalRatio, k.TTFTP50Ms, k.LocalTTFT)
	}
	if j := r.Joiner; j.Turns > 0 {
		fmt.Fprintf(w, "one more turn of every session on a replica that joined with empty disks: reprocessed %d of %d prompt tokens (%d new), TTFT p50 %.0f ms, errors %d\n",
			j.Reprocessed, j.Prompt, j.NewTokens, j.TTFTP50Ms, j.Errors)
	}
	fmt.Fprintf(w, "shared fleet's memory after the run, read from that replica: %d of %d acknowledged turns kept in order (%d sessions)\n",
		r.History.Kept, r.History.Turns, r.History.Sessions)
	writeGoalsAndNotes(w, r.Goals, r.Notes)
	fmt.Fprintf(w, "note: \"reprocessed\" is the sum of llama.cpp's timings.prompt_n over the turns served by another replica than the session's previous turn; \"new tokens\" is what those turns added to their sessions' previous prompts (what even a perfect cache reprocesses)\n")
	_, err := fmt.Fprintf(w, "(%.1f s)\n", r.Seconds)
	return err
}
