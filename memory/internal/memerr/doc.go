// Package memerr holds the sentinel errors package memory shares with its
// subsystems (memory/internal/…). Package memory re-exports each under the
// same name (memory.ErrNotFound is memerr.ErrNotFound), so callers match
// them with errors.Is whichever subsystem returned them. It holds no state.
package memerr
