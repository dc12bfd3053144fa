package memory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestRecordRoundTripAndDamage(t *testing.T) {
	var b []byte
	payloads := [][]byte{[]byte("a"), []byte("hello"), bytes.Repeat([]byte{0xff}, 300)}
	for _, p := range payloads {
		b = appendRecord(b, p)
	}
	var got [][]byte
	valid, err := scanRecords(b, 1<<20, func(p []byte) error { got = append(got, p); return nil })
	if err != nil || valid != len(b) || len(got) != 3 || !bytes.Equal(got[2], payloads[2]) {
		t.Fatalf("round trip: valid %d/%d err %v got %d", valid, len(b), err, len(got))
	}
	first := recordHeaderSize + 1
	f := func(name string, data []byte, wantValid int, wantTorn bool) {
		t.Helper()
		valid, err := scanRecords(data, 1<<20, func([]byte) error { return nil })
		if valid != wantValid || !errors.Is(err, ErrCorrupt) || errors.Is(err, errTorn) != wantTorn {
			t.Errorf("%s: valid %d err %v, want %d torn=%v", name, valid, err, wantValid, wantTorn)
		}
	}
	f("torn header", b[:first+3], first, true)
	f("torn payload", b[:len(b)-1], len(b)-recordHeaderSize-300, true)
	flipped := bytes.Clone(b)
	flipped[first+recordHeaderSize] ^= 1
	f("bit flip", flipped, first, false)
	zeros := append(bytes.Clone(b[:first]), make([]byte, 64)...)
	f("zero fill", zeros, first, false)
	huge := appendRecord(nil, []byte("x"))
	huge[3] = 0x7f
	f("oversized length", huge, 0, false)
}

func FuzzDecodeRecords(f *testing.F) {
	f.Add(appendRecord(appendRecord(nil, []byte(`{"k":"msg"}`)), []byte("second")))
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 'x'})
	f.Add(make([]byte, 20))
	f.Fuzz(func(t *testing.T, data []byte) {
		var payloads [][]byte
		valid, err := scanRecords(data, 1<<16, func(p []byte) error {
			payloads = append(payloads, p)
			return nil
		})
		if valid < 0 || valid > len(data) {
			t.Fatalf("valid %d out of range %d", valid, len(data))
		}
		if (err == nil) != (valid == len(data)) {
			t.Fatalf("err %v with valid %d of %d", err, valid, len(data))
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error %v is not ErrCorrupt", err)
		}
		// Re-encoding the decoded payloads reproduces the valid prefix.
		var re []byte
		for _, p := range payloads {
			re = appendRecord(re, p)
		}
		if !bytes.Equal(re, data[:valid]) {
			t.Fatalf("re-encoded %x, want %x", re, data[:valid])
		}
		// Decoding the session records must not panic either.
		for _, p := range payloads {
			sess := newSession("/nonexistent", "t", "s")
			var rec record
			if json.Unmarshal(p, &rec) == nil {
				_ = sess.apply(&rec, nil, recount)
			}
		}
	})
}

func TestOpenLogTruncatesTornTailAndQuarantines(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.log")
	l, err := createLog(path, FsyncAlways, []byte("meta"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := l.append(appendRecord(nil, []byte(fmt.Sprintf("rec%d", i)))); err != nil {
			t.Fatal(err)
		}
	}
	l.close()
	good, _ := os.ReadFile(path)
	torn := appendRecord(nil, []byte("never acknowledged"))[:10]
	os.WriteFile(path, append(bytes.Clone(good), torn...), 0o600)

	var got []string
	q := filepath.Join(dir, "quarantine")
	l, rep, err := openLog(path, FsyncAlways, 1<<20, q, func(p []byte) error { got = append(got, string(p)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[meta rec0 rec1 rec2]" || rep.truncated != 10 || !errors.Is(rep.cutErr, errTorn) {
		t.Fatalf("got %q, report %+v", got, rep)
	}
	saved, err := os.ReadFile(rep.quarantined)
	if err != nil || !bytes.Equal(saved, torn) {
		t.Fatalf("quarantined %x (%v), want %x", saved, err, torn)
	}
	// Appends after the cut land right after the last good record.
	if err := l.append(appendRecord(nil, []byte("rec3"))); err != nil {
		t.Fatal(err)
	}
	l.close()
	got = nil
	l, rep, err = openLog(path, FsyncAlways, 1<<20, q, func(p []byte) error { got = append(got, string(p)); return nil })
	if err != nil || rep.truncated != 0 || fmt.Sprint(got) != "[meta rec0 rec1 rec2 rec3]" {
		t.Fatalf("after reopen got %q, report %+v, err %v", got, rep, err)
	}
	l.close()
}

func TestOpenLogRejectsForeignFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	os.WriteFile(path, []byte("not a kvsidecar log at all"), 0o600)
	if _, _, err := openLog(path, FsyncNever, 1<<20, "", func([]byte) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("err %v, want ErrCorrupt", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "not a kvsidecar log at all" {
		t.Fatalf("foreign file modified")
	}
}

func TestStoreSurvivesTornTail(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	tr := prepare(t, s, "t", "s", ModeAppend, text("user", "kept"))
	tr.Complete(text("assistant", "also kept"))
	s.Close()
	path := sessionPath(dir, "t", "s")
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.Write(appendRecord(nil, []byte(`{"k":"msg","seq":99}`))[:15])
	f.Close()

	s2 := openStore(t, dir, nil)
	v, err := s2.Session("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Messages) != 2 || v.Messages[1].Content != "also kept" {
		t.Fatalf("messages %+v", v.Messages)
	}
	if s2.Stats().Quarantined != 1 {
		t.Fatalf("quarantined %d, want 1", s2.Stats().Quarantined)
	}
	tr = prepare(t, s2, "t", "s", ModeAppend, text("user", "after repair"))
	tr.Abort()
	s2.Close()
	s3 := openStore(t, dir, nil)
	v, _ = s3.Session("t", "s")
	if len(v.Messages) != 3 || v.Messages[2].Content != "after repair" {
		t.Fatalf("after repair: %d messages", len(v.Messages))
	}
}
