package llamacpp

import (
	"log/slog"
	"sync/atomic"
)

// KV shifting. Past the prefix a new prompt shares with a slot's KV,
// llama-server can move chunks of the KV it holds to where the new prompt
// has them (n_cache_reuse, Options.CacheReuse) instead of computing them
// again: when the sidecar's memory cuts the oldest turns out of a window,
// the turns that stay are such a chunk. Whether the server does it depends
// on the model (sliding-window and recurrent KV cannot move) and on the
// prompt (not with media), and it says so only in its log, so the connector
// learns it from what the server answers: after a client request whose
// prompt dropped pieces of the slot's previous prompt and kept later ones,
// the engine's cache_n tells whether the kept ones were reused (moved) or
// computed. Memory asks (ShiftsKV) before choosing how to evict.

// Shift verdicts.
const (
	shiftUnknown int32 = iota
	shiftYes
	shiftNo
)

// shiftMinTokens is the least a request must have moved for its answer to
// tell anything: below it, the estimate's error could decide.
const shiftMinTokens = 128

// shiftNoAfter is how many requests in a row must find the moved pieces
// computed again before the connector concludes the server does not shift.
const shiftNoAfter = 2

// shiftEvidence judges one answer: prev is the prompt the slot computed
// last (for the same session), cur the request's, cacheN the tokens the
// engine took from its cache and total the prompt's tokens. Tokens are
// estimated from the pieces' bytes in proportion to the prompt's. It
// returns shiftUnknown when cur only extends prev or moved too little.
func shiftEvidence(prev, cur chain, cacheN, total int64) int32 {
	np, nc := len(prev.pieces), len(cur.pieces)
	if np == 0 || nc == 0 || total <= 0 || nc != len(cur.bytes) || cur.bytes[nc-1] <= 0 {
		return shiftUnknown
	}
	k := 0
	for k < np && k < nc && prev.pieces[k] == cur.pieces[k] {
		k++
	}
	if k == np {
		return shiftUnknown // an extension: nothing to move
	}
	// The pieces of cur after the prefix that prev holds further on, in
	// order, as the server walks them: the first one it lacks ends it.
	at := make(map[uint64][]int, np-k)
	for i := k; i < np; i++ {
		at[prev.pieces[i]] = append(at[prev.pieces[i]], i)
	}
	var moved int64
	from := k
	for j := k; j < nc; j++ {
		f := -1
		for _, i := range at[cur.pieces[j]] {
			if i >= from {
				f = i
				break
			}
		}
		if f < 0 {
			break
		}
		lo := int64(0)
		if j > 0 {
			lo = cur.bytes[j-1]
		}
		moved += cur.bytes[j] - lo
		from = f + 1
	}
	perByte := float64(total) / float64(cur.bytes[nc-1])
	prefix := 0.0
	if k > 0 {
		prefix = float64(cur.bytes[k-1]) * perByte
	}
	m := float64(moved) * perByte
	switch {
	case m < shiftMinTokens:
		return shiftUnknown
	case float64(cacheN) >= prefix+m/2:
		return shiftYes
	case float64(cacheN) <= prefix+m/8:
		return shiftNo
	}
	return shiftUnknown
}

// shiftState is what the connector learned about the server's KV shifting.
type shiftState struct {
	verdict      atomic.Int32
	noRun        atomic.Int32
	seen, missed atomic.Int64 // answers that moved KV, and that computed it again
}

// observe takes one answer's verdict.
func (s *shiftState) observe(v int32, log *slog.Logger) {
	switch v {
	case shiftYes:
		s.seen.Add(1)
		s.noRun.Store(0)
		if s.verdict.Swap(shiftYes) != shiftYes {
			log.Info("llamacpp: the server moves the KV a prompt keeps (KV shifting): memory evicts in small, ordered steps")
		}
	case shiftNo:
		s.missed.Add(1)
		if s.noRun.Add(1) >= shiftNoAfter && s.verdict.Swap(shiftNo) != shiftNo {
			log.Info("llamacpp: the server computes again the KV a prompt keeps after a change (no KV shifting for this model): memory evicts in large steps")
		}
	}
}

// reset forgets the verdict (another model, or the server restarted).
func (s *shiftState) reset() {
	s.verdict.Store(shiftUnknown)
	s.noRun.Store(0)
}

// ShiftsKV reports whether the server moves the KV a prompt keeps past a
// change (KV shifting, see Options.CacheReuse), for the model it serves
// (model is not consulted: a server serves one). True until answers showed
// the kept pieces computed again, twice in a row: most models' KV moves,
// and a wrong guess costs the first two evictions of the server's life
// a prefill each, where a late one would cost every session its first.
func (c *Connector) ShiftsKV(model string) bool {
	return c.shift.verdict.Load() != shiftNo
}
