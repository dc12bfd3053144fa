// Package tiers owns the three levels where KV blocks live and the rules
// that move blocks between them:
//
//   - Focus: device memory reached through a gpu.Device (a CPU device when
//     there is no GPU), the fastest and smallest;
//   - Working: host RAM;
//   - Archive: one file per block under a directory, zstd-compressed after
//     splitting 16-bit values into byte planes, checked with CRC32C,
//     surviving restarts.
//
// A Store combines them. Each tier has byte and token budgets with soft and
// hard watermarks (Budget). Eviction order within Focus and Working is a
// Policy: w-tinylfu (the default), lru, lfu, weighted, lru-k or hybrid with
// its presets; bench/simulator measures them against Belady's optimum and
// otter's W-TinyLFU on traces a Store records through Options.Trace. Blocks
// move down (Focus→Working→Archive) when a tier passes its soft watermark,
// done by one goroutine the store owns, and up one tier when an access lifts
// a block's hot score to the promotion threshold. Stats times both, by the
// tier a block left (TierStats.PromotionLatency: lookups served from Working
// or the Archive; DemotionLatency: each move down), and counts the Archive's
// bytes before compression (RawBytes) for its compression ratio. A Tuner
// (the AdaptiveTuner, tuner.go) moves the eviction policy's balance
// (Tunable), the promotion threshold and the Archive's zstd level in
// bounded steps from those figures while the store runs.
//
// Invariants:
//   - A key is in at most one of Focus and Working. If the Archive holds it
//     too, the Archive's copy is identical (a non-durable Put of a new value
//     deletes the old file first).
//   - Get never waits for maintenance: it takes each tier's lock only to look
//     up and record the access, and promotes only under TryLock and only
//     into room that exists.
//   - A durable Put that returned nil is on disk: written with
//     durable.WriteAtomicFS (temporary file, fsync, rename, folder fsync);
//     a Stage wrote the same file without the fsyncs (it survives kill -9,
//     and a power loss once SyncArchive ran after it). A
//     file that fails any check is moved to quarantine/ and reported, never
//     served and never fatal; temporary files left by a crash are removed on
//     open. A shared disk budget trims the archive by plain deletion, least
//     recently used first (Store.TrimDisk).
//   - Archive file names are hashes of keys, never the keys themselves.
//   - Every goroutine belongs to a Store and stops in Close.
package tiers
