package engine

import (
	"fmt"
	"strconv"
)

// Facts are what the console's KV page shows of a connector, as text, so
// the page knows no connector's counters: the engine card (Status, and
// Summary below it), the engine panel's lines after the connector's name,
// and its table of the states kept by tier.
type Facts struct {
	// Status is the card's value: "on", "disabled", or the connector's
	// own word for a state (llamacpp: "restores off").
	Status string `json:"status"`
	// Summary is the card's line: what the connector did.
	Summary string `json:"summary"`
	// Lines are the panel's facts, in order.
	Lines []Fact `json:"lines,omitempty"`
	// Tiers are the engine states the connector keeps in the KV tiers, by
	// the fastest tier holding them, fastest first; none for a connector
	// that keeps none.
	Tiers []TierFact `json:"tiers,omitempty"`
}

// Fact is one line of the console's engine panel.
type Fact struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// TierFact is one tier's engine states: how many, and their bytes.
type TierFact struct {
	Tier   string `json:"tier"`
	States int    `json:"states"`
	Bytes  int64  `json:"bytes"`
}

// DefaultFacts are the facts of a connector that shows only its Stats:
// enabled or not, its requests, the engine's slots and background gate
// when it has slots, and the engine's prompt tokens.
func DefaultFacts(st Stats) Facts {
	f := Facts{Status: StatusOf(st), Summary: FormatCount(st.Requests) + " requests"}
	if st.Slots > 0 {
		f.Lines = append(f.Lines, Fact{"Slots", fmt.Sprintf("%d; %s background calls, %s cancelled for a client, %s client waits",
			st.Slots, FormatCount(st.BackgroundCalls), FormatCount(st.BackgroundCancelled), FormatCount(st.ClientWaits))})
	}
	f.Lines = append(f.Lines, PromptTokensFact(st))
	return f
}

// StatusOf is "on", or "disabled" once the connector found the engine
// unable to do its job.
func StatusOf(st Stats) string {
	if st.Enabled {
		return "on"
	}
	return "disabled"
}

// PromptTokensFact is the line of the engine's prompt tokens: reused from
// its KV, and prefilled.
func PromptTokensFact(st Stats) Fact {
	return Fact{"Prompt tokens", FormatCount(st.Timings.CacheN) + " reused, " + FormatCount(st.Timings.PromptN) + " prefilled"}
}

// FormatCount writes n with thousands separators, as the console writes
// counts ("12,345").
func FormatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	out := make([]byte, 0, len(s)+len(s)/3+1)
	if neg {
		out = append(out, '-')
	}
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// FormatBytes writes n in binary units, as the console writes sizes
// ("512 B", "1.5 MiB").
func FormatBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return strconv.FormatInt(n, 10) + " B"
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[i]
}

// FormatSeconds writes a duration in seconds with two decimals ("1.25").
func FormatSeconds(s float64) string { return strconv.FormatFloat(s, 'f', 2, 64) }
