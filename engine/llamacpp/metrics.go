package llamacpp

import (
	"fmt"

	"github.com/kvsidecar/kvsidecar/internal/obs"
)

// ExportMetrics registers the connector's own sidecar_engine_* families in
// reg, mirrored from Stats at each scrape: its engine.MetricsExporter hook
// (engine.Hooks writes those of engine.Stats).
func (c *Connector) ExportMetrics(reg *obs.Registry) {
	seen := map[string]bool{} // tiers that held states: they read 0 once empty
	reg.OnScrape(func() {
		st := c.Stats()
		for _, m := range []struct {
			name, help string
			v          int64
		}{
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
			{"kv_shifts", "Answers in which the engine moved the KV a prompt kept past a change (KV shifting).", st.KVShifts},
			{"kv_shift_misses", "Answers in which the engine computed again the KV a prompt kept past a change.", st.KVShiftMisses},
			{"restarts", "Times the engine was found restarted or unreachable.", st.Restarts},
			{"preloads", "States restored into an idle slot ahead of their session's request (predictive preload), off the request path.", st.Preloads},
			{"preloads_used", "Preloaded states their session came back to.", st.PreloadsUsed},
			{"preloads_wasted", "Preloaded states dropped before their session came back (a wrong prediction).", st.PreloadsWasted},
			{"preloads_abandoned", "Preloads given up before the engine was asked, because a client request arrived.", st.PreloadsAbandoned},
			{"preload_waits", "Client requests that waited for the preload of their own state to finish.", st.PreloadWaits},
			{"preload_errors", "Preloads that failed.", st.PreloadErrors},
			{"states_deleted", "States dropped (superseded or over the cap).", st.StatesDeleted},
			{"shared_puts", "States written through to the fleet's shared store (--remote).", st.SharedPuts},
			{"shared_fetches", "States taken from the fleet's shared store (computed on another replica).", st.SharedFetches},
			{"shared_errors", "Exchanges with the fleet's shared store that failed (requests went on with local states).", st.SharedErrors},
		} {
			reg.SetCounter("sidecar_engine_"+m.name+"_total", m.help, m.v)
		}
		reg.SetCounter("sidecar_engine_native_saves_total", "Session KV saved before a client's own slot restore or erase (llama.cpp's /slots API) replaced it.", c.nativeSaves.Load())
		reg.SetCounter("sidecar_engine_native_placed_total", "Requests to the engine's native API placed on the slot their id_slot named (its session KV saved first).", c.nativePlaced.Load())
		reg.SetFloatCounter("sidecar_engine_restore_seconds_total", "Time spent restoring states that the engine then reused.", st.RestoreMsTotal/1000)
		reg.SetFloatCounter("sidecar_engine_replaced_prefill_seconds_total", "Prefill time those restores replaced, at the measured prefill rate.", st.ReplacedPrefillMs/1000)
		reg.SetGauge("sidecar_engine_save_seconds_mean", "Mean slot save time.", st.MeanSaveMs/1000)
		reg.SetGauge("sidecar_engine_restore_seconds_mean", "Mean slot restore time.", st.MeanRestoreMs/1000)
		reg.SetGauge("sidecar_engine_preload_seconds_mean", "Mean time of a preload (fetch from the tiers and restore), off the request path.", st.MeanPreloadMs/1000)
		reg.SetGauge("sidecar_engine_queue_depth", "Slots whose KV waits for a background save.", float64(st.QueueDepth))
		reg.SetGauge("sidecar_engine_states", "Engine states kept.", float64(st.States))
		reg.SetGauge("sidecar_engine_state_bytes", "Bytes of the engine states kept.", float64(st.StateBytes))
		for _, t := range stateTiers {
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
		shifts := 0.0
		if st.ShiftsKV {
			shifts = 1
		}
		reg.SetGauge("sidecar_engine_shifts_kv", "Whether the engine was seen moving the KV a prompt keeps past a change (KV shifting; memory then evicts in small, ordered steps).", shifts)
	})
}

// stateTiers are the tiers states are counted by, fastest first.
var stateTiers = [...]string{"focus", "working", "archive"}
