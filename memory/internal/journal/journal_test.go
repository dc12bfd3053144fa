package journal

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

func newJournal(t *testing.T) (*Journal, string) {
	dir := t.TempDir()
	return New(Options{Quarantine: filepath.Join(dir, "quarantine"), SyncAppends: true}), dir
}

// TestCreateAppendRecords: what Create and Append write, Records and
// ReadFirst read back, in order.
func TestCreateAppendRecords(t *testing.T) {
	j, dir := newJournal(t)
	path := filepath.Join(dir, "a", "x.log")
	l, err := j.Create(path, durable.AppendRecord(nil, []byte("meta")))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append(durable.AppendRecord(durable.AppendRecord(nil, []byte("one")), []byte("two"))); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := j.Records(path)
	if err != nil || !slices.EqualFunc(got, [][]byte{[]byte("meta"), []byte("one"), []byte("two")}, func(a, b []byte) bool { return string(a) == string(b) }) {
		t.Fatalf("Records = %q, %v", got, err)
	}
	if first, err := j.ReadFirst(path); err != nil || string(first) != "meta" {
		t.Fatalf("ReadFirst = %q, %v", first, err)
	}
	if _, _, err := j.Open(filepath.Join(dir, "missing.log"), func([]byte) {}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open of a missing log: %v", err)
	}
}

// TestLegacyConverted: a version 1 log is converted on open; its damaged
// tail is cut and the original kept in quarantine.
func TestLegacyConverted(t *testing.T) {
	j, dir := newJournal(t)
	path := filepath.Join(dir, "v1.log")
	img := slices.Clone(LegacyMagic)
	for _, p := range []string{"meta", "rec"} {
		var h [legacyHeaderSize]byte
		binary.LittleEndian.PutUint32(h[0:4], uint32(len(p)))
		binary.LittleEndian.PutUint32(h[4:8], crc32.Checksum([]byte(p), castagnoli))
		img = append(append(img, h[:]...), p...)
	}
	img = append(img, 9, 0, 0, 0) // torn
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	if first, err := j.ReadFirst(path); err != nil || string(first) != "meta" {
		t.Fatalf("ReadFirst of a version 1 log = %q, %v", first, err)
	}
	got, err := j.Records(path)
	if err != nil || len(got) != 2 || string(got[1]) != "rec" {
		t.Fatalf("Records = %q, %v", got, err)
	}
	data, _ := os.ReadFile(path)
	if string(data[:len(Magic)]) != string(Magic) {
		t.Fatalf("not converted: %q", data[:len(Magic)])
	}
	if q, _ := os.ReadDir(filepath.Join(dir, "quarantine")); len(q) != 1 {
		t.Fatalf("quarantine holds %d files, want the original", len(q))
	}
}

// TestSettle: a foreign log is quarantined, an empty one removed, a
// repaired one counted.
func TestSettle(t *testing.T) {
	j, dir := newJournal(t)
	write := func(name string, image []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, image, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreign := write("foreign.log", Image([]byte("meta")))
	l, rep, err := j.Open(foreign, func([]byte) {})
	if err != nil {
		t.Fatal(err)
	}
	if use, err := j.Settle(l, rep, 1, true, foreign, "pool"); use || err != nil {
		t.Fatalf("Settle(foreign) = %v, %v", use, err)
	}
	if _, err := os.Stat(foreign); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("foreign log left in place: %v", err)
	}
	empty := write("empty.log", Image())
	l, rep, err = j.Open(empty, func([]byte) {})
	if err != nil {
		t.Fatal(err)
	}
	if use, err := j.Settle(l, rep, 0, false, empty, "pool"); use || err != nil {
		t.Fatalf("Settle(empty) = %v, %v", use, err)
	}
	torn := write("torn.log", append(Image([]byte("meta")), 1, 2, 3))
	l, rep, err = j.Open(torn, func([]byte) {})
	if err != nil {
		t.Fatal(err)
	}
	if use, err := j.Settle(l, rep, 0, false, torn, "pool"); !use || err != nil {
		t.Fatalf("Settle(torn) = %v, %v", use, err)
	}
	l.Close()
	if st := j.Stats(); st.Quarantined != 2 || st.RecordsLost != 1 {
		t.Fatalf("Stats = %+v, want 2 logs repaired (foreign, torn), 1 record lost", st)
	}
}
