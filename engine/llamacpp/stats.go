package llamacpp

import "github.com/kvsidecar/kvsidecar/engine"

// Stats is a snapshot of the connector's counters: those every connector
// keeps (engine.Stats, embedded: one JSON object) and its slots', saves',
// restores' and preloads'.
type Stats struct {
	engine.Stats

	SlotHits      int64 `json:"slot_hits"`
	SlotAssigns   int64 `json:"slot_assigns"`
	Evictions     int64 `json:"evictions"`
	Saves         int64 `json:"saves"`
	SaveErrors    int64 `json:"save_errors"`
	SaveEmpty     int64 `json:"save_empty"`
	ParseErrors   int64 `json:"parse_errors"`
	Restores      int64 `json:"restores"`
	RestoreMisses int64 `json:"restore_misses"`
	RestoreErrors int64 `json:"restore_errors"`
	SavedBytes    int64 `json:"saved_bytes"`
	RestoredBytes int64 `json:"restored_bytes"`
	// MeanSaveMs and MeanRestoreMs are the mean wall time of a successful
	// save (HTTP call, reading and parsing the file, storing it) and
	// restore (fetching from the tiers, writing the file, HTTP call).
	MeanSaveMs    float64 `json:"mean_save_ms"`
	MeanRestoreMs float64 `json:"mean_restore_ms"`
	// RestoredFrom counts restores by the tier that held the state.
	RestoredFrom map[string]int64 `json:"restored_from,omitempty"`
	// RestoreSkips counts states found but not worth restoring (too short,
	// or the restore would cost more than the prefill it saves).
	RestoreSkips int64 `json:"restore_skips"`
	// PrefixReuses counts restores of a state another session saved.
	PrefixReuses int64 `json:"prefix_reuses"`
	// Refused counts states not restored because the server's KV layout
	// differs from theirs.
	Refused int64 `json:"refused"`
	// UnusedRestores counts restores the engine accepted but did not
	// reuse; RestoresOff is true once they stopped restores.
	UnusedRestores int64 `json:"unused_restores"`
	RestoresOff    bool  `json:"restores_off"`
	// KVShifts counts answers in which the engine moved the KV a prompt
	// kept past a change (KV shifting, Options.CacheReuse), KVShiftMisses
	// those in which it computed that KV again; ShiftsKV is the verdict
	// (Connector.ShiftsKV).
	KVShifts      int64 `json:"kv_shifts"`
	KVShiftMisses int64 `json:"kv_shift_misses"`
	ShiftsKV      bool  `json:"shifts_kv"`
	// Restarts counts times the server was found restarted or unreachable;
	// SlotsLost slots whose KV another client replaced.
	Restarts  int64 `json:"restarts"`
	SlotsLost int64 `json:"slots_lost"`
	// Preloads counts states restored into an idle slot ahead of their
	// session's request (Options.Preload), off the request path:
	// Restores counts only those on it. PreloadsUsed counts the preloaded
	// states their session came back to; PreloadsWasted those another
	// session's placement, a forget or an engine restart dropped first;
	// PreloadsAbandoned the preloads given up before the engine was asked
	// (a client request arrived while the state was fetched);
	// PreloadWaits the client requests that waited for the preload of
	// their own state to finish; PreloadErrors the preloads that failed.
	// MeanPreloadMs is the mean time of a preload (fetch and restore).
	Preloads          int64   `json:"preloads"`
	PreloadsUsed      int64   `json:"preloads_used"`
	PreloadsWasted    int64   `json:"preloads_wasted"`
	PreloadsAbandoned int64   `json:"preloads_abandoned"`
	PreloadWaits      int64   `json:"preload_waits"`
	PreloadErrors     int64   `json:"preload_errors"`
	MeanPreloadMs     float64 `json:"mean_preload_ms"`
	// States and StateBytes describe the states kept; StatesByTier where.
	States           int              `json:"states"`
	StateBytes       int64            `json:"state_bytes"`
	StatesByTier     map[string]int   `json:"states_by_tier,omitempty"`
	StateBytesByTier map[string]int64 `json:"state_bytes_by_tier,omitempty"`
	// StatesDeleted counts states dropped (superseded or over the cap).
	StatesDeleted int64 `json:"states_deleted"`
	// ReplacedPrefillMs is what prefilling the tokens restores let the
	// engine reuse (Stats.ReusedTokens) would have cost at the measured
	// rate, against RestoreMsTotal, what the restores took.
	ReplacedPrefillMs float64 `json:"replaced_prefill_ms"`
	RestoreMsTotal    float64 `json:"restore_ms_total"`
	// QueueDepth is the slots whose KV waits for a background save.
	QueueDepth int `json:"queue_depth"`
	// SharedPuts counts states written through to the fleet's shared
	// store, SharedFetches states taken from it (another replica's), and
	// SharedErrors its failures (the request went on with local states).
	SharedPuts    int64 `json:"shared_puts"`
	SharedFetches int64 `json:"shared_fetches"`
	SharedErrors  int64 `json:"shared_errors"`
}

// Report returns Stats, the connector's engine.Reporter hook.
func (c *Connector) Report() engine.Report { return c.Stats() }
