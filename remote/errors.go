package remote

import (
	"errors"
	"fmt"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// errCorrupt marks a blob whose manifest or chunk fails its checksum or
// size, or a value whose version does not parse; callers match
// durable.ErrCorrupt. Such a blob is never served.
var errCorrupt = durable.NewCorrupt("remote: corrupt")

// Sentinel errors; classify with errors.Is. Corruption matches
// durable.ErrCorrupt.
var (
	// ErrNotFound: no such blob, record range or index entry (never
	// written, deleted, or expired by its TTL).
	ErrNotFound = errors.New("remote: not found")
	// ErrConflict: a positioned append lost (a record sequence number
	// that holds different bytes).
	ErrConflict = errors.New("remote: conflict")
	// ErrGap: an append whose first sequence number lies past the end of
	// the list (records in between were never written).
	ErrGap = errors.New("remote: sequence gap")
	// ErrNotOwner: a fenced write or a renewal by a lease that is no
	// longer held (it expired and another owner took the session).
	ErrNotOwner = errors.New("remote: lease not held")
	// ErrHeld: the lease is held by another live owner.
	ErrHeld = errors.New("remote: lease held elsewhere")
	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("remote: closed")
)

// HeldError is returned (wrapping ErrHeld) when a session's lease belongs
// to another owner; Owner is that owner's address as it wrote it, so a
// caller can forward the request there.
type HeldError struct {
	Owner string
}

func (e *HeldError) Error() string { return fmt.Sprintf("remote: lease held by %s", e.Owner) }

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }
