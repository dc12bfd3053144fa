package proxy

import (
	"fmt"

	"github.com/kvsidecar/kvsidecar/engine"
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

// exportEngineMetrics mirrors the engine connector's counters into reg at
// each scrape.
func exportEngineMetrics(reg *obs.Registry, c engine.Connector) {
	seen := map[string]bool{} // tiers that held states: they read 0 once empty
	reg.OnScrape(func() {
		st := c.Stats()
		enabled := 0.0
		if st.Enabled {
			enabled = 1
		}
		reg.SetGauge(fmt.Sprintf("sidecar_engine_enabled{connector=%q}", st.Connector), "Whether the engine connector is active (1) or disabled (0).", enabled)
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
			reg.SetCounter("sidecar_engine_"+m.name+"_total", m.help, m.v)
		}
		reg.SetFloatCounter("sidecar_engine_restore_seconds_total", "Time spent restoring states that the engine then reused.", st.RestoreMsTotal/1000)
		reg.SetFloatCounter("sidecar_engine_replaced_prefill_seconds_total", "Prefill time those restores replaced, at the measured prefill rate.", st.ReplacedPrefillMs/1000)
		reg.SetGauge("sidecar_engine_save_seconds_mean", "Mean slot save time.", st.MeanSaveMs/1000)
		reg.SetGauge("sidecar_engine_restore_seconds_mean", "Mean slot restore time.", st.MeanRestoreMs/1000)
		reg.SetGauge("sidecar_engine_preload_seconds_mean", "Mean time of a preload (fetch from the tiers and restore), off the request path.", st.MeanPreloadMs/1000)
		reg.SetGauge("sidecar_engine_queue_depth", "Slots whose KV waits for a background save.", float64(st.QueueDepth))
		reg.SetGauge("sidecar_engine_states", "Engine states kept.", float64(st.States))
		reg.SetGauge("sidecar_engine_state_bytes", "Bytes of the engine states kept.", float64(st.StateBytes))
		for _, t := range []string{"focus", "working", "archive"} {
			if _, ok := st.StatesByTier[t]; ok || seen[t] {
				seen[t] = true
				reg.SetGauge(fmt.Sprintf("sidecar_engine_states_tier{tier=%q}", t), "Engine states by the fastest tier holding them.", float64(st.StatesByTier[t]))
				reg.SetGauge(fmt.Sprintf("sidecar_engine_state_bytes_tier{tier=%q}", t), "Bytes of the engine states by the fastest tier holding them.", float64(st.StateBytesByTier[t]))
			}
		}
		restoresOff := 0.0
		if st.RestoresOff {
			restoresOff = 1
		}
		reg.SetGauge("sidecar_engine_restores_off", "Whether restores stopped because the engine did not reuse them.", restoresOff)
	})
}
