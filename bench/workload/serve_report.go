package workload

import (
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteServeTable prints the report for humans: throughput and cached
// tokens per run, then each run's latencies (ms) as vLLM prints them
// (mean, median, percentiles).
func WriteServeTable(w io.Writer, r ServeReport) error {
	fmt.Fprintf(w, "model %s, %d conversations (%s), %d requests per run, max_tokens %d, request rate %s, seed %d\n\n",
		r.Model, r.Conversations, r.Dataset, r.Requests, r.MaxTokens, rateText(r.RequestRate), r.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "target\tconcurrency\tcompleted\tfailed\tduration s\tinput tok\toutput tok\treq/s\toutput tok/s\ttotal tok/s\tcached tok\tcached\t\n")
	for _, x := range r.Runs {
		share := "n/a"
		if x.CachedShare >= 0 {
			share = fmt.Sprintf("%.1f%%", 100*x.CachedShare)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f\t%d\t%d\t%.2f\t%.1f\t%.1f\t%d\t%s\t\n",
			x.Target, concText(x.MaxConcurrency), x.Completed, x.Failed, x.Duration, x.TotalInputTokens, x.TotalOutputTokens,
			x.RequestThroughput, x.OutputThroughput, x.TotalTokenThroughput, x.TotalCachedTokens, share)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "target\tconcurrency\tms\tmean\tmedian\tp90\tp99\tstd\t\n")
	for _, x := range r.Runs {
		for i, d := range x.dists() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", x.Target, concText(x.MaxConcurrency),
				[]string{"TTFT", "TPOT", "ITL", "E2EL"}[i], d.Mean, d.Median, d.P90, d.P99, d.Std)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, x := range r.Runs {
		for _, e := range x.Errors {
			fmt.Fprintf(w, "%s, concurrency %s: error: %s\n", x.Target, concText(x.MaxConcurrency), e)
		}
	}
	_, err := fmt.Fprintf(w, "\nTTFT: to the first chunk with generated text; ITL: gaps between later chunks; TPOT: (E2EL - TTFT) / (output tokens - 1); cached: the server's cached prompt tokens over the prompt tokens of the requests that report them (%.1f s)\n", r.Seconds)
	return err
}

func rateText(r Rate) string {
	if r == 0 {
		return "inf"
	}
	return fmt.Sprintf("%g/s", float64(r))
}

// serveColors per target, in order.
var serveColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

// WriteServeSVG writes four panels against the concurrency of each run:
// TTFT, ITL and E2EL (median solid, p99 dashed) and output tokens/s, one
// colour per target.
func WriteServeSVG(w io.Writer, r ServeReport) error {
	const (
		width, height = 900.0, 640.0
		cols, rows    = 2, 2
		top           = 64.0
		pl, pr, pt    = 64.0, 16.0, 26.0 // panel padding: left, right, top
		pb            = 40.0             // and bottom
	)
	// The x categories: concurrency levels in the order they ran.
	var levels []int
	var targets []string
	for _, x := range r.Runs {
		if !slices.Contains(levels, x.MaxConcurrency) {
			levels = append(levels, x.MaxConcurrency)
		}
		if !slices.Contains(targets, x.Target) {
			targets = append(targets, x.Target)
		}
	}
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="16" y="22" font-size="14">Serving benchmark: %s, %d conversations (%s), %d requests per run, request rate %s</text>`+"\n",
		xmlEscape(path.Base(r.Model)), r.Conversations, xmlEscape(r.Dataset), r.Requests, rateText(r.RequestRate))
	lx := 16.0
	for i, t := range targets {
		c := serveColors[i%len(serveColors)]
		p(`<line x1="%.1f" y1="42" x2="%.1f" y2="42" stroke="%s" stroke-width="2.5"/>`+"\n", lx, lx+22, c)
		p(`<text x="%.1f" y="46">%s</text>`+"\n", lx+28, xmlEscape(t))
		lx += 40 + 7*float64(len(t))
	}
	p(`<text x="%.1f" y="46" fill="#555">solid: median, dashed: p99</text>`+"\n", lx+10)

	type panel struct {
		title string
		get   func(ServeResult) (med, p99 float64)
		p99   bool
	}
	panels := []panel{
		{"TTFT (ms)", func(x ServeResult) (float64, float64) { return x.TTFT.Median, x.TTFT.P99 }, true},
		{"ITL (ms)", func(x ServeResult) (float64, float64) { return x.ITL.Median, x.ITL.P99 }, true},
		{"E2EL (ms)", func(x ServeResult) (float64, float64) { return x.E2EL.Median, x.E2EL.P99 }, true},
		{"output tokens/s", func(x ServeResult) (float64, float64) { return x.OutputThroughput, 0 }, false},
	}
	cw, ch := width/cols, (height-top)/rows
	for k, pn := range panels {
		x0, y0 := float64(k%cols)*cw, top+float64(k/cols)*ch
		px, py, pw, ph := x0+pl, y0+pt, cw-pl-pr, ch-pt-pb
		hi := 0.0
		for _, x := range r.Runs {
			m, q := pn.get(x)
			hi = max(hi, m, q)
		}
		hi = niceCeil(hi)
		xAt := func(level int) float64 {
			i := slices.Index(levels, level)
			return px + pw*(float64(i)+0.5)/float64(len(levels))
		}
		yAt := func(v float64) float64 { return py + ph*(1-v/hi) }
		p(`<text x="%.1f" y="%.1f" font-size="13">%s</text>`+"\n", px, py-8, pn.title)
		ticks := 5 // hi is 1, 2 or 5 times a power of ten
		if lead := hi / math.Pow(10, math.Floor(math.Log10(hi))); lead > 1.5 && lead < 2.5 {
			ticks = 4
		}
		for i := 0; i <= ticks; i++ {
			v := hi * float64(i) / float64(ticks)
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", px, yAt(v), px+pw, yAt(v))
			p(`<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", px-5, yAt(v)+4, shortNum(v))
		}
		for _, l := range levels {
			p(`<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", xAt(l), py+ph+16, concText(l))
		}
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">concurrency</text>`+"\n", px+pw/2, py+ph+32)
		p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", px, py, pw, ph)
		for ti, t := range targets {
			c := serveColors[ti%len(serveColors)]
			for _, dashed := range []bool{false, true} {
				if dashed && !pn.p99 {
					continue
				}
				var pts []string
				for _, x := range r.Runs {
					if x.Target != t {
						continue
					}
					m, q := pn.get(x)
					v := m
					if dashed {
						v = q
					}
					xx, yy := xAt(x.MaxConcurrency), yAt(v)
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", xx, yy))
					p(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xx, yy, c)
				}
				dash := ""
				if dashed {
					dash = ` stroke-dasharray="6 4"`
				}
				if len(pts) > 1 {
					p(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", c, dash, strings.Join(pts, " "))
				}
			}
		}
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v ≤ 0).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	step := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*step >= v {
			return m * step
		}
	}
	return 10 * step
}

func shortNum(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 100 || v == 0:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.3g", v)
	}
	return fmt.Sprintf("%.2g", v)
}
