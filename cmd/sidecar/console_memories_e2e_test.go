package main

// The console's memories and sessions pages in a browser (console_e2e_test.go
// holds the harness).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

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
