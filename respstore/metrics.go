package respstore

import (
	"fmt"
	"sort"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/kv"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Stats describes the listener, its store and each tenant.
type Stats struct {
	Conns        int64            `json:"connections"`
	Commands     map[string]int64 `json:"commands"`
	ProtoErrors  int64            `json:"protocol_errors"`
	AuthFailures int64            `json:"auth_failures"`
	RefusedConns int64            `json:"refused_connections"`
	// Loaded is how many values the store found on disk at open.
	Loaded int `json:"loaded"`
	// Unsynced is the bytes acknowledged and not yet on disk; Persisted
	// counts values the persister wrote.
	Unsynced      int64  `json:"unsynced_bytes"`
	Persisted     int64  `json:"persisted"`
	PersistErrors int64  `json:"persist_errors"`
	Fsync         string `json:"fsync"`
	RemoteHits    int64  `json:"remote_hits"`
	RemoteErrors  int64  `json:"remote_errors"`
	// Cache is the tiers' figures (Working, Archive, Focus on a GPU).
	Cache        kv.Stats      `json:"cache"`
	Amortization Amortization  `json:"amortization"`
	Tenants      []TenantStats `json:"tenants"`
}

// TenantStats is one tenant's figures.
type TenantStats struct {
	Tenant string `json:"tenant"`
	Keys   int    `json:"keys"`
	Bytes  int64  `json:"bytes"`
	// TierBytes is the bytes of the tenant's values by the fastest tier
	// holding each ("focus", "working", "archive").
	TierBytes     map[string]int64 `json:"tier_bytes"`
	Quota         int64            `json:"quota"`
	Salts         int              `json:"salts"`
	Hits          int64            `json:"hits"`
	Misses        int64            `json:"misses"`
	Sets          int64            `json:"sets"`
	Deletes       int64            `json:"deletes"`
	Evictions     int64            `json:"evictions"`
	EvictedBytes  int64            `json:"evicted_bytes"`
	BytesIn       int64            `json:"bytes_in"`
	BytesOut      int64            `json:"bytes_out"`
	QuotaRefusals int64            `json:"quota_refusals"`
	Expired       int64            `json:"expired"`
	Lost          int64            `json:"lost"`
}

// Amortization is the seed's cost model fed from what the listener
// measures: C_load is the time to read a value from each tier (GET hits,
// kv.Cache.LoadBlob), C_compute the time between a lookup that missed a
// key and the SET of that key that followed (the client computed it: an
// engine's prefill and the transfer), T the lookups served per compute.
type Amortization struct {
	Loads           int64                    `json:"loads"`
	Computes        int64                    `json:"computes"`
	MeanLoadCost    map[string]time.Duration `json:"mean_load_ns"`
	MeanLoadCostAll time.Duration            `json:"mean_load_all_ns"`
	MeanComputeCost time.Duration            `json:"mean_compute_ns"`
	// TurnsPerCompute is T = (Loads + Computes) / Computes.
	TurnsPerCompute float64 `json:"turns_per_compute"`
	// AmortizedCostPerTurn is (C_compute + (T−1)·C_load)/T.
	AmortizedCostPerTurn time.Duration `json:"amortized_cost_per_turn_ns"`
}

// Stats returns a snapshot. Its per-tier bytes come from one pass over
// every key (no value is read); it also forgets index entries whose values
// the tiers lost.
func (s *Server) Stats() Stats {
	st := Stats{
		Conns: s.conns.Load(), Commands: map[string]int64{},
		ProtoErrors: s.protoErrors.Load(), AuthFailures: s.authFailures.Load(), RefusedConns: s.refusedConns.Load(),
		Loaded: s.loaded, Unsynced: s.st.unsynced(), Persisted: s.st.persisted.Load(), PersistErrors: s.st.persistErrors.Load(),
		Fsync: string(s.opts.Fsync), RemoteHits: s.st.remoteHits.Load(), RemoteErrors: s.st.remoteErrors.Load(),
		Cache: s.cache.Stats(),
	}
	s.cmds.Range(func(k, v any) bool {
		st.Commands[k.(string)] = v.(interface{ Load() int64 }).Load()
		return true
	})
	a := s.cache.AmortizationStats()
	st.Amortization = Amortization{Loads: a.ComputeSaved, Computes: s.st.computes.Load(), MeanLoadCost: a.MeanLoadCost, MeanLoadCostAll: a.MeanLoadCostAll}
	if am := &st.Amortization; am.Computes > 0 {
		am.MeanComputeCost = time.Duration(s.st.computeNs.Load() / am.Computes)
		am.TurnsPerCompute = float64(am.Loads+am.Computes) / float64(am.Computes)
		T := am.TurnsPerCompute
		am.AmortizedCostPerTurn = time.Duration((float64(am.MeanComputeCost) + (T-1)*float64(am.MeanLoadCostAll)) / T)
	}

	scan := s.opts.Clock.Now()
	tierBytes := map[string]map[string]int64{}
	seen := map[string]bool{}
	s.cache.RangeBlobs(blobNS, func(bk string, m kv.BlobMeta, t tiers.Tier) bool {
		tn, _, _, ok := parseBlobKey(bk)
		size, _, err := parseAux(m.Aux)
		if !ok || err != nil {
			return true
		}
		seen[bk] = true
		if tierBytes[tn] == nil {
			tierBytes[tn] = map[string]int64{}
		}
		tierBytes[tn][t.String()] += size
		return true
	})
	s.ix.reconcile(scan, seen)
	for _, t := range s.ix.all() {
		keys, bytes, salts := s.ix.usage(t)
		ts := TenantStats{
			Tenant: t.name, Keys: keys, Bytes: bytes, TierBytes: tierBytes[t.name], Quota: s.ix.quota(t.name), Salts: salts,
			Hits: t.stats.hits.Load(), Misses: t.stats.misses.Load(), Sets: t.stats.sets.Load(), Deletes: t.stats.deletes.Load(),
			Evictions: t.stats.evictions.Load(), EvictedBytes: t.stats.evictedBytes.Load(),
			BytesIn: t.stats.bytesIn.Load(), BytesOut: t.stats.bytesOut.Load(),
			QuotaRefusals: t.stats.quotaRefusals.Load(), Expired: t.stats.expired.Load(), Lost: t.stats.lost.Load(),
		}
		if ts.TierBytes == nil {
			ts.TierBytes = map[string]int64{}
		}
		st.Tenants = append(st.Tenants, ts)
	}
	sort.Slice(st.Tenants, func(i, j int) bool {
		if st.Tenants[i].Bytes != st.Tenants[j].Bytes {
			return st.Tenants[i].Bytes > st.Tenants[j].Bytes
		}
		return st.Tenants[i].Tenant < st.Tenants[j].Tenant
	})
	return st
}

// maxTenantSeries bounds the tenants /metrics shows (the largest by
// bytes): credentials are the client's to choose, series are not.
const maxTenantSeries = 256

// exportMetrics mirrors Stats into reg at each scrape, as the sidecar's
// other subsystems do (internal/obs).
func (s *Server) exportMetrics(reg *obs.Registry) {
	reg.OnScrape(func() {
		st := s.Stats()
		reg.SetGauge("sidecar_resp_connections", "Open connections of the RESP listener (--resp-listen).", float64(st.Conns))
		for name, n := range st.Commands {
			reg.SetCounter(fmt.Sprintf("sidecar_resp_commands_total{command=%q}", name), "Commands the RESP listener ran, by name (unknown: outside the subset it speaks).", n)
		}
		reg.SetCounter("sidecar_resp_protocol_errors_total", "RESP connections closed for a malformed request.", st.ProtoErrors)
		reg.SetCounter("sidecar_resp_auth_failures_total", "AUTH and HELLO AUTH refused.", st.AuthFailures)
		reg.SetCounter("sidecar_resp_refused_connections_total", "RESP connections refused past the connection limit.", st.RefusedConns)
		reg.SetGauge("sidecar_resp_unsynced_bytes", "Bytes of acknowledged SETs not yet written to disk (what a kill -9 would lose; bounded by --resp-unsynced-bytes).", float64(st.Unsynced))
		reg.SetCounter("sidecar_resp_persisted_total", "Values the persister wrote to the Archive behind the clients.", st.Persisted)
		reg.SetCounter("sidecar_resp_persist_errors_total", "Values the persister failed to write to disk.", st.PersistErrors)
		reg.SetCounter("sidecar_resp_remote_hits_total", "GETs the --remote store served after the local tiers missed.", st.RemoteHits)
		reg.SetCounter("sidecar_resp_remote_errors_total", "Failed reads and writes of the --remote store.", st.RemoteErrors)
		var quarantined int64
		for _, t := range st.Cache.Tiers {
			l := fmt.Sprintf("{tier=%q}", t.Tier)
			reg.SetGauge("sidecar_resp_tier_bytes"+l, "Bytes the RESP store holds per tier (the Archive: its files).", float64(t.Bytes))
			reg.SetGauge("sidecar_resp_tier_max_bytes"+l, "Byte budget of the RESP store per tier (--kv-ram-bytes, --resp-disk-bytes).", float64(t.MaxBytes))
			reg.SetGauge("sidecar_resp_tier_entries"+l, "Values the RESP store holds per tier.", float64(t.Entries))
			quarantined += t.Quarantined
		}
		reg.SetCounter("sidecar_resp_quarantined_total", "Archive files of the RESP store that failed their checks (never served).", quarantined)
		am := st.Amortization
		for tier, d := range am.MeanLoadCost {
			reg.SetGauge(fmt.Sprintf("sidecar_resp_load_seconds_mean{tier=%q}", tier), "C_load: mean time to read a value for a GET, per tier.", d.Seconds())
		}
		reg.SetGauge("sidecar_resp_compute_seconds_mean", "C_compute: mean time from a lookup that missed a key to the SET of it (the client computed it).", am.MeanComputeCost.Seconds())
		reg.SetGauge("sidecar_resp_amortized_seconds_per_turn", "(C_compute + (T-1)*C_load)/T for the measured T lookups per compute.", am.AmortizedCostPerTurn.Seconds())
		for i, t := range st.Tenants {
			if i == maxTenantSeries {
				break
			}
			l := fmt.Sprintf("{tenant=%q}", t.Tenant)
			reg.SetCounter("sidecar_resp_tenant_hits_total"+l, "GETs that found a value, per tenant.", t.Hits)
			reg.SetCounter("sidecar_resp_tenant_misses_total"+l, "GETs that found none, per tenant.", t.Misses)
			reg.SetCounter("sidecar_resp_tenant_sets_total"+l, "Values stored, per tenant.", t.Sets)
			reg.SetCounter("sidecar_resp_tenant_evictions_total"+l, "Keys evicted to keep a tenant (or a salt of it) within its quota.", t.Evictions)
			reg.SetCounter("sidecar_resp_tenant_evicted_bytes_total"+l, "Bytes evicted to keep a tenant within its quota.", t.EvictedBytes)
			reg.SetCounter("sidecar_resp_tenant_quota_refusals_total"+l, "SETs refused: one value larger than the tenant's or salt's whole quota.", t.QuotaRefusals)
			reg.SetCounter("sidecar_resp_tenant_read_bytes_total"+l, "Value bytes served by GET, per tenant.", t.BytesOut)
			reg.SetCounter("sidecar_resp_tenant_written_bytes_total"+l, "Value bytes stored by SET, per tenant.", t.BytesIn)
			reg.SetGauge("sidecar_resp_tenant_keys"+l, "Keys a tenant holds.", float64(t.Keys))
			reg.SetGauge("sidecar_resp_tenant_quota_bytes"+l, "A tenant's quota (0: none).", float64(t.Quota))
			for _, tier := range []string{"focus", "working", "archive"} {
				reg.SetGauge(fmt.Sprintf("sidecar_resp_tenant_bytes{tenant=%q,tier=%q}", t.Tenant, tier), "Bytes of a tenant's values, by the fastest tier holding each.", float64(t.TierBytes[tier]))
			}
		}
	})
}
