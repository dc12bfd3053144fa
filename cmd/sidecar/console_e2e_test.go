package main

// End-to-end tests of the operator console (issue 14) in a real headless
// Chromium (Debian's chromium, driven by chromedp): the sidecar binary with
// --admin-token, a person's clicks and keystrokes on /ui, and every change
// checked against the admin API afterwards. A screenshot of each page is
// kept in $KVSIDECAR_ARTIFACT_DIR, else out/console/ at the repository's
// root. Without Chromium the tests skip, or fail under
// KVSIDECAR_REQUIRE_BROWSER=1 (as .ci/run sets).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

const consoleToken = "console-test-token-0123456789"

// chromiumPath finds Chromium, or skips (fails under
// KVSIDECAR_REQUIRE_BROWSER=1).
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KVSIDECAR_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (apt-get install chromium, or set KVSIDECAR_CHROMIUM)"
	if os.Getenv("KVSIDECAR_REQUIRE_BROWSER") == "1" {
		t.Fatal(msg + "; KVSIDECAR_REQUIRE_BROWSER=1")
	}
	t.Skip(msg)
	return ""
}

// page is a headless Chromium tab on the console of a running sidecar.
type page struct {
	t         *testing.T
	ctx       context.Context
	base      string // http://addr
	artifacts string
	downloads string

	// mu protects the fields below, which the event listener fills.
	mu       sync.Mutex
	problems []string                     // console errors, exceptions, failed requests
	urls     map[network.RequestID]string // requests seen, by id
	favicon  int                          // responses to favicon requests
}

// watch records what a person would see as a fault in DevTools: console
// errors and assertions, uncaught exceptions, error entries of the
// browser's log (a resource that failed to load), responses of 400 and
// above and requests that failed. It runs in chromedp's event loop: it
// only records.
func (p *page) watch(ev any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch e := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range e.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			p.problems = append(p.problems, fmt.Sprintf("console.%s: %s", e.Type, strings.Join(args, " ")))
		}
	case *runtime.EventExceptionThrown:
		d := e.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		p.problems = append(p.problems, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber+1, msg))
	case *cdplog.EventEntryAdded:
		if e.Entry.Level == cdplog.EntryLevelError {
			p.problems = append(p.problems, fmt.Sprintf("log (%s): %s %s", e.Entry.Source, e.Entry.Text, e.Entry.URL))
		}
	case *network.EventRequestWillBeSent:
		if p.urls == nil {
			p.urls = map[network.RequestID]string{}
		}
		p.urls[e.RequestID] = e.Request.URL
	case *network.EventResponseReceived:
		if strings.Contains(e.Response.URL, "favicon") {
			p.favicon++
		}
		if e.Response.Status >= 400 {
			p.problems = append(p.problems, fmt.Sprintf("HTTP %d for %s", e.Response.Status, e.Response.URL))
		}
	case *network.EventLoadingFailed:
		if !e.Canceled {
			p.problems = append(p.problems, fmt.Sprintf("request for %s failed: %s", p.urls[e.RequestID], e.ErrorText))
		}
	}
}

// noProblems fails the test if the page showed a fault since the last
// call, and forgets those it saw.
func (p *page) noProblems(stage string) {
	p.t.Helper()
	p.mu.Lock()
	got := p.problems
	p.problems = nil
	p.mu.Unlock()
	if len(got) > 0 {
		p.shot("failed-" + p.t.Name())
		p.t.Fatalf("%s: the page showed %d faults:\n%s", stage, len(got), strings.Join(got, "\n"))
	}
}

// openConsole starts Chromium with a fresh profile and loads /ui/.
func openConsole(t *testing.T, addr string) *page {
	t.Helper()
	exe := chromiumPath(t)
	profile := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1440, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	})
	p := &page{t: t, ctx: ctx, base: "http://" + addr, downloads: t.TempDir()}
	p.artifacts = os.Getenv("KVSIDECAR_ARTIFACT_DIR")
	if p.artifacts == "" {
		p.artifacts = filepath.Join("..", "..", "out", "console")
	}
	if err := os.MkdirAll(p.artifacts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Listen(ctx, p.watch); err != nil {
		t.Fatalf("browser: %v", err)
	}
	p.do(chromedp.Navigate(p.base + "/ui/"))
	// The first load: the page, its scripts and styles, and the icon the
	// browser asks for once it loaded, with no fault.
	deadline := time.Now().Add(20 * time.Second)
	for {
		p.mu.Lock()
		icon := p.favicon
		p.mu.Unlock()
		if icon > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the browser never got an icon for the page")
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.do(chromedp.WaitVisible(chromedp.ID("login-form")))
	p.noProblems("first load")
	// Downloads (the exports) go to a folder the test reads.
	if _, err := cdp.Call(ctx, chromedp.FromContext(ctx).Browser, browser.SetDownloadBehavior,
		browser.SetDownloadBehaviorParams{Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: p.downloads}); err != nil {
		t.Fatalf("download folder: %v", err)
	}
	return p
}

func (p *page) do(actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, actions...); err != nil {
		p.shot("failed-" + p.t.Name())
		p.t.Fatalf("browser: %v", err)
	}
}

// eval runs JavaScript in the page and decodes its result into v.
func (p *page) eval(js string, v any) {
	p.t.Helper()
	raw, err := chromedp.Run(p.ctx, chromedp.Evaluate[json.RawMessage](js))
	if err != nil {
		p.t.Fatalf("evaluate %s: %v", js, err)
	}
	if v != nil {
		if err := json.Unmarshal(raw, v); err != nil {
			p.t.Fatalf("evaluate %s: %v in %s", js, err, raw)
		}
	}
}

// text is the text of the first element matching the CSS selector.
func (p *page) text(sel string) string {
	var s string
	p.eval(fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel), &s)
	return s
}

// waitText waits until the element's text holds want.
func (p *page) waitText(sel, want string) {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := p.text(sel)
		if strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			p.shot("failed-" + p.t.Name())
			p.t.Fatalf("%s says %q, want it to hold %q", sel, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitCount waits until n elements match the CSS selector.
func (p *page) waitCount(sel string, n int) {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got int
		p.eval(fmt.Sprintf(`document.querySelectorAll(%q).length`, sel), &got)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			p.shot("failed-" + p.t.Name())
			p.t.Fatalf("%d elements match %s, want %d", got, sel, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// choose picks an option of a <select> as a person does: the value
// changes and the page hears a change event.
func (p *page) choose(sel, value string) {
	p.t.Helper()
	var ok bool
	p.eval(fmt.Sprintf(`(() => { const s = document.querySelector(%q);
		if (![...s.options].some(o => o.value === %q)) return false;
		s.value = %q; s.dispatchEvent(new Event("change", {bubbles: true})); return true; })()`, sel, value, value), &ok)
	if !ok {
		p.t.Fatalf("%s has no option %q", sel, value)
	}
}

// typeInto replaces an input's text with keystrokes.
func (p *page) typeInto(sel, text string) {
	p.t.Helper()
	p.eval(fmt.Sprintf(`document.querySelector(%q).value = ""`, sel), nil)
	p.do(chromedp.SendKeys(chromedp.CSS(sel), text))
}

func (p *page) click(sel string) {
	p.t.Helper()
	p.do(chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible))
}

// shot saves a screenshot of the whole page as name.png.
func (p *page) shot(name string) {
	b, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(p.artifacts, strings.NewReplacer("/", "-", " ", "-").Replace(name)+".png")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	p.t.Logf("screenshot: %s", path)
}

// signIn types the admin token into the sign-in form.
func (p *page) signIn() {
	p.t.Helper()
	p.do(chromedp.WaitVisible(chromedp.ID("login-form")))
	p.shot("01-sign-in")
	p.typeInto("#token", consoleToken)
	p.click("#login-button")
	p.do(chromedp.WaitVisible(chromedp.ID("tabs")))
}

// waitDownload waits for a finished download named name and returns it.
func (p *page) waitDownload(name string) []byte {
	p.t.Helper()
	path := filepath.Join(p.downloads, name)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return b
		}
		if time.Now().After(deadline) {
			ents, _ := os.ReadDir(p.downloads)
			p.t.Fatalf("no download %s (folder holds %v)", name, ents)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// adminAPI calls the admin API and returns status and body.
func adminAPI(t *testing.T, addr, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+addr+"/admin/v1/"+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+consoleToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func adminGet(t *testing.T, addr, path string, v any) {
	t.Helper()
	code, b := adminAPI(t, addr, "GET", path, nil)
	if code != 200 {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

type apiMemory struct {
	ID, Session, Category, Content string
	Importance                     float64
}

// memoriesOf lists a session's memories through the API, by id.
func memoriesOf(t *testing.T, addr, tenant, session string) map[string]apiMemory {
	t.Helper()
	var r struct{ Data []apiMemory }
	adminGet(t, addr, "memories?tenant="+url.QueryEscape(tenant)+"&session="+url.QueryEscape(session), &r)
	out := map[string]apiMemory{}
	for _, m := range r.Data {
		out[m.ID] = m
	}
	return out
}

// tenantWith returns the tenant holding the session id.
func tenantWith(t *testing.T, addr, session string) string {
	t.Helper()
	var ts struct{ Data []struct{ Tenant string } }
	adminGet(t, addr, "tenants", &ts)
	for _, x := range ts.Data {
		var ss struct{ Data []struct{ ID string } }
		adminGet(t, addr, "sessions?tenant="+url.QueryEscape(x.Tenant), &ss)
		for _, s := range ss.Data {
			if s.ID == session {
				return x.Tenant
			}
		}
	}
	t.Fatalf("no tenant holds session %s", session)
	return ""
}
