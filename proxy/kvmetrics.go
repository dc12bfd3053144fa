package proxy

import (
	"fmt"
	"io"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/kv"
)

// writeKVMetrics writes the KV cache's hit, miss, tier and amortization
// figures in the Prometheus text format.
func writeKVMetrics(w io.Writer, c *kv.Cache) {
	st := c.Stats()
	fmt.Fprintf(w, "# HELP sidecar_kv_hits_total KV cache lookups served from a tier.\n# TYPE sidecar_kv_hits_total counter\nsidecar_kv_hits_total %d\n", st.Hits)
	fmt.Fprintf(w, "# HELP sidecar_kv_misses_total KV cache lookups that had to compute.\n# TYPE sidecar_kv_misses_total counter\nsidecar_kv_misses_total %d\n", st.Misses)
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_bytes Bytes held per tier.\n# TYPE sidecar_kv_tier_bytes gauge")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_bytes{tier=%q} %d\n", t.Tier, t.Bytes)
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_entries Blocks held per tier.\n# TYPE sidecar_kv_tier_entries gauge")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_entries{tier=%q} %d\n", t.Tier, t.Entries)
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_hits_total Lookups served per tier.\n# TYPE sidecar_kv_tier_hits_total counter")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_hits_total{tier=%q} %d\n", t.Tier, t.Hits)
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_demotions_total Blocks moved down from a tier.\n# TYPE sidecar_kv_tier_demotions_total counter")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_demotions_total{tier=%q} %d\n", t.Tier, t.Demotions)
	}
	a := c.AmortizationStats()
	fmt.Fprintf(w, "# HELP sidecar_kv_compute_seconds_mean Mean measured cost of computing a prefix's KV.\n# TYPE sidecar_kv_compute_seconds_mean gauge\nsidecar_kv_compute_seconds_mean %g\n", a.MeanComputeCost.Seconds())
	fmt.Fprintln(w, "# HELP sidecar_kv_load_seconds_mean Mean measured cost of loading a prefix's KV, per tier.\n# TYPE sidecar_kv_load_seconds_mean gauge")
	for tier, d := range a.MeanLoadCost {
		fmt.Fprintf(w, "sidecar_kv_load_seconds_mean{tier=%q} %g\n", tier, d.Seconds())
	}
	fmt.Fprintf(w, "# HELP sidecar_kv_amortization_ratio Computes saved per turn served.\n# TYPE sidecar_kv_amortization_ratio gauge\nsidecar_kv_amortization_ratio %g\n", a.AmortizationRatio)
}

// writeEngineMetrics writes the engine connector's counters.
func writeEngineMetrics(w io.Writer, c engine.Connector) {
	st := c.Stats()
	enabled := 0
	if st.Enabled {
		enabled = 1
	}
	fmt.Fprintf(w, "# HELP sidecar_engine_enabled Whether the engine connector is active (1) or disabled (0).\n# TYPE sidecar_engine_enabled gauge\nsidecar_engine_enabled{connector=%q} %d\n", st.Connector, enabled)
	for _, m := range []struct {
		name, help string
		v          int64
	}{
		{"requests", "Requests the connector prepared.", st.Requests},
		{"hook_errors", "Connector hooks that failed (the request still flowed).", st.HookErrors},
		{"slot_hits", "Requests whose session already held its slot.", st.SlotHits},
		{"evictions", "Slots taken from another session.", st.Evictions},
		{"saves", "Slot states saved.", st.Saves},
		{"save_errors", "Slot saves that failed.", st.SaveErrors},
		{"restores", "Slot states restored into the engine.", st.Restores},
		{"restore_errors", "Slot restores that failed.", st.RestoreErrors},
		{"cached_prompt_tokens", "Prompt tokens the engine reused from its KV (timings.cache_n).", st.Timings.CacheN},
		{"prefilled_prompt_tokens", "Prompt tokens the engine computed (timings.prompt_n).", st.Timings.PromptN},
	} {
		fmt.Fprintf(w, "# HELP sidecar_engine_%s_total %s\n# TYPE sidecar_engine_%s_total counter\nsidecar_engine_%s_total %d\n", m.name, m.help, m.name, m.name, m.v)
	}
	fmt.Fprintf(w, "# HELP sidecar_engine_save_seconds_mean Mean slot save time.\n# TYPE sidecar_engine_save_seconds_mean gauge\nsidecar_engine_save_seconds_mean %g\n", st.MeanSaveMs/1000)
	fmt.Fprintf(w, "# HELP sidecar_engine_restore_seconds_mean Mean slot restore time.\n# TYPE sidecar_engine_restore_seconds_mean gauge\nsidecar_engine_restore_seconds_mean %g\n", st.MeanRestoreMs/1000)
}
