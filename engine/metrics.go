package engine

import (
	"fmt"

	"github.com/kvsidecar/kvsidecar/internal/obs"
)

// mirrorStats sets the families every connector writes from st: whether it
// is enabled, its hooks, the engine's prompt tokens and the background
// gate. A connector's MetricsExporter writes the rest.
func mirrorStats(reg *obs.Registry, st Stats) {
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
		{"background_calls", "The sidecar's own calls placed on slots.", st.BackgroundCalls},
		{"background_cancelled", "The sidecar's own calls cancelled because a client request needed their slot.", st.BackgroundCancelled},
		{"client_waits", "Client requests placed on a slot busy with the sidecar's own work (the goal is 0).", st.ClientWaits},
		{"reused_tokens", "Prompt tokens the engine did not reprocess thanks to a restore.", st.ReusedTokens},
		{"cached_prompt_tokens", "Prompt tokens the engine reused from its KV (timings.cache_n).", st.Timings.CacheN},
		{"prefilled_prompt_tokens", "Prompt tokens the engine computed (timings.prompt_n).", st.Timings.PromptN},
	} {
		reg.SetCounter("sidecar_engine_"+m.name+"_total", m.help, m.v)
	}
}
