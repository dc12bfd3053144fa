package engine

import (
	"context"
	"encoding/json"
	"testing"
)

func TestSetSlotFields(t *testing.T) {
	f := func(in string, slot int, want string) {
		t.Helper()
		got, err := setSlotFields([]byte(in), slot)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if string(got) != want {
			t.Fatalf("%s:\n got %s\nwant %s", in, got, want)
		}
		if !json.Valid(got) {
			t.Fatalf("invalid JSON %s", got)
		}
	}
	f(`{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.10}`, 3,
		`{"id_slot":3,"cache_prompt":true,"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.10}`)
	f(`  {}`, 0, `{"id_slot":0,"cache_prompt":true}`)
	f("{ \"a\" : 1 }\n", 1, "{\"id_slot\":1,\"cache_prompt\":true,\"a\" : 1 }\n")
	// Client values are replaced, other members keep order and bytes.
	f(`{"model":"m","id_slot":7,"x":1e-7,"cache_prompt":false,"z":{"id_slot":1}}`, 2,
		`{"id_slot":2,"cache_prompt":true,"model":"m","x":1e-7,"z":{"id_slot":1}}`)
	for _, bad := range []string{``, `[]`, `"x"`, `{"a":`, `{"a":1} {"b":2}`, `nul`} {
		out, err := setSlotFields([]byte(bad), 1)
		if err == nil || string(out) != bad {
			t.Errorf("%q: %q, %v", bad, out, err)
		}
	}
}

func TestParseTimings(t *testing.T) {
	f := func(body string, want Timings, wantOK bool) {
		t.Helper()
		got, ok := ParseTimings([]byte(body))
		if ok != wantOK || got != want {
			t.Fatalf("%s: %+v %t, want %+v %t", body, got, ok, want, wantOK)
		}
	}
	f(`{"choices":[],"timings":{"cache_n":1315,"prompt_n":1,"prompt_ms":1.5,"predicted_n":4,"predicted_ms":8}}`,
		Timings{CacheN: 1315, PromptN: 1, PromptMs: 1.5, PredictedN: 4, PredictedMs: 8}, true)
	// OpenAI-style usage only: the uncached part is prefilled.
	f(`{"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":64}}}`,
		Timings{CacheN: 64, PromptN: 36}, true)
	f(`{"usage":{"prompt_tokens":100}}`, Timings{PromptN: 100}, true)
	// SSE: the event with timings wins; [DONE] and others are skipped.
	f("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"timings\":{\"cache_n\":5,\"prompt_n\":2,\"prompt_ms\":0.5}}\n\ndata: [DONE]\n\n",
		Timings{CacheN: 5, PromptN: 2, PromptMs: 0.5}, true)
	// llama.cpp timings without cache_n take usage's cached tokens.
	f(`{"timings":{"prompt_n":3,"cache_n":null},"usage":{"prompt_tokens_details":{"cached_tokens":7}}}`,
		Timings{CacheN: 7, PromptN: 3}, true)
	f(`{"timings":null,"usage":{"prompt_tokens":5,"prompt_tokens_details":null}}`, Timings{PromptN: 5}, true)
	// As strict as decoding into typed fields: a wrong type anywhere it
	// reads, or a body that is not one JSON object, gives nothing.
	for _, bad := range []string{`{"usage":"x"}`, `{"timings":1}`, `{"timings":{"prompt_n":"a"}}`,
		`{"timings":{"prompt_n":1.5}}`, `{"usage":{"prompt_tokens":1e2}}`, `{"timings":{"prompt_ms":"1"}}`,
		`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":"9"}}}`,
		`{"usage":{"prompt_tokens":5}} x`, `{"usage":{"prompt_tokens":5}`} {
		f(bad, Timings{}, false)
	}
	f(`{"choices":[]}`, Timings{}, false)
	f(`not json`, Timings{}, false)
	f(``, Timings{}, false)
}

func TestGeneric(t *testing.T) {
	g := NewGeneric(GenericOptions{})
	req := &Request{Tenant: "t", SessionID: "s", Model: "m", Body: []byte(`{"model":"m"}`)}
	body, err := g.Before(context.Background(), req)
	if err != nil || string(body) != `{"model":"m"}` {
		t.Fatalf("%s %v", body, err)
	}
	g.After(context.Background(), req, &Response{Status: 200, Body: []byte(`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":8}}}`)})
	g.After(context.Background(), req, &Response{Status: 502})
	s := g.Stats()
	if s.Requests != 1 || s.Responses != 2 || s.TimedResponses != 1 || s.Timings.CacheN != 8 || s.CachedRatio != 0.8 || !s.Enabled {
		t.Fatalf("%+v", s)
	}
	if _, ok := g.SessionStats("t", "s"); ok {
		t.Fatal("generic keeps sessions")
	}
	var _ Connector = g
	var _ Connector = (*LlamaCPP)(nil)
}
