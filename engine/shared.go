package engine

import (
	"context"
	"errors"
)

// SharedStates is a store of saved states that the replicas of a fleet
// share (package fleet implements it over a Redis/Valkey store). A
// connector with one writes every state it saves through to it, and a
// request whose longest prefix the connector's own catalog misses (or
// covers less) asks it: a session that moved from another replica, or
// whose replica died, finds the KV that replica computed.
//
// States are named as in the local catalog, by content (model
// fingerprint, owner, prompt prefix hash), and indexed by their chain's
// hashes under the model's fingerprint; those hashes are seeded with the
// tenant, so a lookup never finds another tenant's state.
type SharedStates interface {
	// PutState stores a state's file (raw) and metadata, then points each
	// of hashes at id. It returns after the store has both.
	PutState(ctx context.Context, fp, id string, hashes []string, raw, meta []byte) error
	// LookupState returns the state indexed under the longest of hashes
	// (hashes are a prompt's, shortest prefix first): its id and how many
	// hashes it covers, n == 0 when none.
	LookupState(ctx context.Context, fp string, hashes []string) (id string, n int, err error)
	// GetState returns a state's file and metadata; an error wrapping
	// ErrSharedNotFound when it is gone.
	GetState(ctx context.Context, id string) (raw, meta []byte, err error)
}

// ErrSharedNotFound marks a state the shared store no longer has.
var ErrSharedNotFound = errors.New("engine: shared state not found")
