package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/clock"
	"github.com/kvsidecar/kvsidecar/memory"
)

// knowledgeUpstream is an upstream whose answers to the sidecar's own
// calls are scripted: fact extraction, the memory reviewer's rounds, tool
// context. Chat turns are answered "echo: <last user text>".
type knowledgeUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	facts   []string // extraction answers, in order ("[SKIP]" when none left)
	review  []string // review answers, in order ("[KEEP]" when none left)
	toolCtx string
	// merge answers L4 merge prompts: the answer of the first marker the
	// prompt holds ("[SKIP]" when none).
	merge   [][2]string
	merges  []string // L4 merge prompts
	chats   []string // chat requests' messages arrays
	reviews []string // review prompts
	tools   []string // tool-context prompts
}

func newKnowledgeUpstream(t *testing.T) *knowledgeUpstream {
	u := &knowledgeUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Messages json.RawMessage `json:"messages"`
		}
		var msgs []struct{ Role, Content string }
		if json.Unmarshal(body, &req) != nil || json.Unmarshal(req.Messages, &msgs) != nil || len(msgs) == 0 {
			http.Error(w, "bad request", 400)
			return
		}
		prompt := msgs[len(msgs)-1].Content
		pop := func(q *[]string, def string) string {
			if len(*q) == 0 {
				return def
			}
			a := (*q)[0]
			*q = (*q)[1:]
			return a
		}
		u.mu.Lock()
		var answer string
		switch {
		case strings.HasPrefix(prompt, "You maintain the long-term memory"):
			answer = pop(&u.facts, "[SKIP]")
		case strings.HasPrefix(prompt, "You review one memory"):
			u.reviews = append(u.reviews, prompt)
			answer = pop(&u.review, "[KEEP]")
		case strings.HasPrefix(prompt, "An assistant called tools"):
			u.tools = append(u.tools, prompt)
			answer = u.toolCtx
		case strings.HasPrefix(prompt, "You keep an assistant's long-term memory"):
			u.merges = append(u.merges, prompt)
			answer = "[SKIP]"
			for _, m := range u.merge {
				if strings.Contains(prompt, m[0]) {
					answer = m[1]
					break
				}
			}
		default:
			u.chats = append(u.chats, string(req.Messages))
			answer = "echo: " + prompt
		}
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`, answer)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *knowledgeUpstream) locked(f func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f()
}

// upstreamExtractor is memory's Extractor over up's chat completions, as
// the sidecar's own client of the model (cmd/sidecar/internal/llm, which
// cmd/sidecar wires and tests) makes it, reduced to what these tests need:
// the prompt sent as one user message, the answer's content returned, any
// other status an error.
func upstreamExtractor(t *testing.T, up *knowledgeUpstream) memory.Extractor {
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	return memory.ExtractorFunc(func(ctx context.Context, req memory.ExtractRequest) (string, error) {
		body, err := json.Marshal(map[string]any{"model": req.Model,
			"messages": []map[string]string{{"role": "user", "content": req.Prompt}}})
		if err != nil {
			return "", err
		}
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		hr.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(hr)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct{ Message struct{ Content string } }
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("upstream: status %d", resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) == 0 {
			return "", fmt.Errorf("upstream: answer without a choice (%v)", err)
		}
		return out.Choices[0].Message.Content, nil
	})
}

// knowledgeSidecar starts a sidecar whose memory makes its own calls to up
// (upstreamExtractor), with the reviewer and tool context on.
func knowledgeSidecar(t *testing.T, up *knowledgeUpstream, clk clock.Clock) (string, *memory.Store) {
	t.Helper()
	bg := upstreamExtractor(t, up)
	st := openMemory(t, memory.Options{
		Clock:       clk,
		Extraction:  memory.ExtractionOptions{Extractor: bg, Every: 2, EpisodeEvery: -1},
		Reviewer:    memory.ReviewerOptions{Enabled: true},
		ToolContext: memory.ToolContextOptions{Enabled: true},
	})
	base, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	return base, st
}

// TestReviewerThroughProxy: facts extracted from a turn through the proxy
// are reviewed when their importance crosses the threshold, with the
// upstream answering each scripted review: PROMOTE, KEEP, DELETE, SEARCH
// then a verdict, a malformed answer, and searches until the rounds run
// out. Only the verdicts change a fact; every outcome is in the log.
func TestReviewerThroughProxy(t *testing.T) {
	up := newKnowledgeUpstream(t)
	base, st := knowledgeSidecar(t, up, nil)
	tenant := tenantOf([]byte("Bearer key-r"))
	up.locked(func() {
		up.facts = []string{strings.Join([]string{"[ADD] The user is called Ada.", "[ADD] The user likes jazz.",
			"[ADD] The user said hello.", "[ADD] The user has a cat.", "[ADD] The user's cat is called Tom.",
			"[ADD] The user plays chess.", "[ADD] The user rides a red bike."}, "\n")}
	})
	hdr := map[string]string{"Authorization": "Bearer key-r", "X-Session-ID": "rev"}
	resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Hi, I am Ada; I like jazz, chess and my cat Tom."}]}`, hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("turn: %d %s", resp.StatusCode, b)
	}
	facts := map[string]string{} // text → id
	eventually(t, func() bool {
		mem, err := st.Memory(tenant, "rev")
		if err != nil {
			return false
		}
		for _, u := range mem.Units {
			if u.Category == memory.CategoryFact {
				facts[u.Content] = u.ID
			}
		}
		return len(facts) == 7
	})
	unit := func(id string) (memory.Unit, bool) {
		mem, err := st.Memory(tenant, "rev")
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range mem.Units {
			if u.ID == id {
				return u, true
			}
		}
		return memory.Unit{}, false
	}
	review := func(text string, answers ...string) (memory.Review, memory.Unit, bool) {
		t.Helper()
		id := facts[text]
		up.locked(func() { up.review = answers })
		n := len(mustReviews(t, st, tenant))
		three := 3.0
		if _, err := st.UpdateMemory(tenant, "rev", id, memory.MemoryEdit{Importance: &three}); err != nil {
			t.Fatal(err)
		}
		eventually(t, func() bool { return len(mustReviews(t, st, tenant)) == n+1 })
		r := mustReviews(t, st, tenant)[0]
		if r.FactID != id || r.Session != "rev" {
			t.Fatalf("review of %s logged as %+v", id, r)
		}
		u, ok := unit(id)
		return r, u, ok
	}

	if r, u, _ := review("The user is called Ada.", "[PROMOTE] the user's name"); r.Decision != memory.ReviewPromote || u.Category != memory.CategoryCore {
		t.Fatalf("PROMOTE: %+v, %+v", r, u)
	}
	if r, u, _ := review("The user likes jazz.", "[KEEP] a taste"); r.Decision != memory.ReviewKeep || u.Importance != 0.5 || u.Category != memory.CategoryFact {
		t.Fatalf("KEEP: %+v, %+v", r, u)
	}
	if r, _, ok := review("The user said hello.", "[DELETE] small talk"); r.Decision != memory.ReviewDelete || ok {
		t.Fatalf("DELETE: %+v, still there %v", r, ok)
	}
	if r, _, ok := review("The user has a cat.", "[SEARCH:cat]", "[DELETE] the cat's name says it"); r.Decision != memory.ReviewDelete || r.Rounds != 2 || ok {
		t.Fatalf("SEARCH then DELETE: %+v, still there %v", r, ok)
	}
	up.locked(func() {
		if p := up.reviews[len(up.reviews)-1]; !strings.Contains(p, "[SEARCH:cat] found:") || !strings.Contains(p, "Tom") {
			t.Fatalf("the second round does not show the search:\n%s", p)
		}
	})
	if r, u, _ := review("The user plays chess.", "Sure! [PROMOTE]"); r.Decision != memory.ReviewMalformed || u.Category != memory.CategoryFact || u.Importance != 3 {
		t.Fatalf("malformed: %+v, %+v", r, u)
	}
	if r, u, _ := review("The user rides a red bike.", "[SEARCH:bike]", "[SEARCH:red]", "[SEARCH:bicycle]", "[DELETE]"); r.Decision != memory.ReviewUndecided ||
		r.Rounds != 3 || u.Category != memory.CategoryFact || u.Importance != 3 {
		t.Fatalf("too many rounds: %+v, %+v", r, u)
	}
	var metrics string
	eventually(t, func() bool {
		resp, err := noPoolClient.Get(adminURL(t, base) + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		metrics = string(b)
		return true
	})
	for _, want := range []string{`sidecar_memory_reviews_by_decision_total{decision="delete"} 2`, `sidecar_memory_reviews_by_decision_total{decision="malformed"} 1`,
		`sidecar_memory_reviews_total 6`, `sidecar_memory_background_calls_total{kind="review"} 9`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func mustReviews(t *testing.T, st *memory.Store, tenant string) []memory.Review {
	t.Helper()
	rs, err := st.Reviews(tenant, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestToolContextThroughProxy: a turn with tool_calls and tool results is
// condensed by the upstream in the background; the condensed sentence is
// in the upstream's request of the next turn only, and in no memory.
func TestToolContextThroughProxy(t *testing.T) {
	up := newKnowledgeUpstream(t)
	const sentence = "The get_weather tool reported 21 C and sunny skies in Paris."
	up.locked(func() { up.toolCtx = sentence })
	base, st := knowledgeSidecar(t, up, nil)
	tenant := tenantOf([]byte("Bearer key-t"))
	hdr := map[string]string{"Authorization": "Bearer key-t", "X-Session-ID": "tools"}
	msgs := `{"role":"system","content":"Be brief."},{"role":"user","content":"Weather in Paris?"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","tool_call_id":"call_1","content":"{\"temp_c\":21,\"sky\":\"sunny\"}"}`
	send := func(extra string) string {
		t.Helper()
		if extra != "" {
			msgs += "," + extra
		}
		resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[`+msgs+`]}`, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("turn: %d %s", resp.StatusCode, b)
		}
		var out struct {
			Choices []struct{ Message json.RawMessage }
		}
		if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) == 0 {
			t.Fatalf("answer %s", b)
		}
		msgs += "," + string(out.Choices[0].Message)
		var last string
		up.locked(func() { last = up.chats[len(up.chats)-1] })
		return last
	}
	if first := send(""); strings.Contains(first, sentence) {
		t.Fatal("the first turn already shows the context")
	}
	eventually(t, func() bool { return st.Stats().ToolContextReady == 1 })
	up.locked(func() {
		if len(up.tools) != 1 || !strings.Contains(up.tools[0], "get_weather") || !strings.Contains(up.tools[0], "sunny") {
			t.Fatalf("condensing prompts %q", up.tools)
		}
	})
	if second := send(`{"role":"user","content":"Umbrella?"}`); !strings.Contains(second, sentence) {
		t.Fatalf("turn 2's upstream request lacks the tool context: %s", second)
	}
	// Turn 3 makes no new tool context; turn 2's block stays where it was
	// sent (prompts only grow), so the sentence is there once.
	if third := send(`{"role":"user","content":"Thanks."}`); strings.Count(third, sentence) != 1 || !strings.Contains(third, `"role":"tool"`) {
		t.Fatalf("turn 3's upstream request: %s", third)
	}
	mem, err := st.Memory(tenant, "tools")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range mem.Units {
		if strings.Contains(u.Content, "reported 21 C") {
			t.Fatalf("the tool context became a memory: %+v", u)
		}
	}
}

// stepClock is a clock the test moves.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// After never fires: the store starts no timers on its clock.
func (c *stepClock) After(time.Duration) <-chan time.Time { return nil }

// TestReviewerAfterDecayThroughProxy: facts that decayed below 0.5 while
// the session slept are reviewed after its next turn, one after the other.
func TestReviewerAfterDecayThroughProxy(t *testing.T) {
	up := newKnowledgeUpstream(t)
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	base, st := knowledgeSidecar(t, up, clk)
	tenant := tenantOf([]byte("Bearer key-d"))
	up.locked(func() { up.facts = []string{"[ADD] The user owns a kayak.\n[ADD] The user visits Oslo."} })
	hdr := map[string]string{"Authorization": "Bearer key-d", "X-Session-ID": "decay"}
	turn := func(text string) {
		t.Helper()
		resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":`+fmt.Sprintf("%q", text)+`}]}`, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("turn: %d %s", resp.StatusCode, b)
		}
	}
	turn("I paddle my kayak when I visit Oslo.")
	eventually(t, func() bool {
		mem, err := st.Memory(tenant, "decay")
		return err == nil && len(mem.Units) == 2
	})
	if n := len(mustReviews(t, st, tenant)); n != 0 {
		t.Fatalf("%d reviews before any decay", n)
	}
	up.locked(func() { up.review = []string{"[DELETE] no longer relevant", "[KEEP] still true"} })
	clk.add(26 * 24 * time.Hour) // five fact periods: 0.85^5 < 0.5
	turn("Anything new?")
	eventually(t, func() bool { return len(mustReviews(t, st, tenant)) == 2 })
	rs := mustReviews(t, st, tenant)
	if rs[1].Decision != memory.ReviewDelete || rs[0].Decision != memory.ReviewKeep || rs[0].Trigger != "demote" || rs[1].Trigger != "demote" {
		t.Fatalf("decay reviews %+v", rs)
	}
	mem, _ := st.Memory(tenant, "decay")
	facts := 0
	for _, u := range mem.Units {
		if u.Category == memory.CategoryFact {
			facts++
			if u.ID != rs[0].FactID || u.Importance != 0.5 {
				t.Fatalf("after the reviews: %+v", u)
			}
		}
	}
	if facts != 1 {
		t.Fatalf("%d facts left, want 1", facts)
	}
}
