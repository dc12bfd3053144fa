package workload

// The sidecar's own calls as they reach an engine: requests recorded by
// bench/harness/recordup in front of a llama-server, sorted into the clients'
// turns and the sidecar's own generations, and whether each generation
// bounds its length. A random-weight model never ends an answer, and a
// real one may ramble: a generation without max_tokens holds a slot until
// the context is full.

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/kvsidecar/kvsidecar/bench/harness/recordup"
)

// Generation reports whether r asks the engine to generate text (a POST
// to a chat or text completions route: /v1/chat/completions,
// /v1/completions, llama.cpp's /completion), and bounded whether its body
// carries a length limit (max_tokens, max_completion_tokens or n_predict,
// at least 0; llama.cpp's n_predict -1 is no limit).
func Generation(r recordup.Request) (generation, bounded bool) {
	path, _, _ := strings.Cut(r.Path, "?")
	if r.Method != http.MethodPost || !strings.HasSuffix(path, "/completions") && path != "/completion" {
		return false, false
	}
	var b struct {
		MaxTokens           *int `json:"max_tokens"`
		MaxCompletionTokens *int `json:"max_completion_tokens"`
		NPredict            *int `json:"n_predict"`
	}
	_ = json.Unmarshal(r.Body, &b)
	for _, v := range []*int{b.MaxTokens, b.MaxCompletionTokens, b.NPredict} {
		bounded = bounded || v != nil && *v >= 0
	}
	return true, bounded
}

// OwnGenerations counts the generations among reqs that no client sent
// (client says which requests are a client's, e.g. by X-Session-ID), and
// how many of them carry no length limit.
func OwnGenerations(reqs []recordup.Request, client func(recordup.Request) bool) (calls, unbounded int) {
	for _, r := range reqs {
		gen, bounded := Generation(r)
		if !gen || client(r) {
			continue
		}
		calls++
		if !bounded {
			unbounded++
		}
	}
	return calls, unbounded
}
