package durable

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// tempSeq makes temporary names unique within the process; Create's
// O_EXCL catches the rest.
var tempSeq atomic.Uint64

// TempName is the temporary file WriteAtomic writes before renaming it
// over path: ".<base>.<n>.tmp" in path's folder.
func TempName(path string) string {
	dir, base := filepath.Split(path)
	return filepath.Join(dir, "."+base+"."+strconv.FormatUint(tempSeq.Add(1), 10)+".tmp")
}

// IsTemp reports whether a file name (base name or path) is one of
// TempName's: a write that never reached its rename, never acknowledged,
// safe to delete when its owner starts.
func IsTemp(name string) bool {
	base := filepath.Base(name)
	return strings.HasPrefix(base, ".") && strings.HasSuffix(base, ".tmp")
}

// WriteAtomic replaces path with the bytes write produces, atomically and
// durably, through the operating system's file system. See WriteAtomicFS.
func WriteAtomic(path string, write func(w io.Writer) error) error {
	return WriteAtomicFS(OSFS{}, path, write)
}

// WriteFile replaces path with data, atomically and durably.
func WriteFile(path string, data []byte) error {
	return WriteAtomic(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteAtomicFS replaces path with the bytes write produces (buffered):
// they go to TempName(path), which is fsynced, closed, renamed over path,
// and then path's folder is fsynced.
//
// When it returns nil, path holds exactly the new bytes and keeps them
// across kill -9 and power loss. When it returns an error, path holds its
// old bytes or the new ones, never a mix: the new ones are in place only
// when the error comes from the final folder fsync (the error says so and
// matches ErrUnsyncedRename), in which case a crash may still bring the old
// file back. A temporary file may be left behind if removing it failed too;
// its owner deletes such files (IsTemp) when it starts, as the archive's
// scan and memory's retention sweep do.
//
// The folder must exist; a folder created just before needs its own entry
// made durable (MkdirAll does that).
func WriteAtomicFS(fsys FS, path string, write func(w io.Writer) error) (err error) {
	return writeAtomic(fsys, path, write, true)
}

// WriteAtomicFSNoSync is WriteAtomicFS without its two fsyncs: when it
// returns nil, path holds exactly the new bytes for every reader and keeps
// them across kill -9 of the process (they are the kernel's), but a power
// loss or a kernel crash before the file and its folder are fsynced (File
// Sync and SyncDir, or the kernel's own writeback) may bring the old file
// back, or leave the new one with a hole its owner's checksum must catch.
// The write costs a copy into the page cache instead of two disk flushes.
func WriteAtomicFSNoSync(fsys FS, path string, write func(w io.Writer) error) error {
	return writeAtomic(fsys, path, write, false)
}

func writeAtomic(fsys FS, path string, write func(w io.Writer) error, sync bool) (err error) {
	var f File
	var tmp string
	for range 8 {
		tmp = TempName(path)
		if f, err = fsys.Create(tmp); !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	defer func() {
		if err != nil && f != nil {
			f.Close()
			fsys.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 64<<10)
	if err = write(bw); err != nil {
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("durable: write %s: %w", path, err)
	}
	if sync {
		if err = f.Sync(); err != nil {
			return fmt.Errorf("durable: write %s: fsync: %w", path, err)
		}
	}
	cerr := f.Close()
	f = nil
	if cerr != nil {
		fsys.Remove(tmp)
		return fmt.Errorf("durable: write %s: close: %w", path, cerr)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		fsys.Remove(tmp)
		return fmt.Errorf("durable: write %s: rename: %w", path, err)
	}
	if !sync {
		return nil
	}
	if err := fsys.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("durable: write %s: %w: %w", path, ErrUnsyncedRename, err)
	}
	return nil
}

// ErrUnsyncedRename: WriteAtomicFS put the new file in place but could not
// fsync its folder, so a crash may bring the old file back.
var ErrUnsyncedRename = errors.New("durable: rename done but folder fsync failed")

// SyncDir fsyncs a folder so that the creates, renames and removes in it
// survive a crash. File systems that cannot fsync folders (EINVAL) are
// taken as having nothing to do.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("durable: sync folder: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil && !errors.Is(err, fs.ErrInvalid) {
		return fmt.Errorf("durable: sync folder %s: %w", dir, err)
	}
	return nil
}

// MkdirAll creates dir and any missing parents with mode perm, fsyncing the
// parent of each folder it creates, so the folder survives a crash. An
// existing folder costs one stat.
func MkdirAll(dir string, perm fs.FileMode) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("durable: mkdir %s: not a folder", dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("durable: mkdir: %w", err)
	}
	return SyncDir(parent)
}

// Quarantine moves the file at path into folder qdir (created if needed)
// under its base name plus a time stamp, fsyncing both folders, and returns
// its new path. Used for files that failed their checks: kept for
// inspection, never read again.
func Quarantine(path, qdir string, now time.Time) (string, error) {
	if err := MkdirAll(qdir, 0o755); err != nil {
		return "", err
	}
	dst := filepath.Join(qdir, filepath.Base(path)+"."+strconv.FormatInt(now.UnixNano(), 10))
	if err := os.Rename(path, dst); err != nil {
		return "", fmt.Errorf("durable: quarantine %s: %w", filepath.Base(path), err)
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return dst, err
	}
	return dst, SyncDir(qdir)
}
