package admin

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/proxy"
	"github.com/kvsidecar/kvsidecar/tiers"
)

const testAdminToken = "admin-token-0123456789"

// adminDo sends an admin call with bearer (the admin token unless given).
func adminDo(t *testing.T, base, method, path, bearer, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, adminURL(t, base)+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// adminJSON is adminDo with the admin token that wants status and decodes
// the answer into v.
func adminJSON(t *testing.T, base, method, path, body string, status int, v any) {
	t.Helper()
	resp, b := adminDo(t, base, method, path, testAdminToken, body)
	if resp.StatusCode != status {
		t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, status)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
}

// chatTurn sends one chat turn of session id under key and user.
func chatTurn(t *testing.T, base, key, id, user, text string) {
	t.Helper()
	hdr := map[string]string{"Authorization": "Bearer " + key, "X-Session-ID": id}
	if user != "" {
		hdr["X-User-ID"] = user
	}
	resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":`+jsonString(text)+`}]}`, hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("turn %s: %d %s", id, resp.StatusCode, b)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

type memRow struct {
	ID, Session, Category, Content, Review string
	Importance                             float64
	Decay                                  *struct {
		Factor      float64 `json:"factor"`
		PeriodHours float64 `json:"period_hours"`
		ExpiresAt   *string `json:"expires_at"`
	}
}

// TestConsoleOffAndAuth: without an admin token the console and its API
// are 404; with one, only that token opens the API, never an API key.
func TestConsoleOffAndAuth(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	off, _ := startSidecar(t, up.URL, func(o *sidecarOptions) { o.Memory = st })
	for _, p := range []string{"/ui", "/ui/", "/ui/app.js", "/admin/v1/tenants"} {
		resp, b := adminDo(t, off, "GET", p, testAdminToken, "")
		wantOpenAIError(t, resp, b, 404, "console_disabled")
	}

	on, px := startSidecar(t, up.URL, func(o *sidecarOptions) { o.Memory = st; o.AdminToken = testAdminToken })
	chatTurn(t, on, "key-a", "s1", "", "hello")
	for _, bearer := range []string{"", "key-a", testAdminToken + "x", strings.ToUpper(testAdminToken)} {
		resp, b := adminDo(t, on, "GET", "/admin/v1/tenants", bearer, "")
		wantOpenAIError(t, resp, b, 401, "invalid_admin_token")
		if resp.Header.Get("WWW-Authenticate") == "" {
			t.Fatal("401 without WWW-Authenticate")
		}
	}
	// The admin token is no key to a tenant's sessions on the normal routes.
	if code := getJSON(t, on+"/v1/sessions/s1", testAdminToken, nil); code != 404 {
		t.Fatalf("admin token on /v1/sessions of another tenant: %d", code)
	}
	// The page is served, with a strict policy; unknown files and escapes are 404.
	resp, b := adminDo(t, on, "GET", "/ui/", "", "")
	if resp.StatusCode != 200 || !strings.Contains(string(b), "kvsidecar console") || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("/ui/: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _ := adminDo(t, on, "GET", "/ui/app.js", "", ""); resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "javascript") {
		t.Fatalf("/ui/app.js: %d %v", resp.StatusCode, resp.Header)
	}
	for _, p := range []string{"/ui/nope.js", "/ui/..%2Fdoc.go", "/ui/doc.go", "/ui/%2e%2e/x"} {
		resp, b := adminDo(t, on, "GET", p, "", "")
		wantOpenAIError(t, resp, b, 404, "not_found")
	}
	noRedirect := &http.Client{Transport: noPoolClient.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r, err := noRedirect.Get(adminURL(t, on) + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 301 || r.Header.Get("Location") == "" || !strings.HasSuffix(r.Header.Get("Location"), "/ui/") {
		t.Fatalf("/ui: %d %v", r.StatusCode, r.Header)
	}

	for _, tok := range []string{"short", " " + testAdminToken, "admin token with spaces 123"} {
		if _, err := New(Options{Token: tok, Front: px, Health: px, Metrics: px.Metrics(), Sessions: px}); err == nil {
			t.Errorf("admin token %q accepted", tok)
		}
	}
}

// TestAdminMemories drives the console's memory API end to end: tenants
// and users listed, a memory added, edited, boosted, deleted, a batch
// delete that skips core and system memories, statistics and exports, and
// no call of one tenant reaching another's session.
func TestAdminMemories(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	base, _ := startSidecar(t, up.URL, func(o *sidecarOptions) { o.Memory = st; o.AdminToken = testAdminToken })
	chatTurn(t, base, "key-a", "a1", "alice", "I live in Lisbon")
	chatTurn(t, base, "key-a", "a2", "bob", "I like tea")
	chatTurn(t, base, "key-b", "b1", "", "secret plans of b")
	ta, tb := tenantOf([]byte("Bearer key-a")), tenantOf([]byte("Bearer key-b"))

	var tenants struct{ Data []memory.TenantInfo }
	adminJSON(t, base, "GET", "/admin/v1/tenants", "", 200, &tenants)
	got := map[string]int{}
	for _, x := range tenants.Data {
		got[x.Tenant] = x.Sessions
	}
	if len(got) != 2 || got[ta] != 2 || got[tb] != 1 {
		t.Fatalf("tenants %+v, want %s:2 %s:1", tenants.Data, ta, tb)
	}
	var sess struct {
		Data  []memory.SessionInfo
		Users []struct {
			User     string
			Sessions int
		}
	}
	adminJSON(t, base, "GET", "/admin/v1/sessions?tenant="+ta+"&user=alice", "", 200, &sess)
	if len(sess.Data) != 1 || sess.Data[0].ID != "a1" || len(sess.Users) != 2 {
		t.Fatalf("alice's sessions %+v", sess)
	}
	resp, b := adminDo(t, base, "GET", "/admin/v1/sessions", testAdminToken, "")
	wantOpenAIError(t, resp, b, 400, "missing_tenant")

	q := "?tenant=" + ta + "&session=a1"
	var added memRow
	adminJSON(t, base, "POST", "/admin/v1/memories"+q, `{"category":"fact","text":"The user lives in Lisbon.","importance":1.5}`, 201, &added)
	if added.ID == "" || added.Category != "fact" || added.Importance != 1.5 || added.Session != "a1" || added.Decay == nil || added.Decay.Factor != memory.FactDecay {
		t.Fatalf("added %+v", added)
	}
	var core, sys, ep memRow
	adminJSON(t, base, "POST", "/admin/v1/memories"+q, `{"category":"core","text":"The user is called Ada."}`, 201, &core)
	adminJSON(t, base, "POST", "/admin/v1/memories"+q, `{"category":"system","text":"=HYPERLINK(\"x\") answer briefly"}`, 201, &sys)
	adminJSON(t, base, "POST", "/admin/v1/memories"+q, `{"category":"episode","text":"They planned a trip."}`, 201, &ep)
	if core.Decay != nil || ep.Decay == nil || ep.Decay.ExpiresAt == nil {
		t.Fatalf("decay: core %+v, episode %+v", core.Decay, ep.Decay)
	}
	for _, c := range []struct{ method, path, body, code string }{
		{"POST", "/admin/v1/memories" + q, `{"category":"gossip","text":"x"}`, "invalid_memory"},
		{"POST", "/admin/v1/memories" + q, `{"category":"fact","text":"   "}`, "invalid_memory"},
		{"POST", "/admin/v1/memories" + q, `{"category":"fact","text":"x","extra":1}`, "invalid_json"},
		{"POST", "/admin/v1/memories" + q, `{"category":"fact","text":"x","importance":1e9}`, "invalid_memory"},
		{"POST", "/admin/v1/memories" + q, `not json`, "invalid_json"},
		{"POST", "/admin/v1/memories?tenant=" + ta, `{"category":"fact","text":"x"}`, "missing_session"},
		{"PATCH", "/admin/v1/memories/" + added.ID + q, `{}`, "invalid_memory"},
		{"GET", "/admin/v1/memories?tenant=" + ta, ``, "missing_scope"},
		{"GET", "/admin/v1/memories" + q + "&format=xml", ``, "invalid_format"},
		{"POST", "/admin/v1/memories/batch-delete" + q, `{"ids":[]}`, "invalid_ids"},
	} {
		resp, b := adminDo(t, base, c.method, c.path, testAdminToken, c.body)
		wantOpenAIError(t, resp, b, 400, c.code)
	}
	for _, c := range []struct{ method, path, body, code string }{
		{"POST", "/admin/v1/memories?tenant=" + ta + "&session=nope", `{"category":"fact","text":"x"}`, "session_not_found"},
		{"DELETE", "/admin/v1/memories/mem-999" + q, ``, "memory_not_found"},
		// Tenant b's call never reaches tenant a's session.
		{"GET", "/admin/v1/memories?tenant=" + tb + "&session=a1", ``, "session_not_found"},
		{"DELETE", "/admin/v1/memories/" + added.ID + "?tenant=" + tb + "&session=a1", ``, "session_not_found"},
		{"GET", "/admin/v1/nothing", ``, "not_found"},
	} {
		resp, b := adminDo(t, base, c.method, c.path, testAdminToken, c.body)
		wantOpenAIError(t, resp, b, 404, c.code)
	}
	resp, b = adminDo(t, base, "PUT", "/admin/v1/memories"+q, testAdminToken, `{}`)
	wantOpenAIError(t, resp, b, 405, "method_not_allowed")
	if resp.Header.Get("Allow") != "GET, POST" {
		t.Fatalf("Allow %q", resp.Header.Get("Allow"))
	}

	var edited memRow
	adminJSON(t, base, "PATCH", "/admin/v1/memories/"+added.ID+q, `{"text":"The user lives in Porto.","importance":2.6}`, 200, &edited)
	if edited.Content != "The user lives in Porto." || edited.Importance != 2.6 || edited.Review != "promote" {
		t.Fatalf("edited %+v", edited)
	}
	var boosted struct{ Importance float64 }
	adminJSON(t, base, "POST", "/admin/v1/memories/"+ep.ID+"/boost"+q, "", 200, &boosted)
	if boosted.Importance <= 1 {
		t.Fatalf("boosted to %v", boosted.Importance)
	}
	resp, b = adminDo(t, base, "POST", "/admin/v1/memories/"+ep.ID+"/boost"+q, testAdminToken, "")
	wantOpenAIError(t, resp, b, 409, "boost_limited")

	var rows struct{ Data []memRow }
	adminJSON(t, base, "GET", "/admin/v1/memories"+q, "", 200, &rows)
	byID := map[string]memRow{}
	for _, r := range rows.Data {
		byID[r.ID] = r
	}
	if len(rows.Data) != 4 || byID[added.ID].Content != "The user lives in Porto." || byID[ep.ID].Importance != boosted.Importance {
		t.Fatalf("memories after edits %+v", rows.Data)
	}
	// The user-wide view holds the same memories (alice has one session).
	adminJSON(t, base, "GET", "/admin/v1/memories?tenant="+ta+"&user=alice", "", 200, &rows)
	if len(rows.Data) != 4 {
		t.Fatalf("alice's memories %+v", rows.Data)
	}

	// Statistics and exports.
	var stats struct {
		Data []struct {
			Category       string
			Count          int
			MeanImportance float64 `json:"mean_importance"`
			Promote        int     `json:"review_promote"`
		}
	}
	adminJSON(t, base, "GET", "/admin/v1/stats"+q, "", 200, &stats)
	counts := map[string]int{}
	for _, c := range stats.Data {
		counts[c.Category] = c.Count
		if c.Category == "fact" && (c.MeanImportance != 2.6 || c.Promote != 1) {
			t.Fatalf("fact stats %+v", c)
		}
	}
	if counts["fact"] != 1 || counts["core"] != 1 || counts["system"] != 1 || counts["episode"] != 1 {
		t.Fatalf("stats %+v", stats.Data)
	}
	resp, b = adminDo(t, base, "GET", "/admin/v1/stats"+q+"&format=csv", testAdminToken, "")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") ||
		resp.Header.Get("Content-Disposition") != `attachment; filename="memory-stats.csv"` {
		t.Fatalf("stats csv: %d %v", resp.StatusCode, resp.Header)
	}
	recs, err := csv.NewReader(strings.NewReader(string(b))).ReadAll()
	if err != nil || len(recs) != 5 || recs[0][0] != "category" || recs[3][0] != "fact" || recs[3][1] != "1" || recs[3][3] != "2.6" {
		t.Fatalf("stats csv %q %v", recs, err)
	}
	resp, b = adminDo(t, base, "GET", "/admin/v1/memories"+q+"&format=csv", testAdminToken, "")
	recs, err = csv.NewReader(strings.NewReader(string(b))).ReadAll()
	if resp.StatusCode != 200 || err != nil || len(recs) != 5 {
		t.Fatalf("memories csv %d %q %v", resp.StatusCode, recs, err)
	}
	for _, r := range recs[1:] {
		if r[2] == "system" && !strings.HasPrefix(r[10], "'=HYPERLINK") {
			t.Fatalf("formula cell not neutralised: %q", r[10])
		}
	}
	resp, b = adminDo(t, base, "GET", "/admin/v1/stats"+q+"&format=json", testAdminToken, "")
	var js []map[string]any
	if resp.StatusCode != 200 || json.Unmarshal(b, &js) != nil || len(js) != 4 || !strings.Contains(resp.Header.Get("Content-Disposition"), "memory-stats.json") {
		t.Fatalf("stats json %d %s", resp.StatusCode, b)
	}

	// Batch delete: core and system skipped, unknown ids named.
	var batch struct {
		Deleted  []string
		Skipped  []struct{ ID, Reason string }
		NotFound []string `json:"not_found"`
	}
	body, _ := json.Marshal(map[string]any{"ids": []string{added.ID, core.ID, sys.ID, ep.ID, "mem-404", added.ID}})
	adminJSON(t, base, "POST", "/admin/v1/memories/batch-delete"+q, string(body), 200, &batch)
	slices.Sort(batch.Deleted)
	wantDel := []string{added.ID, ep.ID}
	slices.Sort(wantDel)
	if !slices.Equal(batch.Deleted, wantDel) || len(batch.Skipped) != 2 || !slices.Equal(batch.NotFound, []string{"mem-404"}) {
		t.Fatalf("batch %+v", batch)
	}
	adminJSON(t, base, "GET", "/admin/v1/memories"+q, "", 200, &rows)
	var left []string
	for _, r := range rows.Data {
		left = append(left, r.Category)
	}
	slices.Sort(left)
	if !slices.Equal(left, []string{"core", "system"}) {
		t.Fatalf("after batch delete: %v", left)
	}
	// The memory API of the session's own tenant agrees.
	var mv struct {
		Units []struct{ ID, Category string }
	}
	if getJSON(t, base+"/v1/sessions/a1/memory", "key-a", &mv) != 200 {
		t.Fatal("memory view")
	}
	n := 0
	for _, u := range mv.Units {
		if u.Category != "" {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("tenant's own view has %d memories: %+v", n, mv.Units)
	}
	adminJSON(t, base, "DELETE", "/admin/v1/memories/"+core.ID+q, "", 200, nil)

	// A session deleted by the admin is gone for its tenant too.
	adminJSON(t, base, "DELETE", "/admin/v1/sessions/a2?tenant="+ta, "", 200, nil)
	if code := getJSON(t, base+"/v1/sessions/a2", "key-a", nil); code != 404 {
		t.Fatalf("deleted session answers %d", code)
	}
}

// TestAdminSessionDetail: the session view carries its tiers and the last
// window, whose stable block holds the pinned memory.
func TestAdminSessionDetail(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	base, _ := startSidecar(t, up.URL, func(o *sidecarOptions) { o.Memory = st; o.AdminToken = testAdminToken })
	chatTurn(t, base, "key-a", "s", "", "hello there")
	ta := tenantOf([]byte("Bearer key-a"))
	adminJSON(t, base, "POST", "/admin/v1/memories?tenant="+ta+"&session=s", `{"category":"core","text":"The user is called Ada."}`, 201, nil)
	chatTurn(t, base, "key-a", "s", "", "what is my name?")
	var d struct {
		ID         string
		Messages   []json.RawMessage
		Tiers      map[string]int
		Categories map[string]int
		LastWindow *struct {
			Limit       int    `json:"limit"`
			TotalTokens int    `json:"total_tokens"`
			StableBlock string `json:"stable_block"`
		} `json:"last_window"`
	}
	eventually(t, func() bool {
		adminJSON(t, base, "GET", "/admin/v1/sessions/s?tenant="+ta, "", 200, &d)
		return len(d.Messages) == 4
	})
	if d.ID != "s" || d.Tiers["focus"] != 4 || d.Categories["core"] != 1 || d.LastWindow == nil ||
		d.LastWindow.TotalTokens <= 0 || d.LastWindow.TotalTokens > d.LastWindow.Limit || !strings.Contains(d.LastWindow.StableBlock, "Ada") {
		t.Fatalf("session detail %+v window %+v", d, d.LastWindow)
	}
	resp, b := adminDo(t, base, "GET", "/admin/v1/sessions/nope?tenant="+ta, testAdminToken, "")
	wantOpenAIError(t, resp, b, 404, "session_not_found")
}

type fakeKnowledge struct {
	mu      sync.Mutex
	triples map[string][]Triple // by tenant+user
}

func (f *fakeKnowledge) Triples(tenant, user string, limit int) ([]Triple, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.triples[tenant+"/"+user]), nil
}

func (f *fakeKnowledge) Reviews(tenant, user string, limit int) ([]Review, error) {
	return []Review{{FactID: "fact-1", Decision: "promote", Rounds: 2, Reason: "often used " + user}}, nil
}

func (f *fakeKnowledge) DeleteTriple(tenant, user, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := tenant + "/" + user
	i := slices.IndexFunc(f.triples[k], func(x Triple) bool { return x.ID == id })
	if i < 0 {
		return errors.Join(memory.ErrNotFound)
	}
	f.triples[k] = slices.Delete(f.triples[k], i, i+1)
	return nil
}

// TestAdminKnowledge: the triples and reviews panels read the Knowledge
// the sidecar was given, per tenant and user, and are empty without one.
func TestAdminKnowledge(t *testing.T) {
	up := newRecordingUpstream(t)
	k := &fakeKnowledge{triples: map[string][]Triple{"t1/ann": {{ID: "tr1", Subject: "Ann", Predicate: "lives in", Object: "Lisbon", Support: []string{"fact-1"}}}}}
	base, _ := startSidecar(t, up.URL, func(o *sidecarOptions) { o.Knowledge = k; o.AdminToken = testAdminToken })
	var tr struct {
		Data      []Triple
		Available bool
	}
	adminJSON(t, base, "GET", "/admin/v1/triples?tenant=t1&user=ann", "", 200, &tr)
	if !tr.Available || len(tr.Data) != 1 || tr.Data[0].Object != "Lisbon" {
		t.Fatalf("triples %+v", tr)
	}
	adminJSON(t, base, "GET", "/admin/v1/triples?tenant=t1&user=bob", "", 200, &tr)
	if len(tr.Data) != 0 {
		t.Fatalf("bob sees %+v", tr)
	}
	var rv struct{ Data []Review }
	adminJSON(t, base, "GET", "/admin/v1/reviews?tenant=t1&user=ann", "", 200, &rv)
	if len(rv.Data) != 1 || rv.Data[0].Decision != "promote" || rv.Data[0].Reason != "often used ann" {
		t.Fatalf("reviews %+v", rv)
	}
	adminJSON(t, base, "DELETE", "/admin/v1/triples/tr1?tenant=t1&user=ann", "", 200, nil)
	resp, b := adminDo(t, base, "DELETE", "/admin/v1/triples/tr1?tenant=t1&user=ann", testAdminToken, "")
	wantOpenAIError(t, resp, b, 404, "triple_not_found")
	adminJSON(t, base, "GET", "/admin/v1/triples?tenant=t1&user=ann", "", 200, &tr)
	if len(tr.Data) != 0 {
		t.Fatalf("deleted triple still listed: %+v", tr)
	}

	none, _ := startSidecar(t, up.URL, func(o *sidecarOptions) { o.AdminToken = testAdminToken })
	adminJSON(t, none, "GET", "/admin/v1/triples?tenant=t1", "", 200, &tr)
	if tr.Available || tr.Data == nil || len(tr.Data) != 0 {
		t.Fatalf("no knowledge: %+v", tr)
	}
	resp, b = adminDo(t, none, "GET", "/admin/v1/tenants", testAdminToken, "")
	wantOpenAIError(t, resp, b, 404, "memory_disabled")
}

// TestAdminKV: the KV view reports the cache's counters and tiers, and the
// sampler's series starts with a sample taken when serving began.
func TestAdminKV(t *testing.T) {
	c, err := kv.Open(kv.Options{Store: tiers.Options{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	base, _ := startSidecar(t, "http://127.0.0.1:1", func(o *sidecarOptions) { o.KV = c; o.AdminToken = testAdminToken })
	// Lookups that stand in for computes (engine restores) count in the
	// cache's hit rate: three hits, one miss.
	if err := c.PutBlob("ns", "a", kv.BlobMeta{}, []byte("0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, _, _, err := c.LoadBlob("ns", "a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := c.Get("m", "q"); err == nil {
		t.Fatal("found a block never put")
	}
	var v struct {
		KV *struct {
			Hits, Misses int64
			HitRate      float64 `json:"hit_rate"`
			Tiers        []struct {
				Tier    string
				Entries int
			}
		}
		Engine  json.RawMessage
		Samples []KVSample
	}
	adminJSON(t, base, "GET", "/admin/v1/kv", "", 200, &v)
	st := c.Stats()
	if v.KV == nil || v.KV.Hits != 3 || v.KV.Misses != 1 || v.KV.HitRate != 0.75 || len(v.KV.Tiers) != len(st.Tiers) || string(v.Engine) != "null" {
		t.Fatalf("kv view %+v (cache %+v)", v.KV, st)
	}
	if len(v.Samples) == 0 || len(v.Samples[0].Tiers) != len(st.Tiers) {
		t.Fatalf("samples %+v", v.Samples)
	}
}

// TestKVSeriesRing: the ring keeps the last n samples, oldest first.
func TestKVSeriesRing(t *testing.T) {
	r := newKVSeries(3)
	at := func(i int) time.Time { return time.Unix(int64(i), 0) }
	for i := 1; i <= 5; i++ {
		r.add(KVSample{At: at(i), KVHits: int64(i)})
		got := r.snapshot()
		if want := min(i, 3); len(got) != want || got[len(got)-1].KVHits != int64(i) || got[0].KVHits != int64(i-want+1) {
			t.Fatalf("after %d adds: %+v", i, got)
		}
	}
	if got := newKVSeries(0).snapshot(); len(got) != 0 {
		t.Fatal("empty ring")
	}
}

// TestSamplerTicks: the sampler adds one sample at once and one per
// period, and stops when its context ends.
func TestSamplerTicks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &Server{series: newKVSeries(10), opts: Options{Sessions: &fakeSessions{}}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.runSampler(ctx, time.Second) }()
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		if n := len(s.series.snapshot()); n != 4 {
			t.Fatalf("%d samples after 3.5 periods, want 4", n)
		}
		cancel()
		<-done
	})
}

// TestWindowCacheBound: the last windows of at most max sessions are kept,
// the oldest leave first, and forgetting one frees its place.
func TestWindowCacheBound(t *testing.T) {
	c := NewWindows(2)
	w := func(n int) *lastWindow { return &lastWindow{TotalTokens: n} }
	c.put("t", "a", w(1))
	c.put("t", "b", w(2))
	c.put("t", "a", w(3)) // replaces, keeps its place
	c.put("t", "c", w(4)) // a is the oldest
	if c.get("t", "a") != nil || c.get("t", "b").TotalTokens != 2 || c.get("t", "c").TotalTokens != 4 {
		t.Fatalf("after eviction: a=%v b=%v c=%v", c.get("t", "a"), c.get("t", "b"), c.get("t", "c"))
	}
	c.Forget("t", "b")
	c.put("t", "d", w(5))
	if c.get("t", "c") == nil || c.get("t", "d") == nil || len(c.m) != 2 || len(c.order) != 2 {
		t.Fatalf("after forget: %v %v", c.m, c.order)
	}
	if c.get("u", "c") != nil {
		t.Fatal("another tenant's key matched")
	}
}

// chatOnlyMemory is the proxy's Memory, without the console's methods.
type chatOnlyMemory struct{ proxy.Memory }

// TestConsoleNeedsAdminMemory: the console takes only a Memory that can
// list and edit (its Options.Memory is that interface, so a chat-only
// memory is refused when the sidecar is built); the proxy takes a
// chat-only one (package proxy's TestChatOnlyMemory).
func TestConsoleNeedsAdminMemory(t *testing.T) {
	st := openMemory(t, memory.Options{})
	if _, ok := any(chatOnlyMemory{st}).(Memory); ok {
		t.Fatal("a chat-only memory passes for the console's Memory")
	}
	if _, ok := any(st).(Memory); !ok {
		t.Fatal("*memory.Store is not the console's Memory")
	}
}
