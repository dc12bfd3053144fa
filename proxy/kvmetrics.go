package proxy

import (
	"fmt"

	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// exportKVMetrics mirrors the KV cache's hit, miss, tier and amortization
// figures into reg at each scrape. The tiers write their promotion and
// demotion latencies themselves (tiers.Options.Metrics).
func exportKVMetrics(reg *obs.Registry, c KV) {
	reg.OnScrape(func() {
		st := c.Stats()
		reg.SetCounter("sidecar_kv_hits_total", "KV cache lookups served from a tier.", st.Hits)
		reg.SetCounter("sidecar_kv_misses_total", "KV cache lookups that had to compute.", st.Misses)
		var raw int64
		for _, t := range st.Tiers {
			l := fmt.Sprintf("{tier=%q}", t.Tier)
			reg.SetGauge("sidecar_kv_tier_bytes"+l, "Bytes held per tier.", float64(t.Bytes))
			reg.SetGauge("sidecar_kv_tier_max_bytes"+l, "Byte budget per tier (0: none).", float64(t.MaxBytes))
			reg.SetGauge("sidecar_kv_tier_entries"+l, "Blocks held per tier.", float64(t.Entries))
			reg.SetCounter("sidecar_kv_tier_hits_total"+l, "Lookups served per tier.", t.Hits)
			reg.SetCounter("sidecar_kv_tier_misses_total"+l, "Lookups that reached a tier and did not find the block there.", t.Misses)
			reg.SetCounter("sidecar_kv_tier_demotions_total"+l, "Blocks moved down from a tier.", t.Demotions)
			reg.SetCounter("sidecar_kv_tier_promotions_total"+l, "Blocks moved up into a tier.", t.Promotions)
			raw += t.RawBytes
		}
		reg.SetGauge("sidecar_kv_archive_raw_bytes", `Bytes the Archive's blocks hold before compression (their files: sidecar_kv_tier_bytes{tier="archive"}).`, float64(raw))
		tn := st.Tuning
		reg.SetGauge("sidecar_kv_tuning_promote_threshold", "Hot score at which an access moves a KV block one tier up (moved by the AdaptiveTuner with --kv-tune).", tn.PromoteThreshold)
		reg.SetGauge("sidecar_kv_tuning_archive_level", "zstd level (1 fastest to 4 best) of new Archive blocks; 0 without an Archive.", float64(tn.ArchiveLevel))
		reg.SetGauge("sidecar_kv_tuning_balance", "Recency share of the eviction policy's recency and frequency weights; -1 when the strategy has none.", tn.Balance)
		if tu := st.Tuner; tu != nil {
			reg.SetCounter("sidecar_kv_tuner_epochs_total", "Epochs the AdaptiveTuner observed.", int64(tu.Epochs))
			for _, k := range []string{tiers.KnobBalance, tiers.KnobPromote, tiers.KnobArchiveLevel} {
				reg.SetCounter(fmt.Sprintf("sidecar_kv_tuner_changes_total{knob=%q}", k), "Steps the AdaptiveTuner took, by knob.", int64(tu.Changes[k]))
			}
		}
		a := c.AmortizationStats()
		reg.SetGauge("sidecar_kv_compute_seconds_mean", "Mean measured cost of computing a prefix's KV.", a.MeanComputeCost.Seconds())
		for tier, d := range a.MeanLoadCost {
			reg.SetGauge(fmt.Sprintf("sidecar_kv_load_seconds_mean{tier=%q}", tier), "Mean measured cost of loading a prefix's KV, per tier.", d.Seconds())
		}
		reg.SetGauge("sidecar_kv_amortization_ratio", "Computes saved per turn served.", a.AmortizationRatio)
	})
}
