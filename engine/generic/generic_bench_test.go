package generic

import (
	"context"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
)

// benchAnswer is a non-streamed chat answer as an OpenAI-compatible server
// sends it (usage, no llama.cpp timings).
var benchAnswer = []byte(`{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":"This is a canned answer from the kvsidecar mock upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":11,"total_tokens":23}}`)

// BenchmarkGenericStateless is the generic connector's whole cost for one
// stateless client request: Before, then After with the answer.
func BenchmarkGenericStateless(b *testing.B) {
	g := New(Options{})
	ctx := context.Background()
	resp := &engine.Response{Status: 200, Body: benchAnswer}
	b.ReportAllocs()
	for b.Loop() {
		req := &engine.Request{Model: "mock", Body: []byte(`{}`)}
		if _, err := g.Before(ctx, req); err != nil {
			b.Fatal(err)
		}
		g.After(ctx, req, resp)
	}
}
