package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/memory/memorytest"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// The helpers the proxy and admin tests share (packages sidecartest and
// memorytest).
var (
	// newRecordingUpstream starts an upstream that answers chat requests
	// with "echo: <last user text>" and keeps every request.
	newRecordingUpstream = sidecartest.NewRecordingUpstream
	openMemory           = memorytest.Open
	getJSON              = sidecartest.GetJSON
)

// recordingUpstream is package sidecartest's RecordingUpstream (Last, Bodies).
type recordingUpstream = sidecartest.RecordingUpstream

type sessionView struct {
	Messages []struct {
		Role, Content, Tier string
		Partial             bool
	}
}

func TestSessionMemoryWindowRecordsAndAdmin(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	hdr := map[string]string{"Authorization": "Bearer key-a", "X-Session-ID": "chat/1 é", "Accept-Encoding": "gzip"}

	// A full-history client: turn 2 repeats turn 1 and the reply.
	resp, b := post(t, base+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"my cat is Tom"}]}`, hdr)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "echo: my cat is Tom") {
		t.Fatalf("turn 1: %d %s", resp.StatusCode, b)
	}
	waitFor(t, srv, func() bool {
		var v sessionView
		return getJSON(t, base+"/v1/sessions/chat%2F1%20%C3%A9", "key-a", &v) == 200 && len(v.Messages) == 3
	})
	resp, b = post(t, base+"/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"my cat is Tom"},{"role":"assistant","content":"echo: my cat is Tom"},{"role":"user","content":"his name?"}]}`, hdr)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") {
		t.Fatalf("turn 2: %d %s", resp.StatusCode, b)
	}
	if got := up.Last(); !strings.HasPrefix(got, `[{"role":"system","content":"Be brief."}`) || !strings.HasSuffix(got, `{"role":"user","content":"his name?"}]`) {
		t.Fatalf("upstream window: %s", got)
	}
	// The streamed reply is recorded once the stream ends.
	var v sessionView
	waitFor(t, srv, func() bool {
		return getJSON(t, base+"/v1/sessions/chat%2F1%20%C3%A9", "key-a", &v) == 200 && len(v.Messages) == 5
	})
	if m := v.Messages[4]; m.Role != "assistant" || m.Content != "echo: his name?" || m.Partial {
		t.Fatalf("recorded reply %+v", m)
	}
	var mem struct{ Units []json.RawMessage }
	if code := getJSON(t, base+"/v1/sessions/chat%2F1%20%C3%A9/memory", "key-a", &mem); code != 200 {
		t.Fatalf("memory view: %d", code)
	}

	// Another API key never sees the session.
	if code := getJSON(t, base+"/v1/sessions/chat%2F1%20%C3%A9", "key-b", nil); code != 404 {
		t.Fatalf("other tenant got %d", code)
	}
	req, _ := http.NewRequest(http.MethodDelete, base+"/v1/sessions/chat%2F1%20%C3%A9", nil)
	req.Header.Set("Authorization", "Bearer key-b")
	if r, _ := noPoolClient.Do(req); r.StatusCode != 404 {
		t.Fatalf("other tenant delete: %d", r.StatusCode)
	}
	req.Header.Set("Authorization", "Bearer key-a")
	if r, _ := noPoolClient.Do(req); r.StatusCode != 200 {
		t.Fatalf("delete: %d", r.StatusCode)
	}
	if code := getJSON(t, base+"/v1/sessions/chat%2F1%20%C3%A9", "key-a", nil); code != 404 {
		t.Fatalf("deleted session answers %d", code)
	}
	for _, bad := range []string{"/v1/sessions/" + strings.Repeat("x", 300), "/v1/sessions/a/b/c", "/v1/sessions/%09x"} {
		if code := getJSON(t, base+bad, "key-a", nil); code != 400 {
			t.Errorf("%s answered %d, want 400", bad, code)
		}
	}
}

func TestSessionMemoryErrorsAreOpenAIShaped(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{Window: memory.WindowOptions{Limit: 128, SystemReserve: 8, ToolsReserve: 8}})
	base, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	hdr := map[string]string{"X-Session-ID": "s", "Authorization": "Bearer k"}
	resp, b := post(t, base+"/v1/chat/completions", `{"messages":[{"content":"no role"}]}`, hdr)
	wantOpenAIError(t, resp, b, 400, "invalid_messages")
	// Over --window-tokens but maybe not over the engine's context: the
	// window is a ceiling for what memory adds, never a refusal, so the
	// request goes exactly as sent and the engine decides.
	huge := `[{"role":"user","content":"` + strings.Repeat("word ", 500) + `"}]`
	resp, b = post(t, base+"/v1/chat/completions", `{"messages":`+huge+`}`, hdr)
	if resp.StatusCode != 200 || up.Last() != huge {
		t.Fatalf("a request over the window: %d %.200s, upstream got %.200s", resp.StatusCode, b, up.Last())
	}
}

// TestDropInClientAndUserScope: a client that sends only its system
// message and newest message, with no mode header, is taken as an append
// (counted in /metrics as detected); X-User-ID, else the body's "user",
// scopes recall across sessions; a malformed user id is a 400.
func TestDropInClientAndUserScope(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	send := func(session, user, bodyUser, text string) {
		t.Helper()
		hdr := map[string]string{"Authorization": "Bearer k", "X-Session-ID": session}
		if user != "" {
			hdr["X-User-ID"] = user
		}
		extra := ""
		if bodyUser != "" {
			extra = fmt.Sprintf(`,"user":%q`, bodyUser)
		}
		resp, b := post(t, base+"/v1/chat/completions", `{"model":"m"`+extra+`,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":`+fmt.Sprintf("%q", text)+`}]}`, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", text, resp.StatusCode, b)
		}
	}
	send("s1", "ada", "", "my boat is called Petrel")
	waitFor(t, srv, func() bool {
		var v sessionView
		return getJSON(t, base+"/v1/sessions/s1", "k", &v) == 200 && len(v.Messages) == 3
	})
	send("s1", "ada", "", "it is moored in Kiel")
	if got := up.Last(); !strings.Contains(got, "my boat is called Petrel") || !strings.Contains(got, "echo: my boat is called Petrel") {
		t.Fatalf("second drop-in request lost the conversation: %s", got)
	}
	waitFor(t, srv, func() bool {
		var v sessionView
		return getJSON(t, base+"/v1/sessions/s1", "k", &v) == 200 && len(v.Messages) == 5
	})
	// The worker indexes a finished turn for the user's other sessions.
	eventually(t, func() bool {
		send("s2-probe", "", "ada", "what is my boat called?")
		return strings.Contains(up.Last(), "Petrel")
	})
	if got := up.Last(); !strings.Contains(got, "another session") {
		t.Fatalf("body user: not recalled across sessions: %s", got)
	}
	send("s3", "bob", "", "what is my boat called?")
	if strings.Contains(up.Last(), "Petrel") {
		t.Fatalf("another user recalls ada's session: %s", up.Last())
	}
	resp, b := post(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`,
		map[string]string{"Authorization": "Bearer k", "X-Session-ID": "s4", "X-User-ID": "bad\tuser"})
	wantOpenAIError(t, resp, b, 400, "invalid_user")
	resp, b = post(t, base+"/v1/chat/completions", `{"user":7,"messages":[{"role":"user","content":"x"}]}`, map[string]string{"Authorization": "Bearer k", "X-Session-ID": "s4"})
	wantOpenAIError(t, resp, b, 400, "invalid_request")

	r, err := noPoolClient.Get(adminURL(t, base) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{`sidecar_memory_turns_by_mode_total{mode="append",how="detected"}`, `sidecar_memory_background_calls_total{kind="facts"}`,
		"sidecar_memory_background_calls_per_turn", "sidecar_memory_recalled_cross_session_total"} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(string(metrics), `sidecar_memory_turns_by_mode_total{mode="append",how="detected"} `) ||
		strings.Contains(string(metrics), `sidecar_memory_turns_by_mode_total{mode="append",how="detected"} 0`+"\n") {
		t.Fatalf("detected appends not counted:\n%s", metrics)
	}
}

func TestStreamCutShortIsRecordedAsPartial(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"half an ans\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer up.Close()
	defer close(release)
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })

	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"tell me"}]}`))
	req.Header.Set("X-Session-ID", "cut")
	req.Header.Set("Authorization", "Bearer k")
	resp, err := noPoolClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := make([]byte, 4096)
	if n, err := resp.Body.Read(br); n == 0 || err != nil && err != io.EOF {
		t.Fatalf("first event: %d %v", n, err)
	}
	resp.Body.Close() // the client walks away mid-stream

	var v sessionView
	waitFor(t, srv, func() bool {
		return getJSON(t, base+"/v1/sessions/cut", "k", &v) == 200 && len(v.Messages) == 2
	})
	if m := v.Messages[1]; m.Role != "assistant" || m.Content != "half an ans" || !m.Partial {
		t.Fatalf("partial reply %+v", m)
	}
}

func TestKVAPI(t *testing.T) {
	c, err := kv.Open(kv.Options{Store: tiers.Options{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	base, _ := startSidecar(t, "http://127.0.0.1:1", func(o *Options) { o.KV = c; o.MaxKVBytes = 1 << 16 })

	do := func(method, path, key string, body []byte, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		h := map[string]string{"Authorization": "Bearer " + key}
		maps.Copy(h, hdr)
		return sidecartest.Do(t, noPoolClient, method, base+path, string(body), h)
	}
	data := make([]byte, 2*3*4*2) // f16, shape 2,3,4
	for i := range data {
		data[i] = byte(i * 7)
	}
	path := "/v1/kv/llama%2F8b/..%2F..%2Fetc%2Fpasswd"
	resp, b := do("PUT", path, "k1", data, map[string]string{"X-KV-Dtype": "f16", "X-KV-Shape": "2,3,4", "Content-Type": "application/octet-stream"})
	if resp.StatusCode != 201 {
		t.Fatalf("PUT %d %s", resp.StatusCode, b)
	}
	resp, b = do("GET", path, "k1", nil, nil)
	if resp.StatusCode != 200 || string(b) != string(data) || resp.Header.Get("X-KV-Dtype") != "f16" ||
		resp.Header.Get("X-KV-Shape") != "2,3,4" || resp.Header.Get("X-KV-Tier") == "" {
		t.Fatalf("GET %d %v len %d", resp.StatusCode, resp.Header, len(b))
	}
	resp, _ = do("HEAD", path, "k1", nil, nil)
	if resp.StatusCode != 200 || resp.ContentLength != int64(len(data)) || resp.Header.Get("X-KV-Tier") == "" {
		t.Fatalf("HEAD %d %d %v", resp.StatusCode, resp.ContentLength, resp.Header)
	}
	resp, b = do("GET", path, "k2", nil, nil) // another tenant
	wantOpenAIError(t, resp, b, 404, "kv_not_found")
	resp, b = do("PUT", "/v1/kv/ns/bad", "k1", data, map[string]string{"X-KV-Shape": "2,x"})
	wantOpenAIError(t, resp, b, 400, "invalid_kv_meta")
	resp, b = do("PUT", "/v1/kv/ns/mismatch", "k1", data, map[string]string{"X-KV-Dtype": "f32", "X-KV-Shape": "2,3,4"})
	wantOpenAIError(t, resp, b, 400, "invalid_kv")
	resp, b = do("PUT", "/v1/kv/ns/big", "k1", make([]byte, 1<<16+1), nil)
	wantOpenAIError(t, resp, b, 413, "body_too_large")
	resp, b = do("PUT", "/v1/kv/only-namespace", "k1", data, nil)
	wantOpenAIError(t, resp, b, 400, "invalid_path")
	resp, _ = do("DELETE", path, "k1", nil, nil)
	if resp.StatusCode != 204 {
		t.Fatalf("DELETE %d", resp.StatusCode)
	}
	resp, b = do("GET", path, "k1", nil, nil)
	wantOpenAIError(t, resp, b, 404, "kv_not_found")
}

func TestPoolAPI(t *testing.T) {
	st := openMemory(t, memory.Options{})
	base, _ := startSidecar(t, "http://127.0.0.1:1", func(o *Options) { o.Memory = st })
	do := func(method, path, key, body string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Session-ID", "writer-1")
		resp, err := noPoolClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	var e memory.PoolEntry
	resp, b := do("PUT", "/v1/pool/team%2Fplan", "k", `{"value":{"step":1},"metadata":{"by":"a"}}`)
	if resp.StatusCode != 200 || json.Unmarshal(b, &e) != nil || e.Version == 0 || e.Creator != "writer-1" {
		t.Fatalf("put: %d %s", resp.StatusCode, b)
	}
	stale := e.Version
	resp, b = do("PUT", "/v1/pool/team%2Fplan", "k", `{"value":{"step":2}}`) // last writer wins
	if resp.StatusCode != 200 {
		t.Fatalf("overwrite: %d %s", resp.StatusCode, b)
	}
	resp, b = do("PUT", "/v1/pool/team%2Fplan", "k", fmt.Sprintf(`{"value":{"step":3},"expected_version":%d}`, stale))
	if resp.StatusCode != 409 || !strings.Contains(string(b), `"version_conflict"`) || !strings.Contains(string(b), `"step":2`) {
		t.Fatalf("stale write: %d %s", resp.StatusCode, b)
	}
	do("PUT", "/v1/pool/team%2Fnotes", "k", `{"value":"x"}`)
	do("PUT", "/v1/pool/other", "k", `{"value":"y"}`)
	var list struct{ Data []memory.PoolEntry }
	resp, b = do("GET", "/v1/pool?prefix=team/", "k", "")
	if resp.StatusCode != 200 || json.Unmarshal(b, &list) != nil || len(list.Data) != 2 || list.Data[0].Key != "team/notes" {
		t.Fatalf("list: %d %s", resp.StatusCode, b)
	}
	resp, b = do("GET", "/v1/pool/team%2Fplan", "other-key", "")
	wantOpenAIError(t, resp, b, 404, "pool_key_not_found")
	resp, b = do("PUT", "/v1/pool/x", "k", `not json`)
	wantOpenAIError(t, resp, b, 400, "invalid_pool_write")
	resp, _ = do("DELETE", "/v1/pool/other", "k", "")
	if resp.StatusCode != 200 {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	resp, b = do("GET", "/v1/pool/other", "k", "")
	wantOpenAIError(t, resp, b, 404, "pool_key_not_found")
}

func TestStreamReplyAccumulatesTextAndToolCalls(t *testing.T) {
	var sr streamReply
	for _, d := range []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":"Let me "}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"check."}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"ci"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Oslo\"}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","function":{"name":"noop","arguments":"{}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":99999,"id":"bogus"}]}}]}`,
		`{"choices":[],"usage":{"total_tokens":9}}`,
	} {
		sr.add([]byte(d), 1<<20)
	}
	msgs, err := memory.ParseMessages(append(append([]byte("["), sr.message()...), ']'))
	if err != nil || len(msgs) != 1 {
		t.Fatalf("reply %s: %v", sr.message(), err)
	}
	want := `{"role":"assistant","content":"Let me check.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}},{"id":"call_2","type":"function","function":{"name":"noop","arguments":"{}"}}]}`
	if string(sr.message()) != want || msgs[0].Content != "Let me check." {
		t.Fatalf("reply\n got %s\nwant %s", sr.message(), want)
	}
	var empty streamReply
	if empty.message() != nil {
		t.Fatal("an empty stream made a reply")
	}
}

// Issue 12 rows 4 and 15: a stream that stops without [DONE] is a partial
// turn; a complete answer is in the session before the client sees its
// end, streamed or not.
func TestStreamEndDecidesTheRecordedTurn(t *testing.T) {
	chunk := func(s string) string {
		return fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", s)
	}
	cases := []struct {
		name    string
		events  []string
		partial bool
	}{
		{"cut without [DONE]", []string{chunk("one "), chunk("two "), chunk("three")}, true},
		{"complete", []string{chunk("one "), chunk("two "), chunk("three"), "data: [DONE]\n\n"}, false},
		{"finish_reason without [DONE]", []string{chunk("one "), chunk("two "), chunk("three"),
			"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := streamUpstream(t, c.events, nil, nil)
			defer up.Close()
			st := openMemory(t, memory.Options{})
			base, srv := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
			hdr := map[string]string{"Authorization": "Bearer k", "X-Session-ID": "s"}
			resp, err := func() (*http.Response, error) {
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"count"}]}`))
				for k, v := range hdr {
					req.Header.Set(k, v)
				}
				return noPoolClient.Do(req)
			}()
			if err != nil {
				t.Fatal(err)
			}
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if c.partial {
				if rerr == nil || !strings.Contains(string(body), "event: error") || strings.Contains(string(body), "data: [DONE]") {
					t.Fatalf("a cut stream reached the client as %q, %v", body, rerr)
				}
			} else if rerr != nil || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
				t.Fatalf("complete stream: %q, %v", body, rerr)
			}
			var v sessionView
			if c.partial {
				waitFor(t, srv, func() bool { return getJSON(t, base+"/v1/sessions/s", "k", &v) == 200 && len(v.Messages) == 2 })
			} else if getJSON(t, base+"/v1/sessions/s", "k", &v) != 200 || len(v.Messages) != 2 {
				// No waiting: the reply was recorded before [DONE] went out.
				t.Fatalf("reply not recorded when the client had [DONE]: %+v", v)
			}
			if m := v.Messages[1]; m.Role != "assistant" || m.Content != "one two three" || m.Partial != c.partial {
				t.Fatalf("recorded %+v, want partial=%v", m, c.partial)
			}
		})
	}
	t.Run("not streamed", func(t *testing.T) {
		up := newRecordingUpstream(t)
		st := openMemory(t, memory.Options{})
		base, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
		for i := range 20 {
			msg := fmt.Sprintf("turn %d", i)
			resp, b := post(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"`+msg+`"}]}`,
				map[string]string{"Authorization": "Bearer k", "X-Session-ID": "plain", "X-Session-Mode": "append"})
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			var v sessionView
			if getJSON(t, base+"/v1/sessions/plain", "k", &v) != 200 || len(v.Messages) != 2*(i+1) || v.Messages[2*i+1].Content != "echo: "+msg {
				t.Fatalf("turn %d: reply not recorded when the client had the answer: %+v", i, v.Messages)
			}
		}
	})
}
