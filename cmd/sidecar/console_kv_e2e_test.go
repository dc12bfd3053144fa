package main

// The console's KV page in a browser, in front of a real llama-server
// (console_e2e_test.go holds the harness).

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
)

// TestConsoleKVViewInBrowser: the KV page of a sidecar in front of a real
// llama-server (three conversations over one slot, so states are saved,
// evicted and restored) shows the hit rate, tiers, engine states and
// tokens not reprocessed that the API reports, and plots them.
func TestConsoleKVViewInBrowser(t *testing.T) {
	chromiumPath(t)
	llama := llamatest.Start(t, llamaserver.Options{Model: llamatest.Model(t), Slots: 1, CacheRAMMiB: -1, Threads: 1,
		Args: []string{"--n-predict", "128"}})
	s := &realStack{t: t, llama: llama, dataDir: t.TempDir(), log: filepath.Join(t.TempDir(), "sidecar.log")}
	s.args = []string{"--upstream", llama.URL(), "--data-dir", s.dataDir, "--engine", "llamacpp",
		"--llamacpp-slot-dir", llama.SlotDir(), "--llamacpp-slots", "1", "--extract=false",
		"--admin-token", consoleToken, "--console-sample-every", "250ms"}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(s.log)
			t.Logf("sidecar log ends:\n%s", tail(string(b), 4000))
		}
	})
	s.startSidecar()
	var cs []*convo
	for i := range 3 {
		doc, _ := realDoc(t, llama, 40+i, 400)
		cs = append(cs, newConvo(fmt.Sprintf("kv-view-%d", i), doc))
	}
	for round := range 2 {
		for _, c := range cs {
			s.say(c, "Item "+strconv.Itoa(round+1)+"?")
		}
	}
	s.waitIdle()

	p := openConsole(t, s.sc.admin)
	p.signIn()
	p.click("#tab-kv")
	p.do(chromedp.WaitVisible(chromedp.ID("page-kv")))
	p.waitCount("#plot-hitrate svg", 1)
	p.waitCount("#plot-tiers svg path", 3) // one line per tier
	p.waitCount("#plot-tokens svg path", 3)

	var v struct {
		KV struct {
			Hits, Misses int64
			HitRate      float64 `json:"hit_rate"`
			Tiers        []struct {
				Tier    string
				Entries int
			}
		}
		Engine struct {
			Restores int64
			States   int
			Timings  struct {
				CacheN int64 `json:"cache_n"`
			}
		}
	}
	adminGet(t, s.sc.admin, "kv", &v)
	if v.KV.Hits == 0 || v.Engine.Restores == 0 {
		t.Fatalf("three sessions over one slot restored nothing: %+v", v)
	}
	p.waitText("#card-hitrate .v", fmt.Sprintf("%.1f%%", 100*v.KV.HitRate))
	p.waitText("#card-hitrate .s", fmt.Sprintf("%d hits, %d misses", v.KV.Hits, v.KV.Misses))
	p.waitText("#card-reused .v", thousands(v.Engine.Timings.CacheN))
	for _, tr := range v.KV.Tiers {
		p.waitText(fmt.Sprintf(`#tiers-table tr[data-tier=%q] td:nth-child(2)`, tr.Tier), thousands(int64(tr.Entries)))
	}
	p.waitText("#engine-facts", fmt.Sprintf("%d (", v.Engine.States))
	p.waitCount("#plot-hitrate svg path", 3) // every series has values
	p.distinctSwatches(9)
	var th struct{ Thresholds []map[string]any }
	adminGet(t, s.sc.admin, "kv", &th)
	for _, x := range th.Thresholds {
		t.Logf("threshold %v: known %v, value %.4g (limit %v), breached %v", x["alert"], x["known"], x["value"], x["limit"], x["breached"])
	}
	p.shot("06-kv")
	p.noProblems("KV page")
}

// thousands formats n as the page does (en-US grouping).
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
