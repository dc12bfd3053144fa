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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
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

// TestConsoleManagesMemoriesInBrowser: a person signs in, reads a
// session's window and recall, and in the memories table edits a row, adds
// a memory, deletes one, batch-deletes a list that holds core and system
// memories (skipped), exports the statistics, and reads a user's triple
// (extracted through the scripted upstream) in the knowledge panel; the
// API agrees after each step.
func TestConsoleManagesMemoriesInBrowser(t *testing.T) {
	chromiumPath(t) // skip early, before starting anything
	up := newScriptedUpstream(t)
	// Extraction runs through the scripted upstream: bob's sourdough
	// session (six messages, one extraction job) gets one fact and one
	// triple; every other background call changes nothing.
	var served atomic.Bool
	up.bg = func(prompt string) string {
		if strings.Contains(prompt, "Known facts:") && strings.Contains(prompt, "sourdough") && served.CompareAndSwap(false, true) {
			return "[ADD] Bob bakes sourdough bread every Sunday.\n[TRIPLE] Bob | bakes | sourdough bread | +1"
		}
		return "[SKIP]"
	}
	sc := startChild(t, nil, "--upstream", up.URL, "--admin-token", consoleToken, "--console-sample-every", "250ms")
	ctx := context.Background()
	chat := func(key, session, user, text string) {
		t.Helper()
		c := openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}},
			option.WithHeader("X-Session-ID", session), option.WithHeader("X-User-ID", user))
		if err != nil {
			t.Fatalf("chat %s: %v", session, err)
		}
	}
	chat("sk-other-team", "their-session", "carol", "Nothing to see here.")
	chat("sk-console", "recipes", "bob", "I bake sourdough every Sunday.")
	chat("sk-console", "recipes", "bob", "My starter lives in the fridge.")
	chat("sk-console", "recipes", "bob", "Rye flour gives it a tang.")
	chat("sk-console", "trip-planning", "alice", "I want to plan a trip to Kyoto in April.")
	tenant := tenantWith(t, sc.admin, "trip-planning")
	q := "?tenant=" + url.QueryEscape(tenant) + "&session=trip-planning"
	add := func(category, text string, importance float64) string {
		t.Helper()
		code, b := adminAPI(t, sc.admin, "POST", "memories"+q, map[string]any{"category": category, "text": text, "importance": importance})
		var m apiMemory
		if code != 201 || json.Unmarshal(b, &m) != nil {
			t.Fatalf("add: %d %s", code, b)
		}
		return m.ID
	}
	factKyoto := add("fact", "Alice plans a trip to Kyoto in April.", 1.2)
	factBudget := add("fact", "Alice's budget is 2000 euros.", 0.9)
	core := add("core", "Alice is vegetarian.", 1)
	system := add("system", "Answer in a friendly, concise tone.", 1)
	episode := add("episode", "Alice compared flights on Tuesday.", 0.7)
	chat("sk-console", "trip-planning", "alice", "Which temples should I see in Kyoto?")

	p := openConsole(t, sc.admin)
	p.signIn()
	p.choose("#tenant", tenant)

	// Sessions: the session's window and recall.
	p.click("#tab-sessions")
	p.waitCount("#sessions-table tbody tr", 2)
	p.click(`#sessions-table tr[data-session="trip-planning"]`)
	p.waitText("#session-title", "trip-planning")
	p.waitText("#session-window", "tokens")
	p.waitText("#session-window", "Alice is vegetarian.") // the pinned memory in the stable block
	p.waitCount("#messages-table tbody tr", 4)
	p.shot("02-sessions")

	// Memories: the table.
	p.click("#tab-memories")
	p.choose("#memory-scope", "s:trip-planning")
	p.waitCount("#memories-table tbody tr", 5)
	p.shot("03-memories")

	// Edit: select the row, change text and importance, save.
	p.click(fmt.Sprintf(`#memories-table tr[data-id=%q] td.text`, factKyoto))
	p.do(chromedp.WaitVisible(chromedp.ID("edit-form")))
	p.waitText("#edit-id", factKyoto)
	p.typeInto("#edit-text", "Alice plans a trip to Kyoto and Osaka in April.")
	p.typeInto("#edit-importance", "2.6")
	p.click("#edit-save")
	p.waitText("#toast", "Saved "+factKyoto)
	p.waitText(fmt.Sprintf(`#memories-table tr[data-id=%q]`, factKyoto), "Osaka")
	if m := memoriesOf(t, sc.admin, tenant, "trip-planning")[factKyoto]; m.Content != "Alice plans a trip to Kyoto and Osaka in April." || m.Importance != 2.6 {
		t.Fatalf("after the edit the API has %+v", m)
	}

	// Add: a memory with its category.
	p.choose("#add-session", "trip-planning")
	p.choose("#add-category", "episode")
	p.typeInto("#add-text", "Alice booked a ryokan near Gion.")
	p.typeInto("#add-importance", "0.8")
	p.click("#add-button")
	p.waitText("#toast", "Added ")
	p.waitCount("#memories-table tbody tr", 6)
	var addedID string
	for id, m := range memoriesOf(t, sc.admin, tenant, "trip-planning") {
		if m.Content == "Alice booked a ryokan near Gion." {
			addedID = id
			if m.Category != "episode" || m.Importance != 0.8 {
				t.Fatalf("added memory in the API: %+v", m)
			}
		}
	}
	if addedID == "" {
		t.Fatal("the added memory is not in the API")
	}

	// Delete: select the new row, delete (the button asks for a second click).
	p.click(fmt.Sprintf(`#memories-table tr[data-id=%q] td.text`, addedID))
	p.waitText("#edit-id", addedID)
	p.click("#edit-delete")
	p.waitText("#edit-delete", "Click again")
	p.click("#edit-delete")
	p.waitText("#toast", "Deleted "+addedID)
	p.waitCount("#memories-table tbody tr", 5)
	p.do(chromedp.WaitNotVisible(chromedp.ID("edit-form"))) // nothing left to edit
	if _, ok := memoriesOf(t, sc.admin, tenant, "trip-planning")[addedID]; ok {
		t.Fatal("the deleted memory is still in the API")
	}

	// Batch delete: a list with core and system memories in it.
	p.typeInto("#batch-ids", strings.Join([]string{factBudget, core, system, episode}, ", "))
	p.click("#batch-delete")
	p.click("#batch-delete")
	p.waitText("#batch-deleted", "Deleted 2")
	p.waitText("#batch-skipped", "Skipped 2")
	p.waitCount("#memories-table tbody tr", 3)
	p.shot("04-memories-after-batch-delete")
	left := memoriesOf(t, sc.admin, tenant, "trip-planning")
	if _, ok := left[core]; !ok {
		t.Fatal("batch delete removed the core memory")
	}
	if _, ok := left[system]; !ok {
		t.Fatal("batch delete removed the system memory")
	}
	if _, ok := left[factBudget]; ok {
		t.Fatal("batch delete left a listed fact")
	}
	if _, ok := left[episode]; ok {
		t.Fatal("batch delete left a listed episode")
	}
	if len(left) != 3 {
		t.Fatalf("after batch delete the API has %v", left)
	}

	// Statistics and their export: the downloads are what the API serves.
	p.waitText(`#stats-table tr[data-category="fact"]`, "fact1")
	p.click("#export-stats-csv")
	csvFile := p.waitDownload("memory-stats.csv")
	code, want := adminAPI(t, sc.admin, "GET", "stats"+q+"&format=csv", nil)
	if code != 200 || !bytes.Equal(csvFile, want) {
		t.Fatalf("exported CSV differs from the API's:\n%s\nAPI (%d):\n%s", csvFile, code, want)
	}
	if !strings.HasPrefix(string(csvFile), "category,count,") || !strings.Contains(string(csvFile), "\ncore,1,") || !strings.Contains(string(csvFile), "\nfact,1,") {
		t.Fatalf("exported CSV: %s", csvFile)
	}
	p.click("#export-stats-json")
	jsonFile := p.waitDownload("memory-stats.json")
	var stats []struct {
		Category string
		Count    int
	}
	if err := json.Unmarshal(jsonFile, &stats); err != nil || len(stats) != 4 {
		t.Fatalf("exported JSON: %v %s", err, jsonFile)
	}
	p.click("#export-memories-csv")
	memCSV := p.waitDownload("memories.csv")
	if _, want := adminAPI(t, sc.admin, "GET", "memories"+q+"&format=csv", nil); !bytes.Equal(memCSV, want) {
		t.Fatalf("exported memories differ from the API's:\n%s\n%s", memCSV, want)
	}

	// Knowledge: bob's triple, as the API lists it.
	var ss struct{ Data []struct{ ID, User string } }
	adminGet(t, sc.admin, "sessions?tenant="+url.QueryEscape(tenant), &ss)
	bob := ""
	for _, x := range ss.Data {
		if x.ID == "recipes" {
			bob = x.User
		}
	}
	var kb struct{ Data []apiTriple }
	waitUntil(t, func() bool {
		adminGet(t, sc.admin, "triples?tenant="+url.QueryEscape(tenant)+"&user="+url.QueryEscape(bob), &kb)
		return len(kb.Data) > 0
	})
	tr := kb.Data[0]
	if len(kb.Data) != 1 || tr.Subject != "Bob" || tr.Predicate != "bakes" || tr.Object != "sourdough bread" || len(tr.Support) != 1 {
		t.Fatalf("bob's triples in the API: %+v", kb.Data)
	}
	if m, ok := memoriesOf(t, sc.admin, tenant, "recipes")[tr.Support[0]]; !ok || m.Content != "Bob bakes sourdough bread every Sunday." {
		t.Fatalf("the triple's support %s is not bob's fact: %+v", tr.Support[0], m)
	}
	p.click("#tab-knowledge")
	p.do(chromedp.WaitVisible(chromedp.ID("page-knowledge")))
	p.choose("#user", "="+bob)
	p.waitCount("#triples-table tbody tr", 1)
	row := fmt.Sprintf(`#triples-table tr[data-id=%q]`, tr.ID)
	for i, want := range []string{tr.Subject, tr.Predicate, tr.Object, tr.Support[0]} {
		if got := p.text(fmt.Sprintf("%s td:nth-child(%d)", row, i+1)); got != want {
			t.Fatalf("triples panel column %d says %q, the API %q", i+1, got, want)
		}
	}
	p.waitText("#triples-count", "(1 for ")
	p.shot("05-knowledge")
	p.choose("#user", "*")

	// The other tenant's session never shows under this tenant.
	p.click("#tab-sessions")
	p.waitCount("#sessions-table tbody tr", 2)
	var ids []string
	p.eval(`[...document.querySelectorAll("#sessions-table tbody tr")].map(r => r.dataset.session)`, &ids)
	for _, id := range ids {
		if id == "their-session" {
			t.Fatalf("another tenant's session listed: %v", ids)
		}
	}
}

// TestConsoleKVViewInBrowser: the KV page of a sidecar in front of a real
// llama-server (three conversations over one slot, so states are saved,
// evicted and restored) shows the hit rate, tiers, engine states and
// tokens not reprocessed that the API reports, and plots them.
func TestConsoleKVViewInBrowser(t *testing.T) {
	chromiumPath(t)
	llama := llamatest.Start(t, llamaserver.Options{Model: llamatest.Model(t), Slots: 1, CacheRAMMiB: -1, Threads: 1,
		Args: []string{"--n-predict", "128"}})
	s := &realStack{t: t, llama: llama, dataDir: t.TempDir(), log: filepath.Join(t.TempDir(), "sidecar.log")}
	s.args = []string{"--upstream", llama.URL(), "--data-dir", s.dataDir, "--engine", "llamacpp",
		"--llamacpp-slot-dir", llama.SlotDir(), "--llamacpp-slots", "1", "--extract=false",
		"--admin-token", consoleToken, "--console-sample-every", "250ms"}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(s.log)
			t.Logf("sidecar log ends:\n%s", tail(string(b), 4000))
		}
	})
	s.startSidecar()
	var cs []*convo
	for i := range 3 {
		doc, _ := realDoc(t, llama, 40+i, 400)
		cs = append(cs, newConvo(fmt.Sprintf("kv-view-%d", i), doc))
	}
	for round := range 2 {
		for _, c := range cs {
			s.say(c, "Item "+strconv.Itoa(round+1)+"?")
		}
	}
	s.waitIdle()

	p := openConsole(t, s.sc.admin)
	p.signIn()
	p.click("#tab-kv")
	p.do(chromedp.WaitVisible(chromedp.ID("page-kv")))
	p.waitCount("#plot-hitrate svg", 1)
	p.waitCount("#plot-tiers svg path", 3) // one line per tier
	p.waitCount("#plot-tokens svg path", 3)

	var v struct {
		KV struct {
			Hits, Misses int64
			HitRate      float64 `json:"hit_rate"`
			Tiers        []struct {
				Tier    string
				Entries int
			}
		}
		Engine struct {
			Restores int64
			States   int
			Timings  struct {
				CacheN int64 `json:"cache_n"`
			}
		}
	}
	adminGet(t, s.sc.admin, "kv", &v)
	if v.KV.Hits == 0 || v.Engine.Restores == 0 {
		t.Fatalf("three sessions over one slot restored nothing: %+v", v)
	}
	p.waitText("#card-hitrate .v", fmt.Sprintf("%.1f%%", 100*v.KV.HitRate))
	p.waitText("#card-hitrate .s", fmt.Sprintf("%d hits, %d misses", v.KV.Hits, v.KV.Misses))
	p.waitText("#card-reused .v", thousands(v.Engine.Timings.CacheN))
	for _, tr := range v.KV.Tiers {
		p.waitText(fmt.Sprintf(`#tiers-table tr[data-tier=%q] td:nth-child(2)`, tr.Tier), thousands(int64(tr.Entries)))
	}
	p.waitText("#engine-facts", fmt.Sprintf("%d (", v.Engine.States))
	p.waitCount("#plot-hitrate svg path", 3) // every series has values
	p.distinctSwatches(9)
	var th struct{ Thresholds []map[string]any }
	adminGet(t, s.sc.admin, "kv", &th)
	for _, x := range th.Thresholds {
		t.Logf("threshold %v: known %v, value %.4g (limit %v), breached %v", x["alert"], x["known"], x["value"], x["limit"], x["breached"])
	}
	p.shot("06-kv")
	p.noProblems("KV page")
}

// thousands formats n as the page does (en-US grouping).
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

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

// TestConsoleRESPViewInBrowser (issue 34): with --resp-listen, two go-redis
// clients write, read and miss keys (one of them past its --resp-quota:
// an eviction, and a value over the whole quota refused), and the console's
// RESP page shows, for the tenant picked above — the API key's tenant, the
// same hash as the RESP password's — its hit ratio, keys, bytes by tier,
// evictions and quota refusals as the admin API reports them, the store's
// connections, commands and load/compute figures, and every tenant in a
// table whose rows pick the tenant; at 400 px it fits the window.
func TestConsoleRESPViewInBrowser(t *testing.T) {
	chromiumPath(t)
	up := newScriptedUpstream(t)
	respAddr := freePort(t)
	const quota = 100_000
	sc := startChild(t, nil, "--upstream", up.URL, "--admin-token", consoleToken, "--console-sample-every", "250ms",
		"--resp-listen", respAddr, "--resp-quota", strconv.Itoa(quota))
	ctx := context.Background()
	c := openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey("sk-resp"), option.WithMaxRetries(0))
	if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Keep my KV, please.")}},
		option.WithHeader("X-Session-ID", "resp-owner")); err != nil {
		t.Fatal(err)
	}
	tenant := tenantWith(t, sc.admin, "resp-owner")
	sum := sha256.Sum256([]byte("sk-resp"))
	if want := "t_" + hex.EncodeToString(sum[:8]); tenant != want {
		t.Fatalf("the API key's tenant is %s, want %s (the hash RESP's AUTH names too)", tenant, want)
	}

	a := redis.NewClient(&redis.Options{Addr: respAddr, Password: "sk-resp", MaxRetries: -1})
	defer a.Close()
	other := redis.NewClient(&redis.Options{Addr: respAddr, Password: "sk-other-team", MaxRetries: -1})
	defer other.Close()
	val := func(c byte) []byte { return bytes.Repeat([]byte{c}, 30_000) }
	for _, k := range []string{"model@00000000@0@aa", "model@00000000@0@bb", "model@00000000@0@cc"} {
		if err := a.Set(ctx, k, val(k[len(k)-1]), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if got, err := a.Get(ctx, "model@00000000@0@aa").Bytes(); err != nil || !bytes.Equal(got, val('a')) {
			t.Fatalf("GET: %d bytes, %v", len(got), err)
		}
	}
	if err := a.Get(ctx, "model@00000000@0@dd").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET of a key never set: %v", err)
	}
	if err := a.Set(ctx, "model@00000000@0@dd", val('d'), 0).Err(); err != nil { // past the quota: one key evicted
		t.Fatal(err)
	}
	if err := a.Set(ctx, "model@00000000@0@ee", bytes.Repeat([]byte{'e'}, quota+1), 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a value larger than the whole quota: %v, want OOM", err)
	}
	if err := other.Set(ctx, "model@00000000@0@aa", "theirs", 0).Err(); err != nil {
		t.Fatal(err)
	}
	otherTenant := ""

	type respTenant struct {
		Tenant                  string
		Keys                    int
		Bytes                   int64
		TierBytes               map[string]int64 `json:"tier_bytes"`
		Hits, Misses, Evictions int64
		HitRatio                *float64 `json:"hit_ratio"`
		QuotaRefusals           int64    `json:"quota_refusals"`
		Quota                   int64
	}
	var v struct {
		Enabled     bool
		Connections int64
		Commands    map[string]int64
		Tenant      *respTenant
		Tenants     []respTenant
	}
	adminGet(t, sc.admin, "resp?tenant="+url.QueryEscape(tenant), &v)
	x := v.Tenant
	if !v.Enabled || x == nil || x.Hits != 2 || x.Misses != 1 || x.Keys != 3 || x.Bytes != 90_000 || x.Evictions != 1 || x.QuotaRefusals != 1 ||
		x.Quota != quota || len(v.Tenants) != 2 {
		t.Fatalf("the RESP view of %s: %+v (tenants %+v)", tenant, x, v.Tenants)
	}
	for _, y := range v.Tenants {
		if y.Tenant != tenant {
			otherTenant = y.Tenant
		}
	}

	p := openConsole(t, sc.admin)
	p.signIn()
	p.choose("#tenant", tenant)
	var label string
	p.eval(fmt.Sprintf(`document.querySelector('#tenant option[value=%q]').textContent`, tenant), &label)
	if !strings.Contains(label, "1 sessions") || !strings.Contains(label, "3 RESP keys") {
		t.Fatalf("the tenant picker says %q", label)
	}
	p.click("#tab-resp")
	p.do(chromedp.WaitVisible(chromedp.ID("resp-on")))
	p.waitText("#resp-tenant-name", tenant)
	p.waitText("#resp-card-hitratio .v", fmt.Sprintf("%.1f%%", 100**x.HitRatio))
	p.waitText("#resp-card-hitratio .s", fmt.Sprintf("%d hits, %d misses", x.Hits, x.Misses))
	p.waitText("#resp-card-keys .v", strconv.Itoa(x.Keys))
	p.waitText("#resp-card-evictions .v", strconv.FormatInt(x.Evictions, 10))
	p.waitText("#resp-card-quota .v", "97.7 KiB")
	p.waitText("#resp-card-quota .s", "1 SETs refused")
	p.waitText(`#resp-tenant-tiers .legend span[data-tier="working"]`, fmt.Sprintf("RAM (working) %.1f KiB", float64(x.TierBytes["working"])/1024))
	if x.TierBytes["working"] != 90_000 {
		t.Fatalf("the tenant's bytes in RAM: %+v", x.TierBytes)
	}
	p.waitText("#resp-card-conns .v", strconv.FormatInt(v.Connections, 10))
	p.waitText(`#resp-commands tr[data-command="SET"] td:nth-child(2)`, strconv.FormatInt(v.Commands["SET"], 10))
	p.waitText("#resp-amortization", "1 misses followed by the SET")
	p.waitText("#resp-card-unsynced .s", "--resp-fsync background")
	p.waitCount("#resp-tenants-table tbody tr", 2)
	p.waitCount("#resp-tenants-table tbody tr.selected", 1)
	p.shot("11-resp")
	p.noProblems("RESP page")

	// A row of the tenants table picks that tenant, above and on the page.
	p.click(fmt.Sprintf(`#resp-tenants-table tr[data-tenant=%q]`, otherTenant))
	p.waitText("#resp-tenant-name", otherTenant)
	p.waitText("#resp-card-keys .v", "1")
	p.waitText("#resp-card-hitratio .v", "–")
	var picked string
	p.eval(`document.getElementById("tenant").value`, &picked)
	if picked != otherTenant {
		t.Fatalf("the picker shows %s after a click on %s's row", picked, otherTenant)
	}
	p.do(chromedp.EmulateViewport(400, 900))
	p.fits("RESP page at 400 px")
	p.shot("12-resp-400px")
	p.noProblems("RESP page, another tenant")
}
