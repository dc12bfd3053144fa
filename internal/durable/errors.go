package durable

// ErrCorrupt marks bytes on disk that failed their checks (bad magic,
// length or checksum). Classify with errors.Is; packages that need their own
// prefix make their sentinel with NewCorrupt, which matches ErrCorrupt too.
var ErrCorrupt error = &corruptError{"durable: corrupt data"}

type corruptError struct{ msg string }

func (e *corruptError) Error() string { return e.msg }

// Is makes every sentinel made by NewCorrupt match ErrCorrupt.
func (e *corruptError) Is(target error) bool { return target == ErrCorrupt }

// NewCorrupt returns a new corruption sentinel with message msg (which
// should carry the package prefix, e.g. "tiers: corrupt block"). It is
// distinct from every other sentinel and matches ErrCorrupt.
func NewCorrupt(msg string) error { return &corruptError{msg} }
