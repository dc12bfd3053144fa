package memory

import "encoding/json"

// PrefixStats is how much of a window equals the previous window of the
// same session, from the start.
type PrefixStats struct {
	// Messages are whole messages shared.
	Messages int
	// Bytes is the common byte prefix of the two windows serialized as
	// JSON arrays (AppendMessagesJSON).
	Bytes int
	// Tokens is the cost of the whole shared messages.
	Tokens int
}

// commonPrefix compares two windows (Turn.Messages of consecutive turns).
// Tokens is left 0; Turn.Stats.Prefix has it.
func commonPrefix(prev, cur []json.RawMessage) PrefixStats {
	return prefixStats(prev, cur, nil)
}

func prefixStats(prev, cur []json.RawMessage, costs []int) PrefixStats {
	var p PrefixStats
	if len(prev) == 0 || len(cur) == 0 {
		return p
	}
	p.Bytes = 1 // '['
	i := 0
	for ; i < len(prev) && i < len(cur); i++ {
		if i > 0 {
			p.Bytes++ // ','
		}
		a, b := prev[i], cur[i]
		n := commonBytes(a, b)
		p.Bytes += n
		if n < len(a) || n < len(b) {
			return p
		}
		p.Messages++
		if i < len(costs) {
			p.Tokens += costs[i]
		}
	}
	if len(prev) == len(cur) {
		p.Bytes++ // ']'
	}
	return p
}

func commonBytes(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
