package memory

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// logMagic starts every session log.
var logMagic = []byte("KVSMLOG1")

// logFile is one session's append-only record log. Appends are single
// write(2) calls of whole records; a failed write is rolled back by
// truncating to the previous size so later records never follow a torn one.
type logFile struct {
	path   string
	policy FsyncPolicy

	// mu protects the fields below.
	mu     sync.Mutex
	f      *os.File
	size   int64
	dirty  bool // written since the last fsync
	broken error
}

// logReplay is what openLog recovered.
type logReplay struct {
	truncated   int64  // bytes cut from the tail
	cutErr      error  // why they were cut
	quarantined string // where the cut bytes were saved, "" if nowhere
}

// openLog opens an existing log, calls fn for each valid record payload and
// truncates a torn or corrupt tail, saving the cut bytes under quarantineDir.
// It returns fs.ErrNotExist (wrapped) when the file does not exist.
func openLog(path string, policy FsyncPolicy, maxPayload int, quarantineDir string, fn func([]byte) error) (*logFile, logReplay, error) {
	var rep logReplay
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, rep, fmt.Errorf("memory: open log: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, rep, fmt.Errorf("memory: read log %s: %w", filepath.Base(path), err)
	}
	valid := 0
	if len(data) < len(logMagic) || !bytes.Equal(data[:len(logMagic)], logMagic) {
		// A file shorter than the magic is a creation torn by a crash: no
		// record was acknowledged from it. Anything else is not our file.
		if len(data) >= len(logMagic) || !bytes.HasPrefix(logMagic, data) {
			f.Close()
			return nil, rep, fmt.Errorf("memory: log %s: bad magic: %w", filepath.Base(path), ErrCorrupt)
		}
		rep.cutErr = errTorn
	} else {
		valid = len(logMagic)
		n, err := scanRecords(data[valid:], maxPayload, fn)
		valid += n
		rep.cutErr = err
	}
	if valid < len(logMagic) {
		valid = 0
	}
	if valid < len(data) {
		rep.truncated = int64(len(data) - valid)
		if quarantineDir != "" && len(data)-valid > 0 {
			name := filepath.Base(path) + "." + strconv.Itoa(valid) + ".tail"
			if err := os.MkdirAll(quarantineDir, 0o755); err == nil {
				if err := os.WriteFile(filepath.Join(quarantineDir, name), data[valid:], 0o600); err == nil {
					rep.quarantined = filepath.Join(quarantineDir, name)
				}
			}
		}
		if err := f.Truncate(int64(valid)); err != nil {
			f.Close()
			return nil, rep, fmt.Errorf("memory: truncate log %s: %w", filepath.Base(path), err)
		}
		if valid == 0 {
			if _, err := f.WriteAt(logMagic, 0); err != nil {
				f.Close()
				return nil, rep, fmt.Errorf("memory: rewrite log magic: %w", err)
			}
			valid = len(logMagic)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, rep, fmt.Errorf("memory: sync log %s: %w", filepath.Base(path), err)
		}
	}
	if _, err := f.Seek(int64(valid), io.SeekStart); err != nil {
		f.Close()
		return nil, rep, fmt.Errorf("memory: seek log: %w", err)
	}
	return &logFile{path: path, policy: policy, f: f, size: int64(valid)}, rep, nil
}

// createLog creates a new log holding the magic and first record, fsynced
// with its folder (whatever the policy: creation is rare and a file that
// vanishes would lose every later record).
func createLog(path string, policy FsyncPolicy, first []byte) (*logFile, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("memory: create log folder: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("memory: create log: %w", err)
	}
	buf := appendRecord(append([]byte(nil), logMagic...), first)
	if _, err := f.Write(buf); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("memory: write log: %w", err)
	}
	if policy != FsyncNever {
		if err := f.Sync(); err != nil {
			f.Close()
			os.Remove(path)
			return nil, fmt.Errorf("memory: sync log: %w", err)
		}
		if err := syncDir(dir); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &logFile{path: path, policy: policy, f: f, size: int64(len(buf))}, nil
}

// append writes framed records (already encoded with appendRecord) as one
// write and fsyncs according to the policy.
func (l *logFile) append(framed []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return fmt.Errorf("memory: append to closed log: %w", ErrClosed)
	}
	if l.broken != nil {
		return l.broken
	}
	if _, err := l.f.Write(framed); err != nil {
		// Roll back a partial write so a later record never follows a torn one.
		if terr := l.f.Truncate(l.size); terr != nil {
			l.broken = fmt.Errorf("memory: log %s unusable after failed write: %w", filepath.Base(l.path), errors.Join(err, terr))
			return l.broken
		}
		if _, serr := l.f.Seek(l.size, io.SeekStart); serr != nil {
			l.broken = fmt.Errorf("memory: log %s unusable: %w", filepath.Base(l.path), serr)
			return l.broken
		}
		return fmt.Errorf("memory: append log: %w", err)
	}
	l.size += int64(len(framed))
	if l.policy == FsyncAlways {
		if err := l.f.Sync(); err != nil {
			// After a failed fsync the page state is unknown; refuse more.
			l.broken = fmt.Errorf("memory: fsync log %s: %w", filepath.Base(l.path), err)
			return l.broken
		}
		return nil
	}
	l.dirty = true
	return nil
}

// sync fsyncs the log if it was written since the last fsync.
func (l *logFile) sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil || !l.dirty {
		return nil
	}
	l.dirty = false
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("memory: fsync log %s: %w", filepath.Base(l.path), err)
	}
	return nil
}

// close fsyncs (unless the policy is FsyncNever) and closes the file.
func (l *logFile) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	var err error
	if l.dirty && l.policy != FsyncNever {
		err = l.f.Sync()
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	if err != nil {
		return fmt.Errorf("memory: close log %s: %w", filepath.Base(l.path), err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("memory: open folder for fsync: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return fmt.Errorf("memory: fsync folder: %w", err)
	}
	return nil
}
