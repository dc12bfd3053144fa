package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/memory"
)

// TestPoolContextKeepsLlamaPrefixCache: against a real llama-server, a
// session that shows its key's pool (X-Pool-Prefix) keeps the engine's
// prefix cache from turn to turn (cache_n covers the previous prompt), a
// write elsewhere in the pool changes nothing, and a write under the
// prefix moves the prompt only from the pool section on: the engine
// reuses what precedes it and reprocesses the rest once, then hits again.
func TestPoolContextKeepsLlamaPrefixCache(t *testing.T) {
	llama := llamatest.Start(t, llamaserver.Options{Slots: 1, Threads: 1})
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, llama.URL(), func(o *Options) { o.Memory = st })
	put := func(path, body string) {
		t.Helper()
		if code, b := poolRequest(t, http.MethodPut, base+"/v1/pool/"+path, "key-l", body); code != 200 {
			t.Fatalf("put %s: %d %s", path, code, b)
		}
	}
	put("team%2Fgoal", `{"value":"Ship the release on Friday; the changelog is in docs/CHANGES.md."}`)
	put("team%2Fowner", `{"value":{"name":"Ada","role":"release lead","backup":"Grace"}}`)
	hdr := map[string]string{"Authorization": "Bearer key-l", "X-Session-ID": "pool-llama", "X-Pool-Prefix": "team/"}
	system := strings.Repeat("You are a terse assistant for the release team. ", 8)
	type timings struct {
		CacheN  int `json:"cache_n"`
		PromptN int `json:"prompt_n"`
	}
	turn := func(i int) timings {
		t.Helper()
		body := `{"model":"m","max_tokens":4,"grammar":"root ::= [a-z ]+","messages":[{"role":"system","content":` +
			jsonString(system) + `},{"role":"user","content":` + jsonString(strings.Repeat("question "+string(rune('a'+i))+" ", 6)) + `}]}`
		resp, b := post(t, base+"/v1/chat/completions", body, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, b)
		}
		var out struct{ Timings timings }
		if err := json.Unmarshal(b, &out); err != nil || out.Timings.PromptN+out.Timings.CacheN == 0 {
			t.Fatalf("turn %d: no timings in %s (%v)", i, b, err)
		}
		waitFor(t, srv, func() bool { return true })
		return out.Timings
	}
	t1 := turn(1)
	t2 := turn(2)
	if t2.CacheN < t1.CacheN+t1.PromptN {
		t.Fatalf("turn 2 reused %d tokens; turn 1's prompt was %d", t2.CacheN, t1.CacheN+t1.PromptN)
	}
	put("other", `{"value":"not under the prefix"}`)
	t3 := turn(3)
	if t3.CacheN < t2.CacheN+t2.PromptN {
		t.Fatalf("a write outside the prefix broke the cache: turn 3 reused %d of %d", t3.CacheN, t2.CacheN+t2.PromptN)
	}
	put("team%2Fstatus", `{"value":"blocked on review"}`)
	t4 := turn(4)
	if t4.CacheN >= t3.CacheN || t4.CacheN < len(system)/2 {
		t.Fatalf("after a write under the prefix turn 4 reused %d tokens (turn 3: %d); want the system message and less than before", t4.CacheN, t3.CacheN)
	}
	t5 := turn(5)
	if t5.CacheN < t4.CacheN+t4.PromptN {
		t.Fatalf("turn 5 reused %d tokens; turn 4's prompt was %d", t5.CacheN, t4.CacheN+t4.PromptN)
	}
	t.Logf("cache_n/prompt_n per turn: %d/%d %d/%d %d/%d (write outside the prefix) %d/%d (write under it) %d/%d",
		t1.CacheN, t1.PromptN, t2.CacheN, t2.PromptN, t3.CacheN, t3.PromptN, t4.CacheN, t4.PromptN, t5.CacheN, t5.PromptN)
}
