package admin

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/respstore"
)

// startRESP opens a RESP listener on a fresh folder, served on a loopback
// port until the test ends.
func startRESP(t *testing.T, opts respstore.Options) (*respstore.Server, string) {
	t.Helper()
	opts.Dir = t.TempDir()
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := respstore.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, sidecartest.Serve(t, s)
}

// apiRESPTenant is a tenant as GET /admin/v1/resp answers it.
type apiRESPTenant struct {
	Tenant        string
	Keys          int
	Bytes         int64
	TierBytes     map[string]int64 `json:"tier_bytes"`
	Quota         int64
	Hits, Misses  int64
	HitRatio      *float64 `json:"hit_ratio"`
	Sets          int64
	Evictions     int64
	EvictedBytes  int64 `json:"evicted_bytes"`
	QuotaRefusals int64 `json:"quota_refusals"`
}

type apiRESP struct {
	Object       string
	Enabled      bool
	Connections  *int64
	Unsynced     *int64 `json:"unsynced_bytes"`
	Fsync        string
	Commands     map[string]int64
	Cache        *struct{ Tiers []struct{ Tier string } }
	Amortization *struct {
		Loads, Computes int64
		MeanCompute     int64   `json:"mean_compute_ns"`
		Turns           float64 `json:"turns_per_compute"`
		Amortized       int64   `json:"amortized_cost_per_turn_ns"`
	}
	Tenants      []apiRESPTenant
	TenantsTotal int `json:"tenants_total"`
	Totals       *struct {
		Tenants, Keys int
		Hits, Misses  int64
		HitRatio      *float64 `json:"hit_ratio"`
		Evictions     int64
		QuotaRefusals int64 `json:"quota_refusals"`
	}
	Tenant        *apiRESPTenant
	SampleEveryMs int64 `json:"sample_every_ms"`
}

// TestAdminRESP: the console's RESP view reports, per tenant, what real
// Redis clients did — hits, misses, keys, bytes by tier, quota evictions
// and refusals — and the store's figures; a RESP password and the same
// API key on HTTP are one tenant in the tenant list; without the listener
// the view says it is off.
func TestAdminRESP(t *testing.T) {
	up := newRecordingUpstream(t)
	st := openMemory(t, memory.Options{})

	off, _ := startSidecar(t, up.URL, func(o *sidecarOptions) { o.Memory = st; o.AdminToken = testAdminToken })
	for _, q := range []string{"", "?tenant=t_0123456789abcdef"} {
		var v apiRESP
		adminJSON(t, off, "GET", "/admin/v1/resp"+q, "", 200, &v)
		if v.Object != "resp" || v.Enabled || v.Connections != nil || v.Tenant != nil {
			t.Fatalf("without a RESP listener: %+v", v)
		}
	}

	const quota = 100_000
	rs, addr := startRESP(t, respstore.Options{Quota: quota})
	on, _ := startSidecar(t, up.URL, func(o *sidecarOptions) { o.Memory = st; o.RESP = rs; o.AdminToken = testAdminToken })
	chatTurn(t, on, "key-a", "s1", "", "hello")
	ta, tb := tenantOf([]byte("Bearer key-a")), tenantOf([]byte("Bearer key-b"))

	ctx := context.Background()
	a := redis.NewClient(&redis.Options{Addr: addr, Password: "key-a", MaxRetries: -1})
	defer a.Close()
	b := redis.NewClient(&redis.Options{Addr: addr, Password: "key-b", MaxRetries: -1})
	defer b.Close()
	val := func(n int, c byte) []byte { return bytes.Repeat([]byte{c}, n) }
	for _, k := range []string{"a", "b", "c"} {
		if err := a.Set(ctx, k, val(30_000, k[0]), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if got, err := a.Get(ctx, "a").Bytes(); err != nil || !bytes.Equal(got, val(30_000, 'a')) {
			t.Fatalf("GET a: %d bytes, %v", len(got), err)
		}
	}
	if err := a.Get(ctx, "d").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET d before its SET: %v", err)
	}
	// 120,000 bytes over a quota of 100,000: the least recently used key
	// of this tenant leaves.
	if err := a.Set(ctx, "d", val(30_000, 'd'), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Set(ctx, "huge", val(quota+1, 'h'), 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a value over the whole quota: %v, want OOM", err)
	}
	if err := b.Set(ctx, "x", "12345", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Get(ctx, "a").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("tenant b reads a's key: %v", err)
	}

	var v apiRESP
	adminJSON(t, on, "GET", "/admin/v1/resp?tenant="+url.QueryEscape(ta), "", 200, &v)
	x := v.Tenant
	if !v.Enabled || x == nil || x.Tenant != ta {
		t.Fatalf("the RESP view of %s: %+v", ta, v)
	}
	if x.Hits != 2 || x.Misses != 1 || x.HitRatio == nil || *x.HitRatio != 2.0/3 || x.Keys != 3 || x.Bytes != 90_000 ||
		x.TierBytes["working"] != 90_000 || x.Quota != quota || x.Evictions != 1 || x.EvictedBytes != 30_000 ||
		x.QuotaRefusals != 1 || x.Sets != 4 {
		t.Fatalf("tenant a in the RESP view: %+v", x)
	}
	if len(v.Tenants) != 2 || v.TenantsTotal != 2 || v.Tenants[0].Tenant != ta || v.Tenants[1].Tenant != tb ||
		v.Tenants[1].Keys != 1 || v.Tenants[1].Bytes != 5 || v.Tenants[1].Misses != 1 || v.Tenants[1].HitRatio == nil || *v.Tenants[1].HitRatio != 0 {
		t.Fatalf("tenants in the RESP view: %+v", v.Tenants)
	}
	if y := v.Totals; y == nil || y.Tenants != 2 || y.Keys != 4 || y.Hits != 2 || y.Misses != 2 || y.HitRatio == nil || *y.HitRatio != 0.5 ||
		y.Evictions != 1 || y.QuotaRefusals != 1 {
		t.Fatalf("totals in the RESP view: %+v", v.Totals)
	}
	if v.Connections == nil || *v.Connections < 2 || v.Unsynced == nil || v.Fsync != "background" || v.Commands["SET"] != 6 || v.Commands["GET"] != 4 ||
		v.Cache == nil || len(v.Cache.Tiers) == 0 || v.SampleEveryMs != 5000 {
		t.Fatalf("the store in the RESP view: %+v", v)
	}
	// The amortization: GET d missed, its SET followed (one compute); the
	// two hits were loads instead of computes.
	if am := v.Amortization; am == nil || am.Computes != 1 || am.Loads != 2 || am.MeanCompute <= 0 || am.Turns != 3 || am.Amortized <= 0 {
		t.Fatalf("amortization in the RESP view: %+v", v.Amortization)
	}

	// A tenant the store does not know: zeros, no ratio.
	v = apiRESP{}
	adminJSON(t, on, "GET", "/admin/v1/resp?tenant=t_0123456789abcdef", "", 200, &v)
	if x := v.Tenant; x == nil || x.Tenant != "t_0123456789abcdef" || x.Keys != 0 || x.HitRatio != nil || x.TierBytes == nil {
		t.Fatalf("an unknown tenant: %+v", v.Tenant)
	}
	v = apiRESP{}
	adminJSON(t, on, "GET", "/admin/v1/resp", "", 200, &v)
	if v.Tenant != nil || len(v.Tenants) != 2 {
		t.Fatalf("no tenant named: %+v", v)
	}
	resp, body := adminDo(t, on, "GET", "/admin/v1/resp?tenant=%01", testAdminToken, "")
	wantOpenAIError(t, resp, body, 400, "invalid_tenant")
	resp, body = adminDo(t, on, "POST", "/admin/v1/resp", testAdminToken, "")
	wantOpenAIError(t, resp, body, 405, "method_not_allowed")
	resp, body = adminDo(t, on, "GET", "/admin/v1/resp", "key-a", "")
	wantOpenAIError(t, resp, body, 401, "invalid_admin_token")

	// The tenant picker's list: the API key's tenant is the RESP password's,
	// and a tenant with RESP keys alone is listed after memory's.
	type tenantRow struct {
		Tenant    string
		Sessions  int
		UpdatedAt *string `json:"updated_at"`
		RESPKeys  int     `json:"resp_keys"`
		RESPBytes int64   `json:"resp_bytes"`
	}
	var ts struct{ Data []tenantRow }
	adminJSON(t, on, "GET", "/admin/v1/tenants", "", 200, &ts)
	if len(ts.Data) != 2 || ts.Data[0].Tenant != ta || ts.Data[0].Sessions != 1 || ts.Data[0].UpdatedAt == nil || ts.Data[0].RESPKeys != 3 ||
		ts.Data[0].RESPBytes != 90_000 || ts.Data[1].Tenant != tb || ts.Data[1].Sessions != 0 || ts.Data[1].UpdatedAt != nil || ts.Data[1].RESPKeys != 1 {
		t.Fatalf("tenants: %+v", ts.Data)
	}
	var ss struct{ Data []any }
	adminJSON(t, on, "GET", "/admin/v1/sessions?tenant="+url.QueryEscape(tb), "", 200, &ss)
	if len(ss.Data) != 0 {
		t.Fatalf("a RESP-only tenant's sessions: %+v", ss.Data)
	}

	// Without session memory the tenants are the RESP store's.
	respOnly, _ := startSidecar(t, up.URL, func(o *sidecarOptions) { o.RESP = rs; o.AdminToken = testAdminToken })
	ts.Data = nil
	adminJSON(t, respOnly, "GET", "/admin/v1/tenants", "", 200, &ts)
	if len(ts.Data) != 2 || ts.Data[0].Tenant != ta || ts.Data[0].Sessions != 0 || ts.Data[0].RESPKeys != 3 {
		t.Fatalf("tenants without memory: %+v", ts.Data)
	}
}
