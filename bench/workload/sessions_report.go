package workload

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"text/tabwriter"
)

// writeGoalsAndNotes writes a report's goals, each met or not, and its
// notes, a line each.
func writeGoalsAndNotes(w io.Writer, goals []SessionsGoal, notes []string) {
	for _, g := range goals {
		mark := "met"
		if !g.Met {
			mark = "NOT met"
		}
		fmt.Fprintf(w, "- %s: %.3f (goal ≤ %.2f) %s\n", g.Name, g.Value, g.Limit, mark)
	}
	for _, n := range notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// WriteSessionsTable writes r as a table for people.
func WriteSessionsTable(w io.Writer, r SessionsReport) error {
	cache := cacheRAMText(r.CacheRAMMiB)
	order := r.Order
	if r.FollowUp {
		order += ", each turn followed by a second question"
	}
	if r.PauseMs > 0 {
		order += fmt.Sprintf(", %d ms before each question", r.PauseMs)
	}
	fmt.Fprintf(w, "Sessions on a real llama.cpp server, direct vs through the sidecar: %d sessions × %d rounds (%s) over %d slots, %d-token documents, %s, %s, -t %d, model %s\n",
		r.Sessions, r.Rounds, order, r.Slots, r.DocTokens, clientText(r.PerUser, r.SharedUser), cache, r.Threads, filepath.Base(r.Model))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "round\tevent\treprocessed direct\tsidecar\tsidecar/direct\tfloor\tprompt tokens d/s\tcached d/s\tengine tokens d/s\tgenerated d/s\town calls (unbounded)\tTTFT p50 ms d/s\tTTFT p99 ms d/s\trestores\tpreloads (used, wasted)\tsaves\trestore ms\tsave ms\terrors d/s\t\n")
	for _, rs := range r.RoundStats {
		d, s := rs.Direct, rs.Sidecar
		ev := rs.Event
		if ev == "" {
			ev = "-"
		}
		preloads := orNA(s.Preloads, "%.0f")
		if s.Preloads >= 0 {
			preloads += fmt.Sprintf(" (%s, %s)", orNA(s.PreloadsUsed, "%.0f"), orNA(s.PreloadsWasted, "%.0f"))
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%.3f\t%.3f\t%d / %d\t%d / %d\t%d / %d\t%d / %d\t%d (%d)\t%.0f / %.0f\t%.0f / %.0f\t%s\t%s\t%s\t%s\t%s\t%d / %d\t\n",
			rs.Round, ev, d.Reprocessed, s.Reprocessed, rs.Ratio, rs.Floor, d.PromptTokens, s.PromptTokens, d.Cached, s.Cached,
			d.EngineReprocessed, s.EngineReprocessed, d.EngineGenerated, s.EngineGenerated, s.OwnGenerations, s.OwnUnbounded, d.TTFTP50Ms, s.TTFTP50Ms, d.TTFTP99Ms, s.TTFTP99Ms,
			orNA(s.Restores, "%.0f"), preloads, orNA(s.Saves, "%.0f"), orNA(s.RestoreMeanMs, "%.1f"), orNA(s.SaveMeanMs, "%.1f"), d.Errors, s.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, rs := range r.RoundStats {
		for _, e := range []struct{ side, err string }{{"direct", rs.Direct.FirstError}, {"sidecar", rs.Sidecar.FirstError}} {
			if e.err != "" {
				fmt.Fprintf(w, "round %d %s: first error: %s\n", rs.Round, e.side, e.err)
			}
		}
	}
	t := r.TTFT
	if t.Ratio > 0 {
		fmt.Fprintf(w, "TTFT of restored turns / recomputed turns (p50, rounds ≥ 2): %.0f ms (%d sidecar turns) / %.0f ms (%d direct turns) = %.2f\n",
			t.RestoredP50Ms, t.RestoredTurns, t.RecomputedP50Ms, t.RecomputedTurns, t.Ratio)
	} else {
		fmt.Fprintf(w, "TTFT of restored / recomputed turns: n/a (%d restored sidecar turns, %d recomputed direct turns after round 1)\n", t.RestoredTurns, t.RecomputedTurns)
	}
	if t.ReturningTurns > 0 {
		ratio := "n/a (no follow-ups: --follow-up)"
		if t.ReturningRatio > 0 {
			ratio = fmt.Sprintf("%.0f ms (%d follow-ups) = %.2f", t.ResidentP50Ms, t.ResidentTurns, t.ReturningRatio)
		}
		fmt.Fprintf(w, "TTFT of returning sessions / resident ones (p50, rounds ≥ 2): %.0f ms (%d turns: %d preloaded, %d restored on the request path, %d neither) / %s\n",
			t.ReturningP50Ms, t.ReturningTurns, t.Preloaded, t.RestoredOnPath, t.Prefilled, ratio)
	}
	writeGoalsAndNotes(w, r.Goals, r.Notes)
	fmt.Fprintf(w, "note: \"reprocessed\" is the sum of llama.cpp's timings.prompt_n over the client's turns; \"floor\" is the ratio a perfect cache would reach (the tokens the turns added, over the direct client's reprocessed); \"engine tokens\" is the server's own llamacpp:prompt_tokens_total, which behind the sidecar also counts its background calls\n")
	_, err := fmt.Fprintf(w, "(%.1f s)\n", r.Seconds)
	return err
}

func orNA(v float64, format string) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}

// WriteSessionsSVG writes a bar chart of tokens reprocessed per round,
// direct and through the sidecar, with the ratio over each pair and the
// restarts marked.
func WriteSessionsSVG(w io.Writer, r SessionsReport) error {
	const (
		width, height          = 760.0, 420.0
		left, right, top, bott = 80.0, 175.0, 50.0, 60.0
	)
	pw, ph := width-left-right, height-top-bott
	hi := 1.0
	for _, rs := range r.RoundStats {
		hi = max(hi, float64(rs.Direct.Reprocessed), float64(rs.Sidecar.Reprocessed))
	}
	// A round axis top: 1, 2 or 5 times a power of ten.
	step := math.Pow(10, math.Floor(math.Log10(hi)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*step >= hi {
			hi = m * step
			break
		}
	}
	n := max(1, len(r.RoundStats))
	gw := pw / float64(n)
	bw := gw * 0.32
	y := func(v float64) float64 { return top + ph*(1-v/hi) }
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%.0f" y="22" font-size="14">Tokens reprocessed per round: %d sessions, %d slots, %d-token documents</text>`+"\n", left, r.Sessions, r.Slots, r.DocTokens)
	p(`<text x="%.0f" y="38" fill="#555">llama.cpp timings.prompt_n summed over the client's turns; the number over each pair is sidecar/direct</text>`+"\n", left)
	for i := 0; i <= 5; i++ {
		v := hi * float64(i) / 5
		yy := y(v)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, yy, left+pw, yy)
		p(`<text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left-6, yy+4, v)
	}
	colors := [2]string{"#999999", "#1f77b4"}
	for i, rs := range r.RoundStats {
		x0 := left + gw*float64(i) + gw/2 - bw
		for j, v := range []int64{rs.Direct.Reprocessed, rs.Sidecar.Reprocessed} {
			x := x0 + float64(j)*bw
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, y(float64(v)), bw-2, top+ph-y(float64(v)), colors[j])
		}
		// The sidecar side's new tokens: what a perfect cache reprocesses.
		yn := y(float64(rs.Sidecar.NewTokens))
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="2" stroke-dasharray="4 3"/>`+"\n", x0+bw-4, yn, x0+2*bw+2, yn)
		top2 := y(float64(max(rs.Direct.Reprocessed, rs.Sidecar.Reprocessed)))
		p(`<text x="%.1f" y="%.1f" text-anchor="middle">%.2f</text>`+"\n", x0+bw, top2-6, rs.Ratio)
		p(`<text x="%.1f" y="%.1f" text-anchor="middle">round %d</text>`+"\n", x0+bw, top+ph+16, rs.Round)
		if rs.Event != "" {
			p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#d62728">after %s</text>`+"\n", x0+bw, top+ph+32, xmlEscape(rs.Event))
			xl := left + gw*float64(i)
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#d62728" stroke-dasharray="5 4"/>`+"\n", xl, top, xl, top+ph)
		}
	}
	p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	p(`<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">tokens reprocessed</text>`+"\n", top+ph/2)
	for j, name := range []string{"llama.cpp alone", "through the sidecar"} {
		ly := top + 10 + 20*float64(j)
		p(`<rect x="%.1f" y="%.1f" width="14" height="10" fill="%s"/>`+"\n", left+pw+10, ly-8, colors[j])
		p(`<text x="%.1f" y="%.1f">%s</text>`+"\n", left+pw+30, ly+1, name)
	}
	ly := top + 50
	p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="2" stroke-dasharray="4 3"/>`+"\n", left+pw+10, ly-3, left+pw+24, ly-3)
	p(`<text x="%.1f" y="%.1f">new tokens (the floor)</text>`+"\n", left+pw+30, ly+1)
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}
