package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
	"github.com/kvsidecar/kvsidecar/memory"
)

func poolRequest(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	var hdr map[string]string
	if key != "" {
		hdr = map[string]string{"Authorization": "Bearer " + key}
	}
	resp, b := sidecartest.Do(t, noPoolClient, method, url, body, hdr)
	return resp.StatusCode, string(b)
}

// chatMessages posts one chat turn and returns the messages the upstream
// received.
func chatMessages(t *testing.T, base string, up *recordingUpstream, hdr map[string]string, content string) []json.RawMessage {
	t.Helper()
	body := `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":` + jsonString(content) + `}]}`
	resp, b := post(t, base+"/v1/chat/completions", body, hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal([]byte(up.Last()), &msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

func contentOf(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var m struct{ Role, Content string }
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m.Role + ": " + m.Content
}

// TestPoolInContextThroughProxy: a session request with X-Pool-Prefix gets
// its API key's pool entries under the prefix in the stable block right
// after its system message, newest first; the block is byte for byte the
// same turn after turn until a write under the prefix; no header, no pool;
// another key's requests never see it; a bad header is a 400.
func TestPoolInContextThroughProxy(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	for _, w := range [][2]string{{"team%2Fgoal", `{"value":"Ship the release by Friday."}`}, {"team%2Fowner", `{"value":{"name":"Ada"}}`}, {"other", `{"value":"elsewhere"}`}} {
		if code, b := poolRequest(t, http.MethodPut, base+"/v1/pool/"+w[0], "key-a", w[1]); code != 200 {
			t.Fatalf("put %s: %d %s", w[0], code, b)
		}
	}
	hdr := map[string]string{"Authorization": "Bearer key-a", "X-Session-ID": "p1", "X-Pool-Prefix": "team/"}
	m1 := chatMessages(t, base, up, hdr, "What is our goal?")
	if len(m1) != 3 || contentOf(t, m1[0]) != "system: Be brief." {
		t.Fatalf("window %s", m1)
	}
	want := "## Shared pool (newest first)\n[SHARED:team/owner] {\"name\":\"Ada\"}\n[SHARED:team/goal] Ship the release by Friday.\n"
	if got := contentOf(t, m1[1]); !strings.HasPrefix(got, "system: ") || !strings.HasSuffix(got, want) || strings.Contains(got, "elsewhere") {
		t.Fatalf("stable block %q", got)
	}
	waitFor(t, srv, func() bool { return true })
	m2 := chatMessages(t, base, up, hdr, "And who leads?")
	for i := range 3 {
		if string(m2[i]) != string(m1[i]) {
			t.Fatalf("message %d moved without a pool change:\n%s\n%s", i, m1[i], m2[i])
		}
	}
	// A write under the prefix moves the block (and only then).
	if code, b := poolRequest(t, http.MethodPut, base+"/v1/pool/team%2Fstatus", "key-a", `{"value":"blocked"}`); code != 200 {
		t.Fatalf("put: %d %s", code, b)
	}
	waitFor(t, srv, func() bool { return true })
	m3 := chatMessages(t, base, up, hdr, "Status?")
	if got := contentOf(t, m3[1]); !strings.Contains(got, "[SHARED:team/status] blocked\n[SHARED:team/owner]") {
		t.Fatalf("after a write: %q", got)
	}
	// Without the header, and for another key, nothing of the pool.
	waitFor(t, srv, func() bool { return true })
	plain := chatMessages(t, base, up, map[string]string{"Authorization": "Bearer key-a", "X-Session-ID": "p2"}, "hi")
	other := chatMessages(t, base, up, map[string]string{"Authorization": "Bearer key-b", "X-Session-ID": "p1", "X-Pool-Prefix": "*"}, "hi")
	for _, msgs := range [][]json.RawMessage{plain, other} {
		for _, m := range msgs {
			if strings.Contains(string(m), "SHARED") {
				t.Fatalf("pool shown without opt-in or to another key: %s", msgs)
			}
		}
	}
	resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		map[string]string{"Authorization": "Bearer key-a", "X-Session-ID": "p1", "X-Pool-Prefix": "a\tb"})
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"code":"invalid_pool_prefix"`) {
		t.Fatalf("bad prefix: %d %s", resp.StatusCode, b)
	}
	if st := st.Stats(); st.PoolContextTurns != 3 {
		t.Fatalf("pool context turns %d", st.PoolContextTurns)
	}
}

// eventStream opens GET /v1/pool/events.
func eventStream(t *testing.T, url, key string, hdr map[string]string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewReader(resp.Body)
}

type sseEvent struct {
	id, name string
	data     map[string]any
	comment  bool
}

func nextSSE(t *testing.T, br *bufio.Reader) sseEvent {
	t.Helper()
	raw, err := readEvent(br)
	if err != nil {
		t.Fatalf("read event: %v (%q)", err, raw)
	}
	var ev sseEvent
	for line := range strings.Lines(raw) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, ":"):
			ev.comment = true
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(line[6:]), &ev.data); err != nil {
				t.Fatalf("data %q: %v", line, err)
			}
		}
	}
	return ev
}

// TestPoolEventsThroughProxy: GET /v1/pool/events streams the key's pool
// writes and deletes under the prefix as server-sent events; another
// key's writes and keys outside the prefix never show; a reconnect with
// Last-Event-ID is replayed what it missed; streams are bounded (429),
// need an API key (401) and a valid prefix (400); a client that leaves is
// unsubscribed; shutdown ends every stream with a reset.
func TestPoolEventsThroughProxy(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{Pool: memory.PoolOptions{MaxTenantSubscribers: 2}})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st; o.PoolEventsHeartbeat = 20 * time.Millisecond })
	resp, br := eventStream(t, base+"/v1/pool/events?prefix=team%2F", "key-a", nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %v", resp.StatusCode, resp.Header)
	}
	if ev := nextSSE(t, br); ev.name != "ready" || ev.data["rev"] != 0.0 || ev.data["prefix"] != "team/" {
		t.Fatalf("first event %+v", ev)
	}
	put := func(key, path, body string) {
		t.Helper()
		if code, b := poolRequest(t, http.MethodPut, base+"/v1/pool/"+path, key, body); code != 200 {
			t.Fatalf("put %s: %d %s", path, code, b)
		}
	}
	put("key-a", "team%2Fplan", `{"value":{"step":1}}`)
	put("key-a", "other", `{"value":2}`)
	put("key-b", "team%2Fplan", `{"value":"another key's"}`)
	if code, b := poolRequest(t, http.MethodDelete, base+"/v1/pool/team%2Fplan", "key-a", ""); code != 200 {
		t.Fatalf("delete: %d %s", code, b)
	}
	next := func() sseEvent {
		for {
			if ev := nextSSE(t, br); !ev.comment {
				return ev
			}
		}
	}
	ev := next()
	entry, _ := ev.data["entry"].(map[string]any)
	if ev.name != "put" || ev.id != "1" || ev.data["key"] != "team/plan" || entry == nil || entry["value"].(map[string]any)["step"] != 1.0 {
		t.Fatalf("put event %+v", ev)
	}
	if ev := next(); ev.name != "delete" || ev.id != "3" || ev.data["key"] != "team/plan" {
		t.Fatalf("delete event %+v (the write outside the prefix and the other key's must not show)", ev)
	}
	// Heartbeats keep the stream alive while nothing happens.
	for {
		if ev := nextSSE(t, br); ev.comment {
			break
		} else {
			t.Fatalf("unexpected event %+v", ev)
		}
	}

	// A reconnect after id 1 is replayed the delete.
	put("key-a", "team%2Fnext", `{"value":"n"}`)
	_, br2 := eventStream(t, base+"/v1/pool/events?prefix=team/", "key-a", map[string]string{"Last-Event-ID": "1"})
	if ev := nextSSE(t, br2); ev.name != "ready" || ev.data["rev"] != 4.0 {
		t.Fatalf("ready %+v", ev)
	}
	if ev := nextSSE(t, br2); ev.name != "delete" || ev.id != "3" {
		t.Fatalf("replayed %+v", ev)
	}
	if ev := nextSSE(t, br2); ev.name != "put" || ev.id != "4" || ev.data["key"] != "team/next" {
		t.Fatalf("replayed %+v", ev)
	}

	// Bounds and errors, OpenAI-shaped.
	for _, c := range []struct {
		url, key string
		code     int
		errCode  string
	}{
		{"/v1/pool/events", "key-a", 429, "too_many_event_streams"},
		{"/v1/pool/events?prefix=a%00b", "key-b", 400, "invalid_pool_prefix"},
		{"/v1/pool/events?last_event_id=x", "key-b", 400, "invalid_last_event_id"},
		{"/v1/pool/events", "", 401, "missing_api_key"},
	} {
		code, b := poolRequest(t, http.MethodGet, base+c.url, c.key, "")
		if code != c.code || !strings.Contains(b, `"code":"`+c.errCode+`"`) {
			t.Errorf("%s: %d %s", c.url, code, b)
		}
	}

	// A client that leaves is unsubscribed (at its next heartbeat).
	_ = resp.Body.Close()
	eventually(t, func() bool { return st.Stats().PoolSubscribers == 1 && srv.poolStreams.Load() == 1 })

	// Shutdown ends the open stream with a reset and the end of the body.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() { _ = srv.Shutdown(ctx) }()
	for {
		ev := nextSSE(t, br2)
		if ev.comment || ev.name == "put" {
			continue
		}
		if ev.name != "reset" || ev.data["reason"] != "shutdown" {
			t.Fatalf("at shutdown: %+v", ev)
		}
		break
	}
	if rest, err := io.ReadAll(br2); err != nil || len(rest) != 0 {
		t.Fatalf("after the reset: %q, %v", rest, err)
	}
	eventually(t, func() bool { return st.Stats().PoolSubscribers == 0 && srv.poolStreams.Load() == 0 })
}
