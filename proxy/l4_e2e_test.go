package proxy

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory"
)

// TestL4CompressionThroughProxy: facts extracted from a turn through the
// proxy pass the L4 threshold; the upstream, asked (upstreamExtractor) to
// merge each cluster, answers one merge that keeps its keywords and one
// that loses them. The first replaces its facts and shows its fidelity in
// the sessions API; the second is refused and its facts stay; /metrics
// counts both.
func TestL4CompressionThroughProxy(t *testing.T) {
	up := newKnowledgeUpstream(t)
	bg := upstreamExtractor(t, up)
	st := openMemory(t, memory.Options{
		Extraction: memory.ExtractionOptions{Extractor: bg, Every: 1, EpisodeEvery: -1},
		L4:         memory.L4Options{Enabled: true, Threshold: 6},
	})
	base, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory = st })
	kept := "The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes clusters daily."
	up.locked(func() {
		up.facts = []string{strings.Join([]string{
			"[ADD] The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes.",
			"[ADD] The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes daily.",
			"[ADD] The user deploys the api_server with HTTP_PROXY set in config.yaml on Kubernetes clusters.",
			"[ADD] 用户每年三月乘坐日本航空去东京旅行。",
			"[ADD] 用户每年三月乘坐日本航空去东京出差。",
			"[ADD] 用户每年三月乘坐日本航空去东京探亲。",
			"[ADD] The user works in Paris as a teacher.",
		}, "\n")}
		up.merge = [][2]string{{"api_server", "[MERGE] " + kept}, {"东京", "[MERGE] 用户喜欢旅行。"}}
	})
	hdr := map[string]string{"Authorization": "Bearer key-l4", "X-Session-ID": "l4"}
	if resp, b := post(t, base+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"I deploy our api_server on Kubernetes and fly to Tokyo every March."}]}`, hdr); resp.StatusCode != 200 {
		t.Fatalf("turn: %d %s", resp.StatusCode, b)
	}
	type unit struct {
		ID, Content, Category string
		Merged                *memory.MergeInfo
	}
	var facts []unit
	eventually(t, func() bool {
		// Both outcomes counted first, then the facts listed: a merge is
		// counted after it is applied, so the list is the merge's result
		// (listed first, a merge landing in between left a stale list).
		if st.Stats().L4Merged+st.Stats().L4Rejected != 2 {
			return false
		}
		var v struct{ Units []unit }
		if getJSON(t, base+"/v1/sessions/l4/memory", "key-l4", &v) != 200 {
			return false
		}
		facts = facts[:0]
		for _, u := range v.Units {
			if u.Category == "fact" {
				facts = append(facts, u)
			}
		}
		return true
	})
	var merged *unit
	tokyo := 0
	for i, u := range facts {
		switch {
		case u.Content == kept:
			merged = &facts[i]
		case strings.Contains(u.Content, "东京"):
			tokyo++
		case strings.Contains(u.Content, "api_server"):
			t.Fatalf("a merged original is still there: %+v", u)
		}
	}
	if merged == nil || merged.Merged == nil || len(merged.Merged.From) != 3 || merged.Merged.Fidelity < 0.5 ||
		merged.Merged.KeywordRetention != 1 || len(merged.Merged.LostKeywords) != 0 {
		t.Fatalf("merged fact %+v in %+v", merged, facts)
	}
	if tokyo != 3 || len(facts) != 5 {
		t.Fatalf("the refused merge's facts: %d of %d facts: %+v", tokyo, len(facts), facts)
	}
	up.locked(func() {
		if len(up.merges) != 2 || !strings.Contains(up.merges[1], "[SKIP]") {
			t.Fatalf("merge prompts %q", up.merges)
		}
	})
	resp, err := noPoolClient.Get(adminURL(t, base) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sidecar_memory_l4_merges_total{outcome="kept"} 1`, `sidecar_memory_l4_merges_total{outcome="rejected"} 1`,
		`sidecar_memory_l4_facts_merged_total 3`, `sidecar_memory_background_calls_total{kind="l4_merge"} 2`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	raw, _ := json.Marshal(merged.Merged)
	t.Logf("merged fact %s: %s", merged.ID, raw)
}
