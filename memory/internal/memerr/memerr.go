package memerr

import "errors"

var (
	// ErrNotFound: the session does not exist for this tenant (it may exist
	// for another tenant; callers cannot tell, by design).
	ErrNotFound = errors.New("memory: session not found")
	// ErrInvalid: the caller passed something unusable (empty session id,
	// malformed message). The proxy answers 400.
	ErrInvalid = errors.New("memory: invalid request")
	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("memory: store closed")
	// ErrSharedConflict: the shared log moved on (another replica wrote the
	// position this one meant to).
	ErrSharedConflict = errors.New("memory: shared log moved on")
)

// NotFound returns a sentinel with message msg that also matches
// ErrNotFound, so callers mapping ErrNotFound to 404 need no new case.
func NotFound(msg string) error { return &notFoundError{msg} }

type notFoundError struct{ msg string }

func (e *notFoundError) Error() string        { return e.msg }
func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }
