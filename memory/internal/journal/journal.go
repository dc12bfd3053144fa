package journal

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// Magic starts every log written now; LegacyMagic starts version 1 logs,
// converted on open.
var (
	Magic       = []byte("KVSMLOG2")
	LegacyMagic = []byte("KVSMLOG1")
)

// errCorrupt marks a log whose head cannot be read (ReadFirst); it matches
// durable.ErrCorrupt.
var errCorrupt = durable.NewCorrupt("memory: corrupt log")

// Options configure a Journal. The zero value of each field is a
// documented default.
type Options struct {
	// MaxRecord bounds one record's payload. Zero: durable.DefaultMaxRecord.
	MaxRecord int
	// Quarantine is the folder where damaged bytes are kept. Empty: they
	// are dropped.
	Quarantine string
	// Files bounds the descriptors open logs hold. Nil: unbounded.
	Files *durable.Files
	// SyncAppends fsyncs every append before it returns (memory's
	// FsyncAlways).
	SyncAppends bool
	// NoSync never fsyncs: not on creation, repair or close (memory's
	// FsyncNever).
	NoSync bool
	// Now stamps quarantined files. Nil: time.Now.
	Now func() time.Time
	// Logger reports repairs. Nil: slog.Default().
	Logger *slog.Logger
}

// Journal opens and creates logs with one set of Options and counts their
// repairs. Safe for concurrent use.
type Journal struct {
	o                        Options
	quarantined, recordsLost atomic.Int64
}

// New returns a Journal for o.
func New(o Options) *Journal {
	if o.MaxRecord <= 0 {
		o.MaxRecord = durable.DefaultMaxRecord
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Journal{o: o}
}

// MaxRecord is the bound on one record's payload.
func (j *Journal) MaxRecord() int { return j.o.MaxRecord }

// Quarantine is the folder damaged bytes go to.
func (j *Journal) Quarantine() string { return j.o.Quarantine }

// Stats are the journal's repair counters.
type Stats struct {
	Quarantined int64 // logs repaired or quarantined on open
	RecordsLost int64 // damaged records skipped on open
}

// Stats returns the repair counters.
func (j *Journal) Stats() Stats {
	return Stats{Quarantined: j.quarantined.Load(), RecordsLost: j.recordsLost.Load()}
}

// CountQuarantined counts a log moved to quarantine whole by its owner.
func (j *Journal) CountQuarantined() { j.quarantined.Add(1) }

// Log is one append-only record log.
type Log struct {
	l              *durable.Log
	sync, noSyncOn bool
}

func (j *Journal) logOptions() durable.LogOptions {
	return durable.LogOptions{Magic: Magic, MaxRecord: j.o.MaxRecord, Quarantine: j.o.Quarantine,
		Files: j.o.Files, NoSync: j.o.NoSync, Now: j.o.Now}
}

func (j *Journal) wrap(l *durable.Log) *Log {
	return &Log{l: l, sync: j.o.SyncAppends, noSyncOn: j.o.NoSync}
}

// Open opens an existing log, calling fn for each intact record's payload
// (valid during the call) in order, and repairs it (see durable.OpenLog:
// damaged records are skipped, a torn tail cut, a damaged magic
// rewritten; what was removed is kept under the quarantine folder). A
// version 1 log is first converted. A missing file is an error matching
// fs.ErrNotExist.
func (j *Journal) Open(path string, fn func(payload []byte)) (*Log, durable.Recovery, error) {
	if err := j.convertLegacy(path); err != nil {
		return nil, durable.Recovery{}, err
	}
	l, rep, err := durable.OpenLog(path, j.logOptions(), fn)
	if err != nil {
		return nil, rep, err // names the operation and the file
	}
	return j.wrap(l), rep, nil
}

// Create creates a new log holding the magic and the framed records in
// first, fsynced with its folder whatever the append policy (unless
// NoSync): creation is rare and a file that vanished would lose every
// later record.
func (j *Journal) Create(path string, first []byte) (*Log, error) {
	l, err := durable.CreateLog(path, j.logOptions(), first)
	if err != nil {
		return nil, err
	}
	return j.wrap(l), nil
}

// Records opens the log at path (repairing it as Open does) and returns
// copies of its payloads in order, leaving it closed.
func (j *Journal) Records(path string) ([][]byte, error) {
	var payloads [][]byte
	l, _, err := j.Open(path, func(p []byte) { payloads = append(payloads, bytes.Clone(p)) })
	if err != nil {
		return nil, err
	}
	l.l.Close(false)
	return payloads, nil
}

// Rewrite replaces the log l at path with image (magic and records, see
// Image), atomically (durable.WriteFile), and returns the log reopened.
// When the write fails the old file stays and is reopened (the failure is
// logged); when closing l fails, l is returned as it is; nil when
// reopening fails.
func (j *Journal) Rewrite(l *Log, path string, image []byte) (*Log, error) {
	if err := l.Close(); err != nil {
		return l, err
	}
	if err := durable.WriteFile(path, image); err != nil {
		j.o.Logger.Warn("memory: compact log", "file", filepath.Base(path), "err", err)
	}
	nl, _, err := j.Open(path, func([]byte) {})
	return nl, err
}

// NoteRepair counts and logs what opening the log at path repaired (rep)
// and the records its owner rejected; what names the log's kind. It
// reports whether there was anything to note.
func (j *Journal) NoteRepair(rep durable.Recovery, rejected int, path, what string) bool {
	if !rep.Repaired() && rejected == 0 {
		return false
	}
	j.quarantined.Add(1)
	j.recordsLost.Add(int64(rep.Damaged + rejected))
	j.o.Logger.Warn("memory: repaired a damaged "+what+" log", "file", filepath.Base(path),
		"records", rep.Records, "damaged", rep.Damaged, "damaged_bytes", rep.DamagedBytes, "rejected", rejected,
		"tail_bytes", rep.TailBytes, "bad_magic", rep.BadMagic, "saved", rep.Quarantined)
	return true
}

// Settle finishes opening a log that is not a session's (what names it in
// messages): it notes what was repaired, and deals with the two cases that
// leave nothing to use, closing l: a log of another scope (foreign) is
// quarantined, a log with no intact record (a creation never acknowledged)
// removed. It reports whether l is to be used, and the error of a
// quarantine or removal that failed.
func (j *Journal) Settle(l *Log, rep durable.Recovery, rejected int, foreign bool, path, what string) (bool, error) {
	j.NoteRepair(rep, rejected, path, what)
	switch {
	case foreign:
		l.Close()
		if _, err := durable.Quarantine(path, j.o.Quarantine, j.o.Now()); err != nil {
			return false, fmt.Errorf("memory: quarantine foreign %s log: %w", what, err)
		}
		return false, nil
	case rep.Records == 0:
		l.Close()
		return false, os.Remove(path)
	}
	return true, nil
}

// ReadFirst returns the payload of a log's first intact record (a session
// log's meta record) without opening it for writing, reading only the
// file's head; a version 1 log is read as such.
func (j *Journal) ReadFirst(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	maxPayload := j.o.MaxRecord
	head, err := io.ReadAll(io.LimitReader(f, int64(len(Magic)+min(maxPayload, 1<<16)+durable.RecordHeaderSize)))
	if err != nil {
		return nil, err
	}
	if len(head) < len(Magic) {
		return nil, errCorrupt
	}
	var first []byte
	switch magic, body := head[:len(Magic)], head[len(Magic):]; {
	case bytes.Equal(magic, Magic):
		durable.ScanRecords(body, maxPayload, func(_ int, p []byte) {
			if first == nil {
				first = p
			}
		})
	case bytes.Equal(magic, LegacyMagic):
		if ps, _ := LegacyRecords(body, maxPayload); len(ps) > 0 {
			first = ps[0]
		}
	}
	if first == nil {
		return nil, errCorrupt
	}
	return first, nil
}

// Image returns a log file's bytes: the magic, then each payload framed.
func Image(payloads ...[]byte) []byte {
	image := bytes.Clone(Magic)
	for _, p := range payloads {
		image = durable.AppendRecord(image, p)
	}
	return image
}

// Append writes framed records (built with durable.AppendRecord) as one
// write, fsynced when the journal's appends are. Errors come from package
// durable, which names the operation and the file.
func (l *Log) Append(framed []byte) error { return l.l.Append(framed, l.sync) }

// Sync fsyncs the log if it was written since the last fsync.
func (l *Log) Sync() error { return l.l.Sync() }

// Close fsyncs (unless the journal never syncs) and closes the file.
func (l *Log) Close() error { return l.l.Close(!l.noSyncOn) }

// TenantDir is the folder of a tenant's logs under root: named by a hash
// of the tenant, never by the client's string.
func TenantDir(root, tenant string) string {
	th := sha256.Sum256([]byte("tenant\x00" + tenant))
	return filepath.Join(root, hex.EncodeToString(th[:12]))
}
