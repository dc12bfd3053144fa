package memory

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// logMagic starts every session and pool log written now; legacyMagic
// starts version 1 logs, converted on open.
var (
	logMagic    = []byte("KVSMLOG2")
	legacyMagic = []byte("KVSMLOG1")
)

// logFile is one session's (or pool's) append-only record log: a
// durable.Log whose fsyncs follow the store's FsyncPolicy and whose file
// descriptor is shared out by the store's durable.Files bound.
type logFile struct {
	*durable.Log
	policy FsyncPolicy
}

// logOptions are the durable options of the store's logs.
func (s *Store) logOptions() durable.LogOptions {
	return durable.LogOptions{
		Magic: logMagic, MaxRecord: s.opts.MaxRecordBytes, Quarantine: s.quarantine,
		Files: s.files, NoSync: s.opts.Fsync == FsyncNever, Now: s.opts.Clock.Now,
	}
}

// openLog opens an existing log, calling fn for each intact record's
// payload in order, and repairs it (see durable.OpenLog: damaged records
// are skipped, a torn tail cut, a damaged magic rewritten; what was removed
// is kept under the quarantine folder). A version 1 log is first converted.
// A missing file is an error matching fs.ErrNotExist.
func (s *Store) openLog(path string, fn func(payload []byte)) (*logFile, durable.Recovery, error) {
	if err := s.convertLegacy(path); err != nil {
		return nil, durable.Recovery{}, err
	}
	l, rep, err := durable.OpenLog(path, s.logOptions(), fn)
	if err != nil {
		return nil, rep, err // names the operation and the file
	}
	return &logFile{l, s.opts.Fsync}, rep, nil
}

// convertLegacy rewrites a version 1 log in the current framing
// (atomically). A damaged version 1 tail cannot be resynchronised: it is
// cut, and the original kept in quarantine.
func (s *Store) convertLegacy(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // openLog reports it
	}
	head := make([]byte, len(legacyMagic))
	_, rerr := f.ReadAt(head, 0)
	f.Close()
	if rerr != nil || !bytes.Equal(head, legacyMagic) {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("memory: read version 1 log: %w", err)
	}
	payloads, valid := legacyRecords(data[len(legacyMagic):], s.opts.MaxRecordBytes)
	if len(legacyMagic)+valid < len(data) && durable.MkdirAll(s.quarantine, 0o755) == nil {
		name := filepath.Base(path) + "." + strconv.FormatInt(s.opts.Clock.Now().UnixNano(), 10) + ".v1"
		_ = durable.WriteFile(filepath.Join(s.quarantine, name), data)
	}
	image := append([]byte(nil), logMagic...)
	for _, p := range payloads {
		image = appendRecord(image, p)
	}
	if err := durable.WriteFile(path, image); err != nil {
		return fmt.Errorf("memory: convert version 1 log: %w", err)
	}
	return nil
}

// createLog creates a new log holding the magic and the framed records in
// first, fsynced with its folder whatever the policy (unless FsyncNever):
// creation is rare and a file that vanished would lose every later record.
func (s *Store) createLog(path string, first []byte) (*logFile, error) {
	l, err := durable.CreateLog(path, s.logOptions(), first)
	if err != nil {
		return nil, err
	}
	return &logFile{l, s.opts.Fsync}, nil
}

// append writes framed records (built with appendRecord) as one write,
// fsynced when the policy is FsyncAlways. Errors come from package durable,
// which names the operation and the file.
func (l *logFile) append(framed []byte) error { return l.Append(framed, l.policy == FsyncAlways) }

// sync fsyncs the log if it was written since the last fsync.
func (l *logFile) sync() error { return l.Sync() }

// close fsyncs (unless the policy is FsyncNever) and closes the file.
func (l *logFile) close() error { return l.Close(l.policy != FsyncNever) }
