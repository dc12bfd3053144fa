package engine

import (
	"context"
	"errors"
)

// Snapshotter is the hook of a connector that keeps a session's KV states
// (llamacpp): context snapshots (.hctx) carry them as their engine section,
// which the connector alone reads and writes. The proxy assembles the file
// (proxy/snapshot.go).
type Snapshotter interface {
	// ExportStates returns the engine section of a session's snapshot:
	// its saved states, newest first, within maxBytes.
	ExportStates(ctx context.Context, tenant, sessionID string, maxBytes int64) ([]byte, StatesInfo, error)
	// CheckStates checks an engine section against this connector's engine
	// (every state whole, the same model and KV layout) and imports nothing.
	CheckStates(ctx context.Context, tenant string, section []byte) (StatesInfo, error)
	// ImportStates takes an engine section's states as the session's.
	ImportStates(ctx context.Context, tenant, sessionID string, section []byte) (StatesInfo, error)
}

var (
	// ErrOtherModel: a snapshot's engine states were saved by a server
	// running another model (fingerprint) or another KV layout (cache
	// type, flash attention) than this connector's server. Nothing was
	// imported.
	ErrOtherModel = errors.New("engine: the snapshot's KV states are of another model")
	// ErrUnavailable: the engine could not be reached (or has no slot
	// API) to check a snapshot's states against its model.
	ErrUnavailable = errors.New("engine: the engine cannot be reached to check the snapshot's model")
)

// StatesInfo describes the engine section of a snapshot.
type StatesInfo struct {
	// States and Bytes are the states carried and their slot files' size;
	// Tokens the tokens of the longest.
	States int   `json:"states"`
	Tokens int   `json:"tokens"`
	Bytes  int64 `json:"bytes"`
	// Fingerprint and Layout name the model and KV layout that saved them.
	Fingerprint string `json:"fingerprint,omitempty"`
	Layout      string `json:"layout,omitempty"`
	// Skipped are states left out: beyond the size bound on export,
	// saved under another API key on import.
	Skipped int `json:"skipped,omitempty"`
}
