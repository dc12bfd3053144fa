package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/memory"
)

// TestSessionListIsTheKeysOwnAndPaged: GET /v1/sessions lists the
// caller's API key's sessions only (one end user's with X-User-ID),
// newest first, a page at a time with limit and after; anything but GET
// is 405, a request without a key 401, and nothing reaches the upstream.
func TestSessionListIsTheKeysOwnAndPaged(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	turn := func(key, session, user string) {
		t.Helper()
		hdr := map[string]string{"Authorization": "Bearer " + key, "X-Session-ID": session}
		if user != "" {
			hdr["X-User-ID"] = user
		}
		if resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, hdr); resp.StatusCode != 200 {
			t.Fatalf("turn %s/%s: %d %s", key, session, resp.StatusCode, b)
		}
		time.Sleep(5 * time.Millisecond) // distinct write times: the order is by the log's last write
	}
	var want []string // key-a's sessions, newest first
	for i := range 5 {
		id := fmt.Sprintf("a-%d", i)
		user := ""
		if i%2 == 1 {
			user = "ada"
		}
		turn("key-a", id, user)
		want = slices.Insert(want, 0, id)
	}
	turn("key-b", "b-0", "")
	var page struct {
		Object  string
		Data    []struct{ ID, Object, User string }
		FirstID string `json:"first_id"`
		LastID  string `json:"last_id"`
		HasMore bool   `json:"has_more"`
	}
	ids := func() []string {
		var out []string
		for _, d := range page.Data {
			out = append(out, d.ID)
		}
		return out
	}
	// Replies are recorded off the request path: wait for the last write.
	waitFor(t, srv, func() bool {
		return getJSON(t, base+"/v1/sessions?limit=100", "key-a", &page) == 200 && len(page.Data) == 5
	})
	time.Sleep(50 * time.Millisecond)
	if code := getJSON(t, base+"/v1/sessions", "key-a", &page); code != 200 || page.Object != "list" || !slices.Equal(ids(), want) || page.HasMore {
		t.Fatalf("list: %d %+v, want %q", code, page, want)
	}
	var got []string
	for after := ""; ; {
		if code := getJSON(t, base+"/v1/sessions?limit=2&after="+after, "key-a", &page); code != 200 || len(page.Data) > 2 {
			t.Fatalf("page after %q: %d %+v", after, code, page)
		}
		got = append(got, ids()...)
		if page.FirstID != page.Data[0].ID || page.LastID != page.Data[len(page.Data)-1].ID || page.Data[0].Object != "session" {
			t.Errorf("page %+v", page)
		}
		if !page.HasMore {
			break
		}
		after = page.LastID
	}
	if !slices.Equal(got, want) {
		t.Errorf("paged %q, want %q", got, want)
	}
	// One end user's sessions.
	req, _ := http.NewRequest("GET", base+"/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer key-a")
	req.Header.Set("X-User-ID", "ada")
	resp, err := noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("X-User-ID list: %d", resp.StatusCode)
	}
	// Another key sees only its own.
	if code := getJSON(t, base+"/v1/sessions", "key-b", &page); code != 200 || !slices.Equal(ids(), []string{"b-0"}) {
		t.Errorf("key-b: %d %q", code, ids())
	}
	if code := getJSON(t, base+"/v1/sessions", "key-c", &page); code != 200 || len(page.Data) != 0 || page.HasMore {
		t.Errorf("a key without sessions: %d %+v", code, page)
	}
	for _, bad := range []string{"?limit=0", "?limit=101", "?limit=x", "?after=nope"} {
		if code := getJSON(t, base+"/v1/sessions"+bad, "key-a", nil); code != 400 {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
	seen := len(up.Bodies())
	for _, method := range []string{"POST", "DELETE", "PUT"} {
		req, _ := http.NewRequest(method, base+"/v1/sessions", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer key-a")
		resp, err := noPoolClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET" {
			t.Errorf("%s /v1/sessions: %d Allow %q", method, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	if code := getJSON(t, base+"/v1/sessions", "", nil); code != 401 {
		t.Errorf("without a key: %d", code)
	}
	if len(up.Bodies()) != seen {
		t.Errorf("the listing reached the upstream")
	}
}
