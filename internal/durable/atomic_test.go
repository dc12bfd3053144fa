package durable

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// failFS fails the chosen step of an atomic write.
type failFS struct {
	OSFS
	failWrite, failSync, failRename, failSyncDir bool
}

type failFile struct {
	File
	fs *failFS
}

var errInjected = errors.New("injected")

func (f *failFS) Create(name string) (File, error) {
	file, err := f.OSFS.Create(name)
	if err != nil {
		return nil, err
	}
	return &failFile{file, f}, nil
}

func (f *failFile) Write(p []byte) (int, error) {
	if f.fs.failWrite {
		return len(p) / 2, errInjected
	}
	return f.File.Write(p)
}

func (f *failFile) Sync() error {
	if f.fs.failSync {
		return errInjected
	}
	return f.File.Sync()
}

func (f *failFS) Rename(o, n string) error {
	if f.failRename {
		return errInjected
	}
	return f.OSFS.Rename(o, n)
}

func (f *failFS) SyncDir(name string) error {
	if f.failSyncDir {
		return errInjected
	}
	return f.OSFS.SyncDir(name)
}

func TestWriteAtomicFailuresKeepOldOrNew(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("old")); err != nil {
		t.Fatal(err)
	}
	write := func(w io.Writer) error { _, err := w.Write([]byte("new contents")); return err }
	f := func(name string, fsys *failFS, want string, unsynced bool) {
		t.Helper()
		err := WriteAtomicFS(fsys, path, write)
		if !errors.Is(err, errInjected) || errors.Is(err, ErrUnsyncedRename) != unsynced {
			t.Errorf("%s: err %v", name, err)
		}
		if got, _ := os.ReadFile(path); string(got) != want {
			t.Errorf("%s: file holds %q, want %q", name, got, want)
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if IsTemp(e.Name()) {
				t.Errorf("%s: temporary %s left behind", name, e.Name())
			}
		}
	}
	f("write", &failFS{failWrite: true}, "old", false)
	f("fsync", &failFS{failSync: true}, "old", false)
	f("rename", &failFS{failRename: true}, "old", false)
	f("folder fsync", &failFS{failSyncDir: true}, "new contents", true)

	if err := WriteFile(path, []byte("final")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "final" {
		t.Fatalf("got %q", got)
	}
	// A writer error leaves the old file and no temporary.
	err := WriteAtomic(path, func(io.Writer) error { return errInjected })
	if got, _ := os.ReadFile(path); !errors.Is(err, errInjected) || string(got) != "final" {
		t.Fatalf("writer error: %v, %q", err, got)
	}
}

func TestIsTempAndMkdirAll(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "x", "y")
	if err := MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	if !IsTemp(filepath.Base(TempName(filepath.Join(dir, "a")))) || IsTemp("keep.tmp") { // not ours: no leading dot
		t.Fatal("IsTemp does not tell our temporary files")
	}
}

func TestNewCorruptMatchesErrCorrupt(t *testing.T) {
	a, b := NewCorrupt("a: corrupt"), NewCorrupt("b: corrupt")
	wrapped := errors.Join(errors.New("ctx"), a)
	if !errors.Is(wrapped, ErrCorrupt) || !errors.Is(wrapped, a) || errors.Is(wrapped, b) || a.Error() != "a: corrupt" {
		t.Fatal("sentinels do not classify")
	}
}

// WriteAtomicFSNoSync puts the new bytes in place without an fsync of the
// file or of its folder (both would fail here); a failed rename still
// keeps the old bytes.
func TestWriteAtomicNoSync(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("old")); err != nil {
		t.Fatal(err)
	}
	write := func(w io.Writer) error { _, err := w.Write([]byte("staged")); return err }
	if err := WriteAtomicFSNoSync(&failFS{failSync: true, failSyncDir: true}, path, write); err != nil {
		t.Fatalf("no-sync write called fsync: %v", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "staged" {
		t.Fatalf("file holds %q", got)
	}
	if err := WriteAtomicFSNoSync(&failFS{failRename: true}, path, func(w io.Writer) error { _, err := w.Write([]byte("x")); return err }); !errors.Is(err, errInjected) {
		t.Fatalf("rename failure: %v", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "staged" {
		t.Fatalf("after a failed rename the file holds %q", got)
	}
}
