package index

import (
	"errors"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// errCorrupt marks a persisted index that cannot be used: missing,
// truncated, failing its checksum, malformed, or written with another
// embedder or dimension; callers match durable.ErrCorrupt. The caller
// rebuilds from its documents (Index.Rebuild); the file is never partially
// trusted.
var errCorrupt = durable.NewCorrupt("index: persisted index missing or corrupt")

// Sentinel errors. Classify with errors.Is; the returned errors wrap them with
// context and the "index:" prefix. A persisted index that cannot be used
// matches durable.ErrCorrupt.
var (
	// ErrNotFound: no document with that ID.
	ErrNotFound = errors.New("index: not found")
	// ErrDuplicate: Add of an ID that is already indexed (use Upsert).
	ErrDuplicate = errors.New("index: duplicate id")
	// ErrInvalid: a bad argument or option (empty ID, k < 1, wrong vector
	// dimension, negative weight, unknown mode).
	ErrInvalid = errors.New("index: invalid argument")
	// ErrEmbed: the embedder failed or returned unusable vectors.
	ErrEmbed = errors.New("index: embedding failed")
)
