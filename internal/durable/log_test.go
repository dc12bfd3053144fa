package durable

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

var testMagic = []byte("TESTLOG2")

func openT(t *testing.T, path string, o LogOptions) (*Log, Recovery, []string) {
	t.Helper()
	o.Magic = testMagic
	var got []string
	l, rep, err := OpenLog(path, o, func(p []byte) { got = append(got, string(p)) })
	if err != nil {
		t.Fatalf("OpenLog: %v", err)
	}
	return l, rep, got
}

func writeLog(t *testing.T, path string, n int) {
	t.Helper()
	l, err := CreateLog(path, LogOptions{Magic: testMagic}, AppendRecord(nil, []byte("rec0")))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		if err := l.Append(AppendRecord(nil, []byte(fmt.Sprintf("rec%d", i))), i%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(true); err != nil {
		t.Fatal(err)
	}
}

func recs(from, to int, skip ...int) string {
	var out []string
	for i := from; i < to; i++ {
		ok := true
		for _, s := range skip {
			ok = ok && s != i
		}
		if ok {
			out = append(out, fmt.Sprintf("rec%d", i))
		}
	}
	return fmt.Sprint(out)
}

func TestOpenLogRepairsDamageAndKeepsTheRest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a", "b", "x.log")
	q := filepath.Join(dir, "quarantine")
	writeLog(t, path, 256)
	data, _ := os.ReadFile(path)
	// Flip a byte in record 100's payload.
	off := len(testMagic)
	for i := 0; i < 100; i++ {
		off += RecordHeaderSize + len(fmt.Sprintf("rec%d", i))
	}
	data[off+RecordHeaderSize+1] ^= 0x40
	os.WriteFile(path, data, 0o600)

	l, rep, got := openT(t, path, LogOptions{Quarantine: q})
	if fmt.Sprint(got) != recs(0, 256, 100) {
		t.Fatalf("replayed %d records: %v", len(got), got)
	}
	if rep.Damaged != 1 || !rep.Rewritten || rep.Quarantined == "" || rep.Records != 255 {
		t.Fatalf("recovery %+v", rep)
	}
	if orig, err := os.ReadFile(rep.Quarantined); err != nil || !bytes.Equal(orig, data) {
		t.Fatalf("quarantined original: %v", err)
	}
	// Appends land after the intact records; the next open is clean.
	if err := l.Append(AppendRecord(nil, []byte("rec256")), true); err != nil {
		t.Fatal(err)
	}
	l.Close(true)
	l, rep, got = openT(t, path, LogOptions{Quarantine: q})
	defer l.Close(false)
	if fmt.Sprint(got) != recs(0, 257, 100) || rep.Repaired() {
		t.Fatalf("after repair: %d records, %+v", len(got), rep)
	}
}

func TestOpenLogBadMagicSalvages(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.log")
	writeLog(t, path, 10)
	data, _ := os.ReadFile(path)
	data[2] ^= 0xff
	os.WriteFile(path, data, 0o600)
	l, rep, got := openT(t, path, LogOptions{Quarantine: filepath.Join(dir, "q")})
	if !rep.BadMagic || !rep.Rewritten || fmt.Sprint(got) != recs(0, 10) {
		t.Fatalf("bad magic: %+v, %v", rep, got)
	}
	l.Close(false)
	if data, _ := os.ReadFile(path); !bytes.HasPrefix(data, testMagic) {
		t.Fatal("magic not restored")
	}

	// A foreign file yields nothing and becomes an empty log; the original
	// is kept in quarantine.
	os.WriteFile(path, []byte("not a log at all, just some text"), 0o600)
	l, rep, got = openT(t, path, LogOptions{Quarantine: filepath.Join(dir, "q")})
	defer l.Close(false)
	if len(got) != 0 || !rep.BadMagic || rep.Quarantined == "" {
		t.Fatalf("foreign: %+v %v", rep, got)
	}
}

func TestOpenLogCutsTornTail(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.log")
	writeLog(t, path, 3)
	good, _ := os.ReadFile(path)
	torn := AppendRecord(nil, []byte("never acknowledged"))[:15]
	os.WriteFile(path, append(bytes.Clone(good), torn...), 0o600)
	l, rep, got := openT(t, path, LogOptions{Quarantine: filepath.Join(dir, "q")})
	if fmt.Sprint(got) != recs(0, 3) || rep.TailBytes != 15 || rep.Rewritten || rep.Damaged != 0 {
		t.Fatalf("torn: %+v %v", rep, got)
	}
	if saved, _ := os.ReadFile(rep.Quarantined); !bytes.Equal(saved, torn) {
		t.Fatalf("tail saved as %q", saved)
	}
	l.Close(false)
	if after, _ := os.ReadFile(path); !bytes.Equal(after, good) {
		t.Fatal("file not cut back to its intact records")
	}

	// A creation torn inside the magic opens as an empty log.
	os.WriteFile(path, testMagic[:3], 0o600)
	l, rep, got = openT(t, path, LogOptions{})
	defer l.Close(false)
	if len(got) != 0 || rep.TailBytes != 3 || l.Size() != int64(len(testMagic)) {
		t.Fatalf("torn creation: %+v size %d", rep, l.Size())
	}
}

func TestOpenLogMissing(t *testing.T) {
	_, _, err := OpenLog(filepath.Join(t.TempDir(), "none"), LogOptions{Magic: testMagic}, func([]byte) {})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err %v", err)
	}
}

func TestFilesBoundsOpenLogs(t *testing.T) {
	dir := t.TempDir()
	files := NewFiles(4)
	var logs []*Log
	for i := range 20 {
		l, err := CreateLog(filepath.Join(dir, fmt.Sprintf("%02d.log", i)), LogOptions{Magic: testMagic, Files: files, NoSync: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, l)
		if st := files.Stats(); st.Open > 4 {
			t.Fatalf("%d logs open, bound 4", st.Open)
		}
	}
	// Every log still appends (idle ones reopen) and keeps its records in order.
	for round := range 3 {
		for i, l := range logs {
			if err := l.Append(AppendRecord(nil, []byte(fmt.Sprintf("%d-%d", i, round))), false); err != nil {
				t.Fatal(err)
			}
			if st := files.Stats(); st.Open > 4 {
				t.Fatalf("%d logs open, bound 4", st.Open)
			}
		}
	}
	if st := files.Stats(); st.Reopens == 0 || st.Idled == 0 {
		t.Fatalf("stats %+v: the bound never acted", st)
	}
	for i, l := range logs {
		l.Close(true)
		var got []string
		l2, _, err := OpenLog(l.Path(), LogOptions{Magic: testMagic}, func(p []byte) { got = append(got, string(p)) })
		if err != nil {
			t.Fatal(err)
		}
		l2.Close(false)
		if want := fmt.Sprintf("[%d-0 %d-1 %d-2]", i, i, i); fmt.Sprint(got) != want {
			t.Fatalf("log %d: %v, want %s", i, got, want)
		}
	}
	if st := files.Stats(); st.Open != 0 {
		t.Fatalf("%d still open after Close", st.Open)
	}
}
