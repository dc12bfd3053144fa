package proxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory"
)

// TestOneKeyNoUserKeepsSessionsApart: the way most apps call — one API
// key for all their end users, no user id — no session's words reach
// another session's prompt, while each session still recalls its own
// conversation; a request naming another end user than its session's goes
// through without that session's memory; the sessions API hides a session
// from a caller naming another user.
func TestOneKeyNoUserKeepsSessionsApart(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	send := func(session, user, text string) string {
		t.Helper()
		hdr := map[string]string{"Authorization": "Bearer app-key", "X-Session-ID": session}
		if user != "" {
			hdr["X-User-ID"] = user
		}
		resp, b := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, text), hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", text, resp.StatusCode, b)
		}
		return up.Last()
	}
	words := []string{"zanzibar", "quokka", "marzipan", "obsidian", "tangerine", "wolfram"}
	for round := 0; round < 3; round++ {
		for i, w := range words {
			send(fmt.Sprintf("s%d", i), "", fmt.Sprintf("round %d: my secret word is %s, remember %s", round, w, w))
			srv.waitIdle()
		}
	}
	for i := range words {
		got := send(fmt.Sprintf("s%d", i), "", "what is my secret word?")
		for j, w := range words {
			if j != i && strings.Contains(got, w) {
				t.Fatalf("session s%d's prompt carries session s%d's word %q: %s", i, j, w, got)
			}
		}
		if !strings.Contains(got, words[i]) {
			t.Fatalf("session s%d lost its own conversation: %s", i, got)
		}
	}
	// Session s0 has no end user; a request naming one gets no memory of it.
	if got := send("s0", "mallory", "what is my secret word?"); strings.Contains(got, words[0]) {
		t.Fatalf("a request naming another end user got the session's memory: %s", got)
	}
	send("u1", "ada", "my secret word is heliotrope")
	srv.waitIdle()
	if got := send("u1", "bob", "what is my secret word?"); strings.Contains(got, "heliotrope") {
		t.Fatalf("bob's request on ada's session carries ada's words: %s", got)
	}
	req, _ := http.NewRequest("GET", base+"/v1/sessions/u1", nil)
	req.Header.Set("Authorization", "Bearer app-key")
	req.Header.Set("X-User-ID", "bob")
	resp, err := noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("the sessions API showed ada's session to bob: %d", resp.StatusCode)
	}
	req.Header.Set("X-User-ID", "ada")
	if resp, err = noPoolClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the sessions API hid ada's session from ada: %d", resp.StatusCode)
	}
}

// TestFailedTurnRetriedIsStoredOnce: the upstream refuses a turn (429, then
// a 500; then it closes the connection before any answer, which the
// sidecar retries itself); the client retries the same message each time;
// the session holds it once.
func TestFailedTurnRetriedIsStoredOnce(t *testing.T) {
	var calls atomic.Int32
	ok := newRecordingUpstream(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 2:
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"message":"slow down","type":"rate_limit"}}`, 429)
		case 3:
			http.Error(w, `{"error":{"message":"boom"}}`, 500)
		case 4:
			hj, _ := w.(http.Hijacker)
			c, _, _ := hj.Hijack()
			c.Close()
		default:
			ok.Config.Handler.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(up.Close)
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	hdr := map[string]string{"Authorization": "Bearer k", "X-Session-ID": "r"}
	statuses := []int{}
	for _, text := range []string{"first", "second", "second", "second"} {
		resp, _ := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, text), hdr)
		statuses = append(statuses, resp.StatusCode)
		srv.waitIdle()
	}
	if fmt.Sprint(statuses) != "[200 429 500 200]" {
		t.Fatalf("statuses %v", statuses)
	}
	var v struct {
		Messages []struct{ Role, Content string }
	}
	if getJSON(t, base+"/v1/sessions/r", "k", &v) != 200 {
		t.Fatal("no session")
	}
	var got []string
	for _, m := range v.Messages {
		got = append(got, m.Role+":"+m.Content)
	}
	if want := "[user:first assistant:echo: first user:second assistant:echo: second]"; fmt.Sprint(got) != want {
		t.Fatalf("stored history %v, want %s", got, want)
	}
}
