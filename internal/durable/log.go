package durable

import (
	"bytes"
	"container/list"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// LogOptions configure OpenLog and CreateLog. Magic is required; every
// other zero value is a documented default (they apply EnsureDefaults and
// Validate).
type LogOptions struct {
	// Magic starts the file. Required (at least 4 bytes).
	Magic []byte
	// MaxRecord bounds one payload. Zero or negative: DefaultMaxRecord.
	MaxRecord int
	// Quarantine is the folder where OpenLog keeps damaged originals and cut
	// tails. Empty: they are dropped.
	Quarantine string
	// Files bounds the descriptors open logs hold; an idle log's file is
	// closed and reopened by its next append. Nil: the log keeps its file
	// open until Close.
	Files *Files
	// NoSync skips the fsyncs of creation and repair (and of closing an
	// idle file): for data the caller accepts to lose on power loss.
	NoSync bool
	// Now stamps quarantined files. Nil: time.Now.
	Now func() time.Time
}

// EnsureDefaults fills every zero field with its documented default and
// returns o. OpenLog and CreateLog call it; calling it twice changes
// nothing.
func (o *LogOptions) EnsureDefaults() *LogOptions {
	if o.MaxRecord <= 0 {
		o.MaxRecord = DefaultMaxRecord
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Validate checks options after EnsureDefaults.
func (o *LogOptions) Validate() error {
	if len(o.Magic) < 4 {
		return errors.New("durable: log magic must be at least 4 bytes")
	}
	return nil
}

// Recovery is what OpenLog found and repaired.
type Recovery struct {
	// Records is the number of intact records replayed.
	Records int
	// BadMagic: the file did not start with the magic. Its records were
	// salvaged (resynchronising from the start) and the file rewritten.
	BadMagic bool
	// Damaged is the number of damaged regions skipped between intact
	// records; DamagedBytes their total size.
	Damaged      int
	DamagedBytes int64
	// TailBytes were cut from the end: a torn append, or damage that no
	// intact record follows.
	TailBytes int64
	// Rewritten: the file was rewritten without its damaged bytes (BadMagic
	// or Damaged > 0); the original is in Quarantined.
	Rewritten bool
	// Quarantined is where the damaged original or the cut tail was saved,
	// "" if nowhere.
	Quarantined string
}

// Repaired reports whether anything was skipped or cut.
func (r Recovery) Repaired() bool { return r.BadMagic || r.Damaged > 0 || r.TailBytes > 0 }

// Log is an append-only file of framed records (see AppendRecord) after a
// magic. Appends are single writes of whole records at the end; a failed
// write is rolled back by truncating, so a record never follows a torn one.
// Safe for concurrent use.
type Log struct {
	path   string
	files  *Files
	noSync bool

	// mu protects the fields below; elem is protected by files.mu.
	mu     sync.Mutex
	f      *os.File // nil while idle (closed by Files) or after Close
	size   int64
	dirty  bool // appended since the last fsync
	closed bool
	broken error
	elem   *list.Element
}

// OpenLog opens the log at path, calls fn with the payload (aliasing a
// buffer valid during the call) of every intact record in order, and
// repairs the file: a torn or damaged tail is cut (saved under
// o.Quarantine); damaged records between intact ones, or a damaged magic,
// make it rewrite the file with the intact records only (atomically, the
// original saved under o.Quarantine). A file shorter than the magic whose
// bytes start it is a creation torn by a crash and opens empty. A missing
// file is an error matching fs.ErrNotExist. It reads the whole file: its
// cost is linear in the file's size.
func OpenLog(path string, o LogOptions, fn func(payload []byte)) (*Log, Recovery, error) {
	var rep Recovery
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, rep, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, rep, fmt.Errorf("durable: open log: %w", err)
	}
	magic := o.Magic
	body := 0
	switch {
	case bytes.HasPrefix(data, magic):
		body = len(magic)
	case len(data) < len(magic) && bytes.HasPrefix(magic, data):
		// Torn creation: never acknowledged.
		rep.TailBytes = int64(len(data))
		data = nil
	default:
		rep.BadMagic = true
		body = min(len(magic), len(data))
	}
	var intact [][]byte // framed records, when rewriting
	rewrite := rep.BadMagic
	sc := ScanRecords(data[body:], o.MaxRecord, func(off int, p []byte) {
		fn(p)
		intact = append(intact, data[body+off:body+off+RecordHeaderSize+len(p)])
	})
	rep.Records = sc.Records
	rep.Damaged, rep.DamagedBytes = len(sc.Damaged), int64(sc.DamagedBytes())
	rewrite = rewrite || rep.Damaged > 0
	end := body + sc.End
	if len(data) > end {
		rep.TailBytes = int64(len(data) - end)
	}
	qname := func(what string) string {
		return filepath.Join(o.Quarantine, filepath.Base(path)+"."+strconv.FormatInt(o.Now().UnixNano(), 10)+what)
	}
	switch {
	case rewrite:
		rep.Rewritten = true
		if o.Quarantine != "" && len(data) > 0 {
			if err := MkdirAll(o.Quarantine, 0o755); err == nil {
				q := qname(".damaged")
				if err := WriteFile(q, data); err == nil {
					rep.Quarantined = q
				}
			}
		}
		image := append([]byte(nil), magic...)
		for _, r := range intact {
			image = append(image, r...)
		}
		if err := WriteFile(path, image); err != nil {
			return nil, rep, fmt.Errorf("durable: repair log %s: %w", filepath.Base(path), err)
		}
		end = len(image)
	case rep.TailBytes > 0:
		if o.Quarantine != "" && len(data) > end {
			if err := MkdirAll(o.Quarantine, 0o755); err == nil {
				q := qname(".tail")
				if err := os.WriteFile(q, data[end:], 0o600); err == nil {
					rep.Quarantined = q
				}
			}
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, rep, fmt.Errorf("durable: open log: %w", err)
	}
	if end < len(magic) {
		// Torn creation: start again from the magic.
		if _, err := f.WriteAt(magic, 0); err != nil {
			f.Close()
			return nil, rep, fmt.Errorf("durable: rewrite log magic: %w", err)
		}
		end = len(magic)
	}
	if !rewrite && rep.TailBytes > 0 || end > len(data) {
		if err := f.Truncate(int64(end)); err != nil {
			f.Close()
			return nil, rep, fmt.Errorf("durable: truncate log %s: %w", filepath.Base(path), err)
		}
		if !o.NoSync {
			if err := f.Sync(); err != nil {
				f.Close()
				return nil, rep, fmt.Errorf("durable: fsync log %s: %w", filepath.Base(path), err)
			}
		}
	}
	l := &Log{path: path, files: o.Files, noSync: o.NoSync, f: f, size: int64(end)}
	if l.files != nil {
		l.files.touch(l)
	}
	return l, rep, nil
}

// CreateLog creates a new log at path holding the magic and the framed
// records in first (may be empty), and fsyncs it and its folder (creating
// the folder durably if needed) unless o.NoSync. It fails if path exists.
func CreateLog(path string, o LogOptions, first []byte) (*Log, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if o.NoSync {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("durable: create log folder: %w", err)
		}
	} else if err := MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var f *os.File
	var err error
	for attempt := 0; ; attempt++ {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil || attempt > 0 || !isFDLimit(err) || o.Files == nil {
			break
		}
		o.Files.shed(nil)
	}
	if err != nil {
		return nil, fmt.Errorf("durable: create log: %w", err)
	}
	buf := append(append([]byte(nil), o.Magic...), first...)
	fail := func(err error) (*Log, error) {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	if _, err := f.Write(buf); err != nil {
		return fail(fmt.Errorf("durable: write log: %w", err))
	}
	if !o.NoSync {
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("durable: fsync log: %w", err))
		}
		if err := SyncDir(dir); err != nil {
			return fail(err)
		}
	}
	l := &Log{path: path, files: o.Files, noSync: o.NoSync, f: f, size: int64(len(buf))}
	if l.files != nil {
		l.files.touch(l)
	}
	return l, nil
}

// ErrClosed: the log was closed.
var ErrClosed = errors.New("durable: log closed")

// Path returns the log's file path.
func (l *Log) Path() string { return l.path }

// Size returns the log's size in bytes (magic included).
func (l *Log) Size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size
}

// Append writes framed records (built with AppendRecord) at the end as one
// write, then fsyncs when sync is true. When it returns nil the records
// survive kill -9, and with sync power loss too. A failed write is rolled
// back; a failed fsync makes the log refuse further appends (the state of
// the pages is unknown).
func (l *Log) Append(framed []byte, sync bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.openLocked(); err != nil {
		return err
	}
	if _, err := l.f.WriteAt(framed, l.size); err != nil {
		// Roll back a partial write so a later record never follows a torn one.
		if terr := l.f.Truncate(l.size); terr != nil {
			l.broken = fmt.Errorf("durable: log %s unusable after a failed write: %w", filepath.Base(l.path), errors.Join(err, terr))
			return l.broken
		}
		return fmt.Errorf("durable: append to log %s: %w", filepath.Base(l.path), err)
	}
	l.size += int64(len(framed))
	if sync {
		if err := l.f.Sync(); err != nil {
			l.broken = fmt.Errorf("durable: fsync log %s: %w", filepath.Base(l.path), err)
			return l.broken
		}
		l.dirty = false
		return nil
	}
	l.dirty = true
	return nil
}

// openLocked makes l.f usable, reopening an idle log. Called with l.mu held.
func (l *Log) openLocked() error {
	if l.closed {
		return fmt.Errorf("durable: log %s: %w", filepath.Base(l.path), ErrClosed)
	}
	if l.broken != nil {
		return l.broken
	}
	if l.f == nil {
		var f *os.File
		var err error
		for attempt := 0; ; attempt++ {
			f, err = os.OpenFile(l.path, os.O_WRONLY, 0)
			if err == nil || attempt > 0 || !isFDLimit(err) || l.files == nil {
				break
			}
			l.files.shed(l)
		}
		if err != nil {
			return fmt.Errorf("durable: reopen log %s: %w", filepath.Base(l.path), err)
		}
		l.f = f
		if l.files != nil {
			l.files.reopens.Add(1)
		}
	}
	if l.files != nil {
		l.files.touch(l)
	}
	return nil
}

// Sync fsyncs the log if it was appended to without sync since the last
// fsync.
func (l *Log) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.dirty || l.closed {
		return nil
	}
	if err := l.openLocked(); err != nil {
		return err
	}
	if err := l.f.Sync(); err != nil {
		l.broken = fmt.Errorf("durable: fsync log %s: %w", filepath.Base(l.path), err)
		return l.broken
	}
	l.dirty = false
	return nil
}

// Close closes the file, fsyncing it first when sync is true and appends
// are not yet synced. Later appends fail with ErrClosed; Close again is a
// no-op.
func (l *Log) Close(sync bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.files != nil {
		l.files.forget(l)
	}
	if l.f == nil {
		if sync && l.dirty {
			// Idle with unsynced appends (NoSync logs only): fsync through
			// a fresh descriptor.
			if f, err := os.OpenFile(l.path, os.O_WRONLY, 0); err == nil {
				err = f.Sync()
				f.Close()
				if err != nil {
					return fmt.Errorf("durable: close log %s: %w", filepath.Base(l.path), err)
				}
			}
		}
		return nil
	}
	var err error
	if sync && l.dirty {
		err = l.f.Sync()
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	if err != nil {
		return fmt.Errorf("durable: close log %s: %w", filepath.Base(l.path), err)
	}
	return nil
}

// idle closes the file of a log that Files chose; the next append reopens
// it. Called with l.mu held.
func (l *Log) idle() {
	if l.f == nil {
		return
	}
	if l.dirty && !l.noSync {
		if err := l.f.Sync(); err != nil {
			l.broken = fmt.Errorf("durable: fsync log %s: %w", filepath.Base(l.path), err)
		} else {
			l.dirty = false
		}
	}
	l.f.Close()
	l.f = nil
}
