package durable

import (
	"io"
	"io/fs"
	"os"
)

// FS is the file system WriteAtomicFS and the KV archive work through, as
// small as they need, so that tests can inject faults (short writes,
// failing fsyncs, failing renames). Names are paths as the OS takes them.
type FS interface {
	// Create makes a new file for writing; it fails if the name exists.
	Create(name string) (File, error)
	// Open opens a file for reading.
	Open(name string) (File, error)
	// Rename atomically replaces newname with oldname.
	Rename(oldname, newname string) error
	// Remove deletes a file.
	Remove(name string) error
	// MkdirAll creates a directory and its parents.
	MkdirAll(name string) error
	// ReadDir lists a directory.
	ReadDir(name string) ([]fs.DirEntry, error)
	// SyncDir makes the directory's entries (creates, renames, removes)
	// durable.
	SyncDir(name string) error
}

// File is an open file of an FS.
type File interface {
	io.Reader
	io.Writer
	Sync() error
	Close() error
	Stat() (fs.FileInfo, error)
}

// OSFS is the FS of the operating system.
type OSFS struct{}

var _ FS = OSFS{}

// Create creates name exclusively, mode 0o600.
func (OSFS) Create(name string) (File, error) {
	return os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}

// Open opens name read-only.
func (OSFS) Open(name string) (File, error) { return os.Open(name) }

// Rename calls os.Rename.
func (OSFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// Remove calls os.Remove.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// MkdirAll creates name with mode 0o700.
func (OSFS) MkdirAll(name string) error { return os.MkdirAll(name, 0o700) }

// ReadDir calls os.ReadDir.
func (OSFS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(name) }

// SyncDir calls SyncDir.
func (OSFS) SyncDir(name string) error { return SyncDir(name) }
