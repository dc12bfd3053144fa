package engine

import (
	"strings"
	"testing"
)

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
	// A key is read as decoded (escapes), and a later duplicate wins.
	f(`{"tim\u0069ngs":{"prompt_n":3},"u\u0073age":{"prompt_tokens":9}}`, Timings{PromptN: 3}, true)
	f(`{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`, Timings{PromptN: 2}, true)
	f(`{"usage":{"prompt_tokens":1},"usage":"x"}`, Timings{}, false)
	f(`{"Usage":{"prompt_tokens":1},"timingsx":{"prompt_n":1}}`, Timings{}, false)
	f(`{"choices":[]}`, Timings{}, false)
	f(`not json`, Timings{}, false)
	f(``, Timings{}, false)
}

// TestParseTimingsDeeplyNested: an answer of millions of nested brackets,
// from a broken or hostile upstream, gives nothing, without running out of
// stack (a fatal error the process cannot recover from).
func TestParseTimingsDeeplyNested(t *testing.T) {
	for _, body := range []string{
		`{"usage":` + strings.Repeat("[", 4<<20),
		"data: {\"usage\":" + strings.Repeat(`{"a":`, 1<<20) + "\n\n",
	} {
		if _, ok := ParseTimings([]byte(body)); ok {
			t.Fatalf("timings from a %d-byte nested body", len(body))
		}
	}
}
