package llamacpp

import (
	"fmt"

	"github.com/kvsidecar/kvsidecar/engine"
)

// ConsoleFacts returns what the console's KV page shows of the connector,
// its engine.ConsoleReporter hook: enabled, restores off or disabled; its
// saves, restores and preloads; its slots, the states it keeps by tier, and
// what restoring cost against the prefill it replaced.
func (c *Connector) ConsoleFacts() engine.Facts {
	st := c.Stats()
	f := engine.Facts{Status: engine.StatusOf(st.Stats)}
	if st.Enabled && st.RestoresOff {
		f.Status = "restores off"
	}
	f.Summary = fmt.Sprintf("%s requests, %s saves, %s restores on the request path",
		engine.FormatCount(st.Requests), engine.FormatCount(st.Saves), engine.FormatCount(st.Restores))
	if st.Preloads > 0 {
		f.Summary += fmt.Sprintf(", %s preloaded ahead (%s used, %s wasted)",
			engine.FormatCount(st.Preloads), engine.FormatCount(st.PreloadsUsed), engine.FormatCount(st.PreloadsWasted))
	}
	if st.Slots > 0 {
		f.Lines = append(f.Lines, engine.Fact{Name: "Slots", Value: fmt.Sprintf("%d; %s hits, %s assigns, %s evictions",
			st.Slots, engine.FormatCount(st.SlotHits), engine.FormatCount(st.SlotAssigns), engine.FormatCount(st.Evictions))})
	}
	f.Lines = append(f.Lines,
		engine.Fact{Name: "States kept", Value: fmt.Sprintf("%s (%s)", engine.FormatCount(int64(st.States)), engine.FormatBytes(st.StateBytes))},
		engine.PromptTokensFact(st.Stats),
		engine.Fact{Name: "Restore vs prefill", Value: fmt.Sprintf("%s s restoring replaced %s s of prefill",
			engine.FormatSeconds(st.RestoreMsTotal/1000), engine.FormatSeconds(st.ReplacedPrefillMs/1000))})
	for _, t := range stateTiers {
		if n, ok := st.StatesByTier[t]; ok {
			f.Tiers = append(f.Tiers, engine.TierFact{Tier: t, States: n, Bytes: st.StateBytesByTier[t]})
		}
	}
	return f
}
