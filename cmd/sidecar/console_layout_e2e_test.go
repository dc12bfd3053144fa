package main

// The console's look in a browser: a clean load, the plots' swatches, a
// narrow window (console_e2e_test.go holds the harness).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"
)

// fits checks, at the viewport's current size, that the page is no wider
// than the window; on failure it names the widest elements.
func (p *page) fits(stage string) {
	p.t.Helper()
	var r struct {
		Scroll, Inner int
		Wide          []string
	}
	p.eval(`(() => {
		const inner = window.innerWidth, wide = [];
		for (const el of document.querySelectorAll("body *")) {
			const b = el.getBoundingClientRect();
			if (b.width > 0 && b.right > inner + 0.5 && ![...el.children].some(c => c.getBoundingClientRect().right > inner + 0.5))
				wide.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + (el.className && typeof el.className === "string" ? "." + el.className.split(" ").join(".") : "") + " right=" + Math.round(b.right));
		}
		return {scroll: document.documentElement.scrollWidth, inner, wide: wide.slice(0, 12)};
	})()`, &r)
	if r.Scroll > r.Inner {
		p.shot("failed-" + p.t.Name())
		p.t.Fatalf("%s: the page is %d px wide in a window of %d px; widest elements: %v", stage, r.Scroll, r.Inner, r.Wide)
	}
}

// swatch is one legend entry of a plot: its series name and colour, and
// the colour of the line drawn for it.
type swatch struct {
	Plot, Name, Color, Line string
}

// swatches reads every plot's legend on the KV page.
func (p *page) swatches() []swatch {
	var out []swatch
	p.eval(`[...document.querySelectorAll("#page-kv .plot")].flatMap(plot =>
		[...plot.querySelectorAll(".legend span")].map(s => {
			const name = s.dataset.series, path = [...plot.querySelectorAll("svg path[data-series]")].find(x => x.dataset.series === name);
			const rgb = c => { const d = document.createElement("i"); d.style.color = c; document.body.appendChild(d); const v = getComputedStyle(d).color; d.remove(); return v; };
			return {plot: plot.id, name, color: getComputedStyle(s.querySelector("i")).backgroundColor, line: path ? rgb(path.getAttribute("stroke")) : ""};
		}))`, &out)
	return out
}

// distinctSwatches checks the KV page's legends: every series has a
// swatch of the colour of its line, far from every other swatch's colour
// on the page (within a plot and across plots), and at least minLines
// series have lines.
func (p *page) distinctSwatches(minLines int) {
	p.t.Helper()
	sw := p.swatches()
	if len(sw) < 9 {
		p.t.Fatalf("the KV page's legends: %+v", sw)
	}
	lines := 0
	for i, a := range sw {
		if a.Line != "" { // a series with no value yet has no line
			lines++
			if a.Line != a.Color {
				p.t.Errorf("%s %q: swatch %s, line %s", a.Plot, a.Name, a.Color, a.Line)
			}
		}
		for _, b := range sw[i+1:] {
			if d := rgbDistance(a.Color, b.Color); d < 60 {
				p.t.Errorf("%s %q (%s) and %s %q (%s) share a swatch colour (distance %.0f)", a.Plot, a.Name, a.Color, b.Plot, b.Name, b.Color, d)
			}
		}
	}
	if lines < minLines {
		p.t.Errorf("only %d of the KV page's series have lines: %+v", lines, sw)
	}
}

// rgbDistance is the Euclidean distance of two "rgb(r, g, b)" colours.
func rgbDistance(a, b string) float64 {
	var r1, g1, b1, r2, g2, b2 float64
	fmt.Sscanf(a, "rgb(%f, %f, %f)", &r1, &g1, &b1)
	fmt.Sscanf(b, "rgb(%f, %f, %f)", &r2, &g2, &b2)
	return math.Sqrt((r1-r2)*(r1-r2) + (g1-g2)*(g1-g2) + (b1-b2)*(b1-b2))
}

// TestConsoleCleanLoadSwatchesAndNarrowWindowInBrowser (issue 24, the
// held-out browser check): the first load shows no console error or
// failed request (the page has its icon), nor does signing in or any tab;
// every series the KV page plots has a swatch of its own colour, told
// apart from every other on the page and matching its line; at 400 px no
// page is wider than the window; and the KV page marks the breached alert
// threshold (an archive holding incompressible bytes) as the admin API
// judges it.
func TestConsoleCleanLoadSwatchesAndNarrowWindowInBrowser(t *testing.T) {
	chromiumPath(t)
	up := newScriptedUpstream(t)
	sc := startChild(t, nil, "--upstream", up.URL, "--admin-token", consoleToken, "--console-sample-every", "250ms")
	post := func(method, path, key string, body []byte, header ...string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+sc.addr+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
	for i, text := range []string{"I plan a long walk along the Kumano Kodo trail in late October with a friend.",
		"We want to stay in small guesthouses and carry light packs.", "Which stretch should we start with?"} {
		body, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": []map[string]string{{"role": "user", "content": text}}})
		post("POST", "/v1/chat/completions", "sk-narrow", body, "X-Session-ID", "walk-"+strconv.Itoa(i%2), "X-User-ID", "dana",
			"Content-Type", "application/json")
	}
	// Incompressible bytes in the Archive: its compression saves nothing.
	noise := make([]byte, 256<<10)
	_, _ = rand.NewChaCha8([32]byte{24}).Read(noise)
	post("PUT", "/v1/kv/narrow/blob", "sk-narrow", noise, "Content-Type", "application/octet-stream")

	p := openConsole(t, sc.admin) // no fault on the first load, and an icon
	p.do(chromedp.EmulateViewport(400, 900))
	p.fits("sign-in page at 400 px")
	p.signIn()
	p.noProblems("sign in")
	tenant := tenantWith(t, sc.admin, "walk-0")
	p.choose("#tenant", tenant)

	p.click("#tab-sessions")
	p.waitCount("#sessions-table tbody tr", 2)
	p.click(`#sessions-table tr[data-session="walk-0"]`)
	p.waitText("#session-title", "walk-0")
	p.waitCount("#messages-table tbody tr", 4)
	p.fits("sessions page at 400 px")
	p.shot("07-sessions-400px")
	p.click("#tab-memories")
	p.do(chromedp.WaitVisible(chromedp.ID("page-memories")))
	p.waitText("#memories-count", "(")
	p.fits("memories page at 400 px")
	p.shot("08-memories-400px")
	p.click("#tab-knowledge")
	p.do(chromedp.WaitVisible(chromedp.ID("page-knowledge")))
	p.fits("knowledge page at 400 px")
	p.click("#tab-kv")
	p.do(chromedp.WaitVisible(chromedp.ID("page-kv")))
	p.waitCount("#plot-hitrate svg", 1)
	p.waitCount("#plot-tokens svg", 1)
	p.waitCount("#plot-tiers svg", 1)
	p.waitCount("#thresholds-table tbody tr", 7)
	p.fits("KV page at 400 px")
	p.shot("09-kv-400px")
	// Without --resp-listen the RESP page says the listener is off.
	p.click("#tab-resp")
	p.do(chromedp.WaitVisible(chromedp.ID("resp-off")))
	p.waitText("#resp-off", "--resp-listen")
	p.fits("RESP page (off) at 400 px")
	p.click("#tab-kv")
	p.do(chromedp.WaitVisible(chromedp.ID("page-kv")))
	p.noProblems("every tab at 400 px")

	// The thresholds as the API judges them, marked on the page.
	var v struct {
		Thresholds []struct {
			Alert           string
			Known, Breached bool
		}
	}
	adminGet(t, sc.admin, "kv", &v)
	breached := 0
	for _, th := range v.Thresholds {
		want := "ok"
		switch {
		case th.Breached:
			want, breached = "breached", breached+1
		case !th.Known:
			want = "unknown"
		}
		row := fmt.Sprintf(`#thresholds-table tr[data-alert=%q]`, th.Alert)
		var state string
		p.eval(fmt.Sprintf(`(document.querySelector(%q) || {dataset: {}}).dataset.state || ""`, row), &state)
		if state != want {
			t.Errorf("threshold %s: the page marks it %q, the API says %q", th.Alert, state, want)
		}
		if th.Alert == "KVSidecarArchiveCompressionLow" && !th.Breached {
			t.Errorf("an archive of incompressible bytes is not a breached compression threshold: %+v", th)
		}
		if th.Alert == "KVSidecarContextWindowFull" && (!th.Known || th.Breached) {
			t.Errorf("three short turns judged %+v", th)
		}
	}
	p.waitText("#card-thresholds .v", fmt.Sprintf("%d breached", breached))
	var breachedStyle struct{ Color, Tab string }
	p.eval(`({color: getComputedStyle(document.querySelector('#thresholds-table tr[data-state="breached"] td.state')).color,
		tab: document.getElementById("tab-kv").dataset.alerts || ""})`, &breachedStyle)
	if breachedStyle.Color != "rgb(192, 57, 43)" || breachedStyle.Tab != strconv.Itoa(breached) {
		t.Errorf("a breached threshold is not marked (state colour %s, KV tab says %q)", breachedStyle.Color, breachedStyle.Tab)
	}

	// Swatches: one colour per series, distinct within a plot and across
	// the page, and the colour of the series' line.
	p.do(chromedp.EmulateViewport(1440, 1000))
	p.waitCount("#plot-hitrate .legend span", 3)
	p.waitCount("#plot-tokens .legend span", 3)
	p.distinctSwatches(6)
	p.shot("10-kv-swatches")
	p.noProblems("KV page")
}
