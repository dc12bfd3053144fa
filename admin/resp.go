package admin

// The RESP listener as the console sees it: GET /admin/v1/resp over
// Options.RESP (package respstore's Stats), and the RESP tenants that
// GET /admin/v1/tenants lists beside memory's.

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/respstore"
)

// respTenant is one tenant's figures in the RESP store, with its hit
// ratio.
type respTenant struct {
	respstore.TenantStats
	// HitRatio is hits / (hits + misses); null before the tenant's first
	// lookup.
	HitRatio *float64 `json:"hit_ratio"`
}

// respTotals sums every tenant's figures (not only those listed).
type respTotals struct {
	Tenants       int              `json:"tenants"`
	Keys          int              `json:"keys"`
	Bytes         int64            `json:"bytes"`
	TierBytes     map[string]int64 `json:"tier_bytes"`
	Hits          int64            `json:"hits"`
	Misses        int64            `json:"misses"`
	HitRatio      *float64         `json:"hit_ratio"`
	Evictions     int64            `json:"evictions"`
	EvictedBytes  int64            `json:"evicted_bytes"`
	QuotaRefusals int64            `json:"quota_refusals"`
}

// respView is GET /admin/v1/resp with the listener on: its store-wide
// figures (respstore.Stats: connections, commands, unsynced bytes, the
// tiers, the amortization of loads against computes), the totals over
// every tenant, the tenants, most bytes first and at most adminMaxList,
// and, when the call names one with ?tenant=, that tenant's figures
// (zeros for a tenant the store does not know).
type respView struct {
	Object  string `json:"object"` // "resp"
	Enabled bool   `json:"enabled"`
	respstore.Stats
	// Tenants replaces Stats.Tenants in the answer (in encoding/json the
	// field nearer the top wins): the same tenants, with hit ratios.
	Tenants      []respTenant `json:"tenants"`
	TenantsTotal int          `json:"tenants_total"`
	Totals       respTotals   `json:"totals"`
	Tenant       *respTenant  `json:"tenant,omitempty"`
	// SampleEveryMs is how often the page asks again (the console's
	// sample period).
	SampleEveryMs int64 `json:"sample_every_ms"`
}

func hitRatio(hits, misses int64) *float64 {
	if hits+misses == 0 {
		return nil
	}
	r := float64(hits) / float64(hits+misses)
	return &r
}

func newRESPTenant(t respstore.TenantStats) respTenant {
	if t.TierBytes == nil {
		t.TierBytes = map[string]int64{}
	}
	return respTenant{TenantStats: t, HitRatio: hitRatio(t.Hits, t.Misses)}
}

func (a *adminReq) resp() {
	if a.done {
		return
	}
	// ?tenant= is optional here: without it the answer is the store's.
	var tenant string
	if a.q.Has("tenant") && len(a.q.Peek("tenant")) > 0 {
		if a.tenant(); a.done {
			return
		}
		tenant = a.tenantV
	}
	r := a.s.opts.RESP
	if r == nil {
		a.ok(fasthttp.StatusOK, map[string]any{"object": "resp", "enabled": false})
		return
	}
	st := r.Stats()
	v := respView{Object: "resp", Enabled: true, Stats: st, Tenants: []respTenant{}, TenantsTotal: len(st.Tenants),
		Totals: respTotals{Tenants: len(st.Tenants), TierBytes: map[string]int64{}}, SampleEveryMs: a.s.opts.SampleEvery.Milliseconds()}
	v.Stats.Tenants = nil
	for i, t := range st.Tenants {
		rt := newRESPTenant(t)
		if i < adminMaxList {
			v.Tenants = append(v.Tenants, rt)
		}
		if t.Tenant == tenant {
			v.Tenant = &rt
		}
		x := &v.Totals
		x.Keys += t.Keys
		x.Bytes += t.Bytes
		for tier, n := range t.TierBytes {
			x.TierBytes[tier] += n
		}
		x.Hits += t.Hits
		x.Misses += t.Misses
		x.Evictions += t.Evictions
		x.EvictedBytes += t.EvictedBytes
		x.QuotaRefusals += t.QuotaRefusals
	}
	v.Totals.HitRatio = hitRatio(v.Totals.Hits, v.Totals.Misses)
	if tenant != "" && v.Tenant == nil {
		rt := newRESPTenant(respstore.TenantStats{Tenant: tenant})
		v.Tenant = &rt
	}
	a.ok(fasthttp.StatusOK, v)
}

// adminTenant is one tenant of GET /admin/v1/tenants: its stored sessions
// (memory) and its keys in the RESP store. One API key on HTTP and the
// same password on RESP are one tenant (both hash the secret alike).
type adminTenant struct {
	Tenant    string    `json:"tenant"`
	Sessions  int       `json:"sessions"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	RESPKeys  int       `json:"resp_keys"`
	RESPBytes int64     `json:"resp_bytes"`
}

// tenants lists memory's tenants (newest first), then the RESP store's
// other tenants (most bytes first), each part at most adminMaxList.
func (a *adminReq) tenants() {
	if a.done {
		return
	}
	if a.s.opts.Memory == nil && a.s.opts.RESP == nil {
		a.memory() // answers memory_disabled
		return
	}
	out := []adminTenant{}
	at := map[string]int{}
	if m := a.s.opts.Memory; m != nil {
		ts, err := m.Tenants()
		if err != nil {
			a.storeErr(err)
			return
		}
		for _, t := range ts {
			at[t.Tenant] = len(out)
			out = append(out, adminTenant{Tenant: t.Tenant, Sessions: t.Sessions, UpdatedAt: t.UpdatedAt})
		}
	}
	if r := a.s.opts.RESP; r != nil {
		added := 0
		for _, t := range r.Stats().Tenants {
			if i, ok := at[t.Tenant]; ok {
				out[i].RESPKeys, out[i].RESPBytes = t.Keys, t.Bytes
				continue
			}
			if added < adminMaxList {
				out = append(out, adminTenant{Tenant: t.Tenant, RESPKeys: t.Keys, RESPBytes: t.Bytes})
				added++
			}
		}
	}
	a.ok(fasthttp.StatusOK, list(out))
}
