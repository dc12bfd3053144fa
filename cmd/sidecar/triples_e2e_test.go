package main

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// tripleScript is the scripted model's one fact-extraction reply: two
// facts, two triples on them, and triple lines that must change nothing.
var tripleScript = strings.Join([]string{
	"[ADD] He adores the red ball.",
	"[ADD] The user walks the dog at dawn.",
	"[TRIPLE] Rex | favourite toy | red ball | +1",
	"[TRIPLE] Rex | walked at | dawn | +2, +1",
	"[TRIPLE] broken | line",                  // malformed
	"[TRIPLE] Rex | owner | user | fact-999",  // not a fact of the prompt
	"[TRIPLE] Rex | likes | cats | +3",        // no third [ADD]
	"[TRIPLE] Rex | hates | \u202ebaths | +1", // hostile
	"[ADD] smuggled [TRIPLE] a | b | c | +1",  // a triple inside a fact
}, "\n")

type apiTriple struct {
	ID, Subject, Predicate, Object string
	Support                        []string
}

// TestTriplesThroughTheProxy: a scripted upstream answers the sidecar's
// extraction call with fixed facts and triples (malformed ones too); the
// valid triples appear in /admin/v1/triples and nothing else changes; a
// question naming a linked entity recalls the supporting fact through the
// graph, in its session and in a new session of the same user; deleting
// the fact through the admin API cascades to its triple and takes it out
// of the other session's recall; a triple is deleted through the API;
// another tenant sees none of it.
func TestTriplesThroughTheProxy(t *testing.T) {
	up := newScriptedUpstream(t)
	var served atomic.Bool
	up.bg = func(prompt string) string {
		if strings.Contains(prompt, "Known facts:") && served.CompareAndSwap(false, true) {
			return tripleScript
		}
		return "[SKIP]"
	}
	sc := startChild(t, nil, "--upstream", up.URL, "--admin-token", consoleToken, "--recall-share", "0.15")
	ctx := context.Background()
	clientIn := func(key, session string) openai.Client {
		return openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey(key),
			option.WithHeader("X-Session-ID", session), option.WithHeader("X-User-ID", "ada"), option.WithMaxRetries(0))
	}
	client := func(key string) openai.Client { return clientIn(key, "dog") }
	send := func(c openai.Client, text string) string {
		t.Helper()
		if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}}); err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		return string(up.prompts[len(up.prompts)-1])
	}
	ada := client("sk-ada")
	for _, m := range []string{"My terrier Rex has a favourite thing to chase.", "We go out early.", "He is three years old."} {
		send(ada, m)
	}
	tenant := tenantWith(t, sc.admin, "dog")
	var ss struct{ Data []struct{ ID, User string } }
	adminGet(t, sc.admin, "sessions?tenant="+url.QueryEscape(tenant), &ss)
	if len(ss.Data) != 1 {
		t.Fatalf("sessions %+v", ss.Data)
	}
	user := ss.Data[0].User
	triples := func(tenant string) map[string]apiTriple {
		t.Helper()
		var r struct {
			Data      []apiTriple
			Available bool
		}
		adminGet(t, sc.admin, "triples?tenant="+url.QueryEscape(tenant)+"&user="+url.QueryEscape(user), &r)
		if !r.Available {
			t.Fatal("the console has no knowledge base")
		}
		out := map[string]apiTriple{}
		for _, x := range r.Data {
			out[x.Subject+"|"+x.Predicate+"|"+x.Object] = x
		}
		return out
	}
	var kb map[string]apiTriple
	waitUntil(t, func() bool { kb = triples(tenant); return len(kb) > 0 })
	mems := memoriesOf(t, sc.admin, tenant, "dog")
	var ball, dawn string
	for id, m := range mems {
		switch m.Content {
		case "He adores the red ball.":
			ball = id
		case "The user walks the dog at dawn.":
			dawn = id
		default:
			t.Fatalf("unexpected memory %+v", m)
		}
	}
	toy, walk := kb["Rex|favourite toy|red ball"], kb["Rex|walked at|dawn"]
	if len(kb) != 2 || ball == "" || dawn == "" || !slices.Equal(toy.Support, []string{ball}) || !slices.Equal(walk.Support, slices.Sorted(slices.Values([]string{ball, dawn}))) {
		t.Fatalf("triples %+v, memories %+v", kb, mems)
	}

	if m := scrape(t, sc.admin); m["sidecar_memory_triples_total"] != 2 || m["sidecar_memory_triples_rejected_total"] != 4 || m["sidecar_memory_fact_ops_rejected_total"] != 1 {
		t.Fatalf("metrics: %v triples, %v rejected, %v fact ops rejected", m["sidecar_memory_triples_total"], m["sidecar_memory_triples_rejected_total"], m["sidecar_memory_fact_ops_rejected_total"])
	}

	// The question shares no word with the fact; the graph links them.
	if p := send(ada, "What is Rex's favourite toy?"); !strings.Contains(p, "He adores the red ball.") {
		t.Fatalf("the supporting fact is not recalled: %s", p)
	}

	// A new session of the same user reaches it through the user's graph.
	if p := send(clientIn("sk-ada", "park"), "What is Rex's favourite toy?"); !strings.Contains(p, "He adores the red ball.") {
		t.Fatalf("a new session of the user does not recall the supporting fact: %s", p)
	}

	// Another tenant (API key) with the same session and user sees nothing.
	send(client("sk-eve"), "Hello there.")
	var tenants struct{ Data []struct{ Tenant string } }
	adminGet(t, sc.admin, "tenants", &tenants)
	if len(tenants.Data) != 2 {
		t.Fatalf("tenants %+v", tenants.Data)
	}
	for _, x := range tenants.Data {
		if x.Tenant == tenant {
			continue
		}
		if got := triples(x.Tenant); len(got) != 0 {
			t.Fatalf("tenant %s sees %+v", x.Tenant, got)
		}
		if code, b := adminAPI(t, sc.admin, "DELETE", "triples/"+url.PathEscape(walk.ID)+"?tenant="+url.QueryEscape(x.Tenant)+"&user="+url.QueryEscape(user), nil); code != 404 {
			t.Fatalf("delete from another tenant: %d %s", code, b)
		}
	}

	// Deleting the ball fact cascades: the toy triple goes, the walk
	// triple keeps the dawn fact.
	if code, b := adminAPI(t, sc.admin, "DELETE", "memories/"+url.PathEscape(ball)+"?tenant="+url.QueryEscape(tenant)+"&session=dog", nil); code != 200 {
		t.Fatalf("delete memory: %d %s", code, b)
	}
	kb = triples(tenant)
	if len(kb) != 1 || !slices.Equal(kb["Rex|walked at|dawn"].Support, []string{dawn}) {
		t.Fatalf("after the cascade: %+v", kb)
	}
	waitUntil(t, func() bool {
		return !strings.Contains(send(clientIn("sk-ada", "park"), "What is Rex's favourite toy?"), "He adores the red ball.")
	})
	// An operator deletes the last one.
	path := "triples/" + url.PathEscape(walk.ID) + "?tenant=" + url.QueryEscape(tenant) + "&user=" + url.QueryEscape(user)
	if code, b := adminAPI(t, sc.admin, "DELETE", path, nil); code != 200 {
		t.Fatalf("delete triple: %d %s", code, b)
	}
	if code, _ := adminAPI(t, sc.admin, "DELETE", path, nil); code != 404 {
		t.Fatalf("second delete: %d", code)
	}
	if kb = triples(tenant); len(kb) != 0 {
		t.Fatalf("after delete: %+v", kb)
	}
}
