package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func TestParseRequest(t *testing.T) {
	info, err := parseRequest(epChat, []byte(` {"model":"llama","stream":true,"prompt_cache_key":"s1","messages":[{"role":"user","content":"x"}]}`))
	if err != nil || info.Model != "llama" || !info.Stream || info.PromptCacheKey != "s1" || string(info.Messages) != `[{"role":"user","content":"x"}]` {
		t.Fatalf("got %+v, %v", info, err)
	}
	if _, err := parseRequest(epCompletions, []byte(`{"prompt":["a","b"]}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := parseRequest(epEmbeddings, []byte(`{"input":"a","stream":true}`)); err == nil {
		t.Fatal("streamed embeddings accepted")
	}
	_, err = parseRequest(epChat, []byte(`{"messages":[],"model":7}`))
	var bad *badRequestError
	if !errors.As(err, &bad) || bad.msg != "invalid type for 'model': expected string" {
		t.Fatalf("type error = %v", err)
	}
}

// TestParseRequestReadsKeysAsEncodingJSON: an escaped key is the key it
// spells, a later duplicate wins, case counts, and members of nested
// objects are not the request's; tools and functions are kept raw.
func TestParseRequestReadsKeysAsEncodingJSON(t *testing.T) {
	body := []byte(`{"model":"a","mod\u0065l":"b","MODEL":"c","x":{"model":"d","stream":true},"messages":[],` +
		`"max_tokens":null,"max_completion_tokens":32,"tools":[{"type":"function"}],"functions":null,"user":"u","user":"v"}`)
	info, err := parseRequest(epChat, body)
	if err != nil || info.Model != "b" || info.Stream || info.MaxTokens != 32 || info.User != "v" ||
		string(info.Tools) != `[{"type":"function"}]` || string(info.Messages) != `[]` {
		t.Fatalf("got %+v, %v", info, err)
	}
	for _, bad := range []string{`{"messages":[],}`, `{"messages":[] "model":"m"}`, `{"messages":"[]"}`, `{"messages":[]}x`} {
		if _, err := parseRequest(epChat, []byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// The strings parseRequest returns are the request's own: the body's
// buffer, which fasthttp reuses after the handler, may change under them.
func TestParseRequestStringsOutliveTheBody(t *testing.T) {
	body := []byte(`{"model":"reused-model","user":"u1","prompt_cache_key":"k1","messages":[]}`)
	info, err := parseRequest(epChat, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'x'
	}
	if info.Model != "reused-model" || info.User != "u1" || info.PromptCacheKey != "k1" {
		t.Fatalf("strings changed with the body: %q %q %q", info.Model, info.User, info.PromptCacheKey)
	}
}

func TestTenantOf(t *testing.T) {
	a, b := tenantOf([]byte("Bearer sk-one")), tenantOf([]byte("bearer  sk-one "))
	if a != b || a == "" || a == anonymousTenant || len(a) != 18 {
		t.Fatalf("tenant %q vs %q", a, b)
	}
	if tenantOf([]byte("Bearer sk-two")) == a {
		t.Fatal("two keys share a tenant")
	}
	for _, h := range []string{"", " ", "Bearer", "Bearer ", "bearer \t ", "BEARER"} {
		if got := tenantOf([]byte(h)); got != "" {
			t.Fatalf("Authorization %q has no key but got tenant %q", h, got)
		}
	}
	if tenantOf([]byte("Basic dXNlcjpwdw==")) == "" || tenantOf([]byte("Bearerx")) == "" {
		t.Fatal("a credential that is not a bearer token is a tenant of its own")
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"prompt":"x","prompt_cache_key":"k"}`, `{"input":["a"]}`, `[]`, `{`, `{"messages":null}`,
		"{\"messages\":[],\"model\":\"\xff\"}", ``,
	} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, body []byte, kind uint8) {
		ep := endpoint(kind%4) + 0
		info, err := parseRequest(ep, body)
		if err != nil {
			var bad *badRequestError
			if !errors.As(err, &bad) || bad.msg == "" {
				t.Fatalf("error %v is not a client message", err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil {
			t.Fatalf("accepted a non-object %q", body)
		}
		if ep == epChat && !isJSONArray(m["messages"]) {
			t.Fatalf("accepted chat without messages: %q", body)
		}
		if info.Stream && ep == epEmbeddings {
			t.Fatal("accepted streamed embeddings")
		}
	})
}

func TestReplaceValue(t *testing.T) {
	f := func(body, key, val, want string) {
		t.Helper()
		got, err := replaceValue([]byte(body), key, []byte(val))
		if err != nil || string(got) != want {
			t.Errorf("replaceValue(%s, %s) = %s, %v; want %s", body, key, got, err, want)
		}
	}
	f(`{"model":"m", "messages" : [1, 2] ,"x":{"messages":3}}`, "messages", `[9]`, `{"model":"m", "messages" : [9] ,"x":{"messages":3}}`)
	f(`{"messages":"a\"]}","stream":true}`, "messages", `[]`, `{"messages":[],"stream":true}`)
	f(`{"a":{"b":[{}]},"messages":[{"role":"user"}]}`, "messages", `[0]`, `{"a":{"b":[{}]},"messages":[0]}`)
	if _, err := replaceValue([]byte(`{"a":1}`), "messages", []byte(`[]`)); err == nil {
		t.Error("missing key accepted")
	}
}

func isJSONArray(raw json.RawMessage) bool {
	raw = bytes.Trim(raw, jsonSpace)
	return len(raw) > 0 && raw[0] == '['
}
