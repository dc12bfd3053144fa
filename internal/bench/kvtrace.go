package bench

import (
	"github.com/kvsidecar/kvsidecar/internal/bench/cachesim"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// OpenKVTrace opens path for appending the accesses of a KV store, as
// bench/simulator replays them: record is a tiers.Options.Trace, close
// closes the file (what was recorded survives kill -9 without it). Keys
// are written as hashes, never as they are.
func OpenKVTrace(path string) (record func(tiers.TraceEvent), close func() error, err error) {
	w, err := cachesim.CreateTraceWriter(path)
	if err != nil {
		return nil, nil, err
	}
	return w.Record, w.Close, nil
}
