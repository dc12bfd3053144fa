package journal

import "context"

// Shared is a record store the replicas of a fleet share (package fleet
// implements it over a Redis/Valkey store; package memory names it
// SharedLog). With one, a log is kept twice: every record is written to the
// shared list first, at its position, then to the local log; a replica
// brings its copy up to date from the shared list before it writes, so any
// replica can serve any session or pool and none forks its history.
type Shared interface {
	// Append writes payloads at positions at, at+1, … of the list of
	// (tenant, id) and returns the list's length. Records already there
	// with the same bytes are skipped (a retry is harmless); a position
	// taken by other bytes, or past the end, fails with an error wrapping
	// memerr.ErrSharedConflict.
	Append(ctx context.Context, tenant, id string, at int64, payloads [][]byte) (int64, error)
	// Records returns the list's records from position from on.
	Records(ctx context.Context, tenant, id string, from int64) ([][]byte, error)
	// Len returns the length of the list (0: none).
	Len(ctx context.Context, tenant, id string) (int64, error)
	// Replace replaces the list with payloads, atomically (a deleted
	// session's list becomes one tombstone record).
	Replace(ctx context.Context, tenant, id string, payloads [][]byte) error
}
