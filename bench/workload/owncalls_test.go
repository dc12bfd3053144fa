package workload

import (
	"net/http"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/recordup"
)

func TestGenerationAndOwnCalls(t *testing.T) {
	req := func(method, path, body, session string) recordup.Request {
		h := http.Header{}
		if session != "" {
			h.Set("X-Session-ID", session)
		}
		return recordup.Request{Method: method, Path: path, Body: []byte(body), Header: h}
	}
	for _, tc := range []struct {
		r            recordup.Request
		gen, bounded bool
	}{
		{req("POST", "/v1/chat/completions", `{"messages":[]}`, ""), true, false},
		{req("POST", "/v1/chat/completions?x=1", `{"max_tokens":512}`, ""), true, true},
		{req("POST", "/v1/completions", `{"max_completion_tokens":0}`, ""), true, true},
		{req("POST", "/completion", `{"n_predict":1}`, ""), true, true},
		{req("POST", "/completion", `{"n_predict":-1}`, ""), true, false},
		{req("POST", "/completion", `not json`, ""), true, false},
		{req("GET", "/v1/chat/completions", ``, ""), false, false},
		{req("POST", "/slots/0?action=save", `{"filename":"x"}`, ""), false, false},
		{req("POST", "/tokenize", `{"content":"x"}`, ""), false, false},
	} {
		if gen, bounded := Generation(tc.r); gen != tc.gen || bounded != tc.bounded {
			t.Errorf("%s %s %s: generation %t bounded %t", tc.r.Method, tc.r.Path, tc.r.Body, gen, bounded)
		}
	}
	reqs := []recordup.Request{
		req("POST", "/v1/chat/completions", `{}`, "s1"),                // a client's
		req("POST", "/v1/chat/completions", `{}`, ""),                  // own, unbounded
		req("POST", "/v1/chat/completions", `{"max_tokens":8}`, ""),    // own, bounded
		req("POST", "/slots/1?action=restore", `{"filename":"f"}`, ""), // not a generation
	}
	calls, unbounded := OwnGenerations(reqs, func(r recordup.Request) bool { return r.Header.Get("X-Session-ID") != "" })
	if calls != 2 || unbounded != 1 {
		t.Fatalf("calls %d, unbounded %d", calls, unbounded)
	}
}
