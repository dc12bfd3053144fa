package main

// The console's RESP store page in a browser (console_e2e_test.go holds
// the harness).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"
)

// TestConsoleRESPViewInBrowser (issue 34): with --resp-listen, two go-redis
// clients write, read and miss keys (one of them past its --resp-quota:
// an eviction, and a value over the whole quota refused), and the console's
// RESP page shows, for the tenant picked above — the API key's tenant, the
// same hash as the RESP password's — its hit ratio, keys, bytes by tier,
// evictions and quota refusals as the admin API reports them, the store's
// connections, commands and load/compute figures, and every tenant in a
// table whose rows pick the tenant; at 400 px it fits the window.
func TestConsoleRESPViewInBrowser(t *testing.T) {
	chromiumPath(t)
	up := newScriptedUpstream(t)
	respAddr := freePort(t)
	const quota = 100_000
	sc := startChild(t, nil, "--upstream", up.URL, "--admin-token", consoleToken, "--console-sample-every", "250ms",
		"--resp-listen", respAddr, "--resp-quota", strconv.Itoa(quota))
	ctx := context.Background()
	c := openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey("sk-resp"), option.WithMaxRetries(0))
	if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Keep my KV, please.")}},
		option.WithHeader("X-Session-ID", "resp-owner")); err != nil {
		t.Fatal(err)
	}
	tenant := tenantWith(t, sc.admin, "resp-owner")
	sum := sha256.Sum256([]byte("sk-resp"))
	if want := "t_" + hex.EncodeToString(sum[:8]); tenant != want {
		t.Fatalf("the API key's tenant is %s, want %s (the hash RESP's AUTH names too)", tenant, want)
	}

	a := redis.NewClient(&redis.Options{Addr: respAddr, Password: "sk-resp", MaxRetries: -1})
	defer a.Close()
	other := redis.NewClient(&redis.Options{Addr: respAddr, Password: "sk-other-team", MaxRetries: -1})
	defer other.Close()
	val := func(c byte) []byte { return bytes.Repeat([]byte{c}, 30_000) }
	for _, k := range []string{"model@00000000@0@aa", "model@00000000@0@bb", "model@00000000@0@cc"} {
		if err := a.Set(ctx, k, val(k[len(k)-1]), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if got, err := a.Get(ctx, "model@00000000@0@aa").Bytes(); err != nil || !bytes.Equal(got, val('a')) {
			t.Fatalf("GET: %d bytes, %v", len(got), err)
		}
	}
	if err := a.Get(ctx, "model@00000000@0@dd").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET of a key never set: %v", err)
	}
	if err := a.Set(ctx, "model@00000000@0@dd", val('d'), 0).Err(); err != nil { // past the quota: one key evicted
		t.Fatal(err)
	}
	if err := a.Set(ctx, "model@00000000@0@ee", bytes.Repeat([]byte{'e'}, quota+1), 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a value larger than the whole quota: %v, want OOM", err)
	}
	if err := other.Set(ctx, "model@00000000@0@aa", "theirs", 0).Err(); err != nil {
		t.Fatal(err)
	}
	otherTenant := ""

	type respTenant struct {
		Tenant                  string
		Keys                    int
		Bytes                   int64
		TierBytes               map[string]int64 `json:"tier_bytes"`
		Hits, Misses, Evictions int64
		HitRatio                *float64 `json:"hit_ratio"`
		QuotaRefusals           int64    `json:"quota_refusals"`
		Quota                   int64
	}
	var v struct {
		Enabled     bool
		Connections int64
		Commands    map[string]int64
		Tenant      *respTenant
		Tenants     []respTenant
	}
	adminGet(t, sc.admin, "resp?tenant="+url.QueryEscape(tenant), &v)
	x := v.Tenant
	if !v.Enabled || x == nil || x.Hits != 2 || x.Misses != 1 || x.Keys != 3 || x.Bytes != 90_000 || x.Evictions != 1 || x.QuotaRefusals != 1 ||
		x.Quota != quota || len(v.Tenants) != 2 {
		t.Fatalf("the RESP view of %s: %+v (tenants %+v)", tenant, x, v.Tenants)
	}
	for _, y := range v.Tenants {
		if y.Tenant != tenant {
			otherTenant = y.Tenant
		}
	}

	p := openConsole(t, sc.admin)
	p.signIn()
	p.choose("#tenant", tenant)
	var label string
	p.eval(fmt.Sprintf(`document.querySelector('#tenant option[value=%q]').textContent`, tenant), &label)
	if !strings.Contains(label, "1 sessions") || !strings.Contains(label, "3 RESP keys") {
		t.Fatalf("the tenant picker says %q", label)
	}
	p.click("#tab-resp")
	p.do(chromedp.WaitVisible(chromedp.ID("resp-on")))
	p.waitText("#resp-tenant-name", tenant)
	p.waitText("#resp-card-hitratio .v", fmt.Sprintf("%.1f%%", 100**x.HitRatio))
	p.waitText("#resp-card-hitratio .s", fmt.Sprintf("%d hits, %d misses", x.Hits, x.Misses))
	p.waitText("#resp-card-keys .v", strconv.Itoa(x.Keys))
	p.waitText("#resp-card-evictions .v", strconv.FormatInt(x.Evictions, 10))
	p.waitText("#resp-card-quota .v", "97.7 KiB")
	p.waitText("#resp-card-quota .s", "1 SETs refused")
	p.waitText(`#resp-tenant-tiers .legend span[data-tier="working"]`, fmt.Sprintf("RAM (working) %.1f KiB", float64(x.TierBytes["working"])/1024))
	if x.TierBytes["working"] != 90_000 {
		t.Fatalf("the tenant's bytes in RAM: %+v", x.TierBytes)
	}
	p.waitText("#resp-card-conns .v", strconv.FormatInt(v.Connections, 10))
	p.waitText(`#resp-commands tr[data-command="SET"] td:nth-child(2)`, strconv.FormatInt(v.Commands["SET"], 10))
	p.waitText("#resp-amortization", "1 misses followed by the SET")
	p.waitText("#resp-card-unsynced .s", "--resp-fsync background")
	p.waitCount("#resp-tenants-table tbody tr", 2)
	p.waitCount("#resp-tenants-table tbody tr.selected", 1)
	p.shot("11-resp")
	p.noProblems("RESP page")

	// A row of the tenants table picks that tenant, above and on the page.
	p.click(fmt.Sprintf(`#resp-tenants-table tr[data-tenant=%q]`, otherTenant))
	p.waitText("#resp-tenant-name", otherTenant)
	p.waitText("#resp-card-keys .v", "1")
	p.waitText("#resp-card-hitratio .v", "–")
	var picked string
	p.eval(`document.getElementById("tenant").value`, &picked)
	if picked != otherTenant {
		t.Fatalf("the picker shows %s after a click on %s's row", picked, otherTenant)
	}
	p.do(chromedp.EmulateViewport(400, 900))
	p.fits("RESP page at 400 px")
	p.shot("12-resp-400px")
	p.noProblems("RESP page, another tenant")
}
