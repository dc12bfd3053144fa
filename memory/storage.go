package memory

import (
	"errors"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/retention"
)

// StorageOptions bound what a Store keeps on disk and in open files. The
// zero value of every field is a documented default.
type StorageOptions struct {
	// MaxOpenFiles bounds the session and pool log files kept open; the
	// least recently used idle ones are closed and reopen on their next
	// write. Zero: a quarter of the process's RLIMIT_NOFILE, between 16 and
	// 65536 (durable.DefaultMaxOpen).
	MaxOpenFiles int

	// SessionTTL deletes a session (its log and index) once nothing was
	// written to it for this long. Zero: sessions never expire.
	SessionTTL time.Duration
	// MaxDiskBytes bounds the bytes under Options.Dir plus Shared's. Over
	// it, the retention sweep first trims Shared (cache that can be
	// recomputed), then deletes quarantined files, then the least recently
	// written sessions, until usage is under it. Zero: no bound.
	MaxDiskBytes int64
	// Shared is another store counted in MaxDiskBytes (the KV archive).
	// Nil: none.
	Shared DiskUser
	// SweepEvery is the period of the retention sweep (a walk of
	// Options.Dir in a goroutine the Store owns, never on the request path,
	// linear in the sessions stored). Zero: one minute. Without SessionTTL
	// and MaxDiskBytes it runs hourly at most (temporary files, orphaned
	// indexes, old quarantine, the disk figure of Stats).
	SweepEvery time.Duration
	// QuarantineTTL deletes quarantined files (damaged log bytes kept for
	// inspection) older than this. Zero: 7 days.
	QuarantineTTL time.Duration

	// MaxReplyBytes bounds what is kept of one recorded reply (its text and
	// tool calls): a longer reply is recorded cut to this many bytes and
	// marked partial, so a huge upstream answer costs bounded memory, disk
	// and tokenizing. Zero: 1 MiB.
	MaxReplyBytes int
}

// DiskUser is a store sharing the disk budget (DiskBytes, TrimDisk; see
// package memory/internal/retention).
type DiskUser = retention.DiskUser

func (o *StorageOptions) ensureDefaults() {
	if o.SweepEvery == 0 {
		o.SweepEvery = time.Minute
	}
	if o.QuarantineTTL == 0 {
		o.QuarantineTTL = 7 * 24 * time.Hour
	}
	if o.MaxReplyBytes == 0 {
		o.MaxReplyBytes = 1 << 20
	}
}

func (o *StorageOptions) validate() error {
	if o.MaxOpenFiles < 0 || o.MaxDiskBytes < 0 || o.MaxReplyBytes < 0 {
		return errors.New("memory: storage sizes must not be negative")
	}
	if o.SessionTTL < 0 || o.SweepEvery < 0 || o.QuarantineTTL < 0 {
		return errors.New("memory: storage durations must not be negative")
	}
	return nil
}
