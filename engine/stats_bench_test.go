package engine

import "testing"

// benchAnswer is a non-streamed chat answer as an OpenAI-compatible server
// sends it (usage, no llama.cpp timings): what a connector's After reads
// for every request the proxy forwards.
var benchAnswer = []byte(`{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":"This is a canned answer from the kvsidecar mock upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":11,"total_tokens":23}}`)

// BenchmarkParseTimings is the cost of reading an answer's prompt figures
// (ParseTimings), once per forwarded request.
func BenchmarkParseTimings(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ParseTimings(benchAnswer); !ok {
			b.Fatal("no usage")
		}
	}
}
