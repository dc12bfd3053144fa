package proxy

import (
	"fmt"
	"io"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// writeKVMetrics writes the KV cache's hit, miss, tier and amortization
// figures in the Prometheus text format.
func writeKVMetrics(w io.Writer, c KV) {
	st := c.Stats()
	fmt.Fprintf(w, "# HELP sidecar_kv_hits_total KV cache lookups served from a tier.\n# TYPE sidecar_kv_hits_total counter\nsidecar_kv_hits_total %d\n", st.Hits)
	fmt.Fprintf(w, "# HELP sidecar_kv_misses_total KV cache lookups that had to compute.\n# TYPE sidecar_kv_misses_total counter\nsidecar_kv_misses_total %d\n", st.Misses)
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_bytes Bytes held per tier.\n# TYPE sidecar_kv_tier_bytes gauge")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_bytes{tier=%q} %d\n", t.Tier, t.Bytes)
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_max_bytes Byte budget per tier (0: none).\n# TYPE sidecar_kv_tier_max_bytes gauge")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_max_bytes{tier=%q} %d\n", t.Tier, t.MaxBytes)
	}
	var raw int64
	for _, t := range st.Tiers {
		raw += t.RawBytes
	}
	fmt.Fprintf(w, "# HELP sidecar_kv_archive_raw_bytes Bytes the Archive's blocks hold before compression (their files: sidecar_kv_tier_bytes{tier=\"archive\"}).\n# TYPE sidecar_kv_archive_raw_bytes gauge\nsidecar_kv_archive_raw_bytes %d\n", raw)
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_entries Blocks held per tier.\n# TYPE sidecar_kv_tier_entries gauge")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_entries{tier=%q} %d\n", t.Tier, t.Entries)
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_hits_total Lookups served per tier.\n# TYPE sidecar_kv_tier_hits_total counter")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_hits_total{tier=%q} %d\n", t.Tier, t.Hits)
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_misses_total Lookups that reached a tier and did not find the block there.\n# TYPE sidecar_kv_tier_misses_total counter")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_misses_total{tier=%q} %d\n", t.Tier, t.Misses)
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_demotions_total Blocks moved down from a tier.\n# TYPE sidecar_kv_tier_demotions_total counter")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_demotions_total{tier=%q} %d\n", t.Tier, t.Demotions)
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_tier_promotions_total Blocks moved up into a tier.\n# TYPE sidecar_kv_tier_promotions_total counter")
	for _, t := range st.Tiers {
		fmt.Fprintf(w, "sidecar_kv_tier_promotions_total{tier=%q} %d\n", t.Tier, t.Promotions)
	}
	// Every series of the two histograms is written, empty ones too, so
	// rules and dashboards find them on any sidecar.
	lat := map[string]tiers.TierStats{}
	for _, t := range st.Tiers {
		lat[t.Tier] = t
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_promotion_seconds Time to serve a lookup from below Focus, by the tier the block came from: read, decoding and checks, and the move up when the block is hot enough.\n# TYPE sidecar_kv_promotion_seconds histogram")
	for _, name := range []string{"working", "archive"} {
		lat[name].PromotionLatency.WritePrometheus(w, "sidecar_kv_promotion_seconds", fmt.Sprintf("tier=%q,", name))
	}
	fmt.Fprintln(w, "# HELP sidecar_kv_demotion_seconds Time to move a block down one tier, by the tier it left (from Working: compression and a durable write to the Archive).\n# TYPE sidecar_kv_demotion_seconds histogram")
	for _, name := range []string{"focus", "working"} {
		lat[name].DemotionLatency.WritePrometheus(w, "sidecar_kv_demotion_seconds", fmt.Sprintf("tier=%q,", name))
	}
	tn := st.Tuning
	fmt.Fprintf(w, "# HELP sidecar_kv_tuning_promote_threshold Hot score at which an access moves a KV block one tier up (moved by the AdaptiveTuner with --kv-tune).\n# TYPE sidecar_kv_tuning_promote_threshold gauge\nsidecar_kv_tuning_promote_threshold %g\n", tn.PromoteThreshold)
	fmt.Fprintf(w, "# HELP sidecar_kv_tuning_archive_level zstd level (1 fastest to 4 best) of new Archive blocks; 0 without an Archive.\n# TYPE sidecar_kv_tuning_archive_level gauge\nsidecar_kv_tuning_archive_level %d\n", tn.ArchiveLevel)
	fmt.Fprintf(w, "# HELP sidecar_kv_tuning_balance Recency share of the eviction policy's recency and frequency weights; -1 when the strategy has none.\n# TYPE sidecar_kv_tuning_balance gauge\nsidecar_kv_tuning_balance %g\n", tn.Balance)
	if tu := st.Tuner; tu != nil {
		fmt.Fprintf(w, "# HELP sidecar_kv_tuner_epochs_total Epochs the AdaptiveTuner observed.\n# TYPE sidecar_kv_tuner_epochs_total counter\nsidecar_kv_tuner_epochs_total %d\n", tu.Epochs)
		fmt.Fprintln(w, "# HELP sidecar_kv_tuner_changes_total Steps the AdaptiveTuner took, by knob.\n# TYPE sidecar_kv_tuner_changes_total counter")
		for _, k := range []string{tiers.KnobBalance, tiers.KnobPromote, tiers.KnobArchiveLevel} {
			fmt.Fprintf(w, "sidecar_kv_tuner_changes_total{knob=%q} %d\n", k, tu.Changes[k])
		}
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
		{"slot_hits", "Requests whose session still held its slot.", st.SlotHits},
		{"slot_assigns", "Requests placed on a slot their session did not hold.", st.SlotAssigns},
		{"evictions", "Slots taken from a session whose KV had to be saved first, on the request path.", st.Evictions},
		{"saves", "Engine states saved into the tiers.", st.Saves},
		{"save_errors", "Slot saves that failed.", st.SaveErrors},
		{"restores", "Engine states restored into a slot.", st.Restores},
		{"restore_errors", "Slot restores that failed (the request prefilled).", st.RestoreErrors},
		{"restore_misses", "Placements that found no stored state sharing a prefix.", st.RestoreMisses},
		{"restore_skips", "States found but not worth restoring (too short, or slower than the prefill).", st.RestoreSkips},
		{"prefix_reuses", "Restores of a state another session saved (a shared prefix).", st.PrefixReuses},
		{"refused", "States not restored because the server's KV layout differs.", st.Refused},
		{"unused_restores", "Restores the engine accepted but did not reuse.", st.UnusedRestores},
		{"restarts", "Times the engine was found restarted or unreachable.", st.Restarts},
		{"background_calls", "The sidecar's own calls placed on slots.", st.BackgroundCalls},
		{"background_cancelled", "The sidecar's own calls cancelled because a client request needed their slot.", st.BackgroundCancelled},
		{"client_waits", "Client requests placed on a slot busy with the sidecar's own work (the goal is 0).", st.ClientWaits},
		{"preloads", "States restored into an idle slot ahead of their session's request (predictive preload), off the request path.", st.Preloads},
		{"preloads_used", "Preloaded states their session came back to.", st.PreloadsUsed},
		{"preloads_wasted", "Preloaded states dropped before their session came back (a wrong prediction).", st.PreloadsWasted},
		{"preloads_abandoned", "Preloads given up before the engine was asked, because a client request arrived.", st.PreloadsAbandoned},
		{"preload_waits", "Client requests that waited for the preload of their own state to finish.", st.PreloadWaits},
		{"preload_errors", "Preloads that failed.", st.PreloadErrors},
		{"states_deleted", "States dropped (superseded or over the cap).", st.StatesDeleted},
		{"reused_tokens", "Prompt tokens the engine did not reprocess thanks to a restore.", st.ReusedTokens},
		{"shared_puts", "States written through to the fleet's shared store (--remote).", st.SharedPuts},
		{"shared_fetches", "States taken from the fleet's shared store (computed on another replica).", st.SharedFetches},
		{"shared_errors", "Exchanges with the fleet's shared store that failed (requests went on with local states).", st.SharedErrors},
		{"cached_prompt_tokens", "Prompt tokens the engine reused from its KV (timings.cache_n).", st.Timings.CacheN},
		{"prefilled_prompt_tokens", "Prompt tokens the engine computed (timings.prompt_n).", st.Timings.PromptN},
	} {
		fmt.Fprintf(w, "# HELP sidecar_engine_%s_total %s\n# TYPE sidecar_engine_%s_total counter\nsidecar_engine_%s_total %d\n", m.name, m.help, m.name, m.name, m.v)
	}
	fmt.Fprintf(w, "# HELP sidecar_engine_restore_seconds_total Time spent restoring states that the engine then reused.\n# TYPE sidecar_engine_restore_seconds_total counter\nsidecar_engine_restore_seconds_total %g\n", st.RestoreMsTotal/1000)
	fmt.Fprintf(w, "# HELP sidecar_engine_replaced_prefill_seconds_total Prefill time those restores replaced, at the measured prefill rate.\n# TYPE sidecar_engine_replaced_prefill_seconds_total counter\nsidecar_engine_replaced_prefill_seconds_total %g\n", st.ReplacedPrefillMs/1000)
	fmt.Fprintf(w, "# HELP sidecar_engine_save_seconds_mean Mean slot save time.\n# TYPE sidecar_engine_save_seconds_mean gauge\nsidecar_engine_save_seconds_mean %g\n", st.MeanSaveMs/1000)
	fmt.Fprintf(w, "# HELP sidecar_engine_restore_seconds_mean Mean slot restore time.\n# TYPE sidecar_engine_restore_seconds_mean gauge\nsidecar_engine_restore_seconds_mean %g\n", st.MeanRestoreMs/1000)
	fmt.Fprintf(w, "# HELP sidecar_engine_preload_seconds_mean Mean time of a preload (fetch from the tiers and restore), off the request path.\n# TYPE sidecar_engine_preload_seconds_mean gauge\nsidecar_engine_preload_seconds_mean %g\n", st.MeanPreloadMs/1000)
	fmt.Fprintf(w, "# HELP sidecar_engine_queue_depth Slots whose KV waits for a background save.\n# TYPE sidecar_engine_queue_depth gauge\nsidecar_engine_queue_depth %d\n", st.QueueDepth)
	fmt.Fprintf(w, "# HELP sidecar_engine_states Engine states kept.\n# TYPE sidecar_engine_states gauge\nsidecar_engine_states %d\n", st.States)
	fmt.Fprintf(w, "# HELP sidecar_engine_state_bytes Bytes of the engine states kept.\n# TYPE sidecar_engine_state_bytes gauge\nsidecar_engine_state_bytes %d\n", st.StateBytes)
	if len(st.StatesByTier) > 0 {
		fmt.Fprintln(w, "# HELP sidecar_engine_states_tier Engine states by the fastest tier holding them.\n# TYPE sidecar_engine_states_tier gauge")
		for _, t := range []string{"focus", "working", "archive"} {
			if n, ok := st.StatesByTier[t]; ok {
				fmt.Fprintf(w, "sidecar_engine_states_tier{tier=%q} %d\n", t, n)
			}
		}
		fmt.Fprintln(w, "# HELP sidecar_engine_state_bytes_tier Bytes of the engine states by the fastest tier holding them.\n# TYPE sidecar_engine_state_bytes_tier gauge")
		for _, t := range []string{"focus", "working", "archive"} {
			if n, ok := st.StateBytesByTier[t]; ok {
				fmt.Fprintf(w, "sidecar_engine_state_bytes_tier{tier=%q} %d\n", t, n)
			}
		}
	}
	restoresOff := 0
	if st.RestoresOff {
		restoresOff = 1
	}
	fmt.Fprintf(w, "# HELP sidecar_engine_restores_off Whether restores stopped because the engine did not reuse them.\n# TYPE sidecar_engine_restores_off gauge\nsidecar_engine_restores_off %d\n", restoresOff)
}
