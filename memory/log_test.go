package memory

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
)

// recordOffsets returns where each record of a log file starts.
func recordOffsets(t *testing.T, data []byte) []int {
	t.Helper()
	if !bytes.HasPrefix(data, journal.Magic) {
		t.Fatalf("not a log: %q", data[:min(8, len(data))])
	}
	var offs []int
	durable.ScanRecords(data[len(journal.Magic):], 1<<24, func(off int, _ []byte) { offs = append(offs, len(journal.Magic)+off) })
	return offs
}

// writeTurns writes n append-mode turns (user "u<i>", assistant "a<i>").
func writeTurns(t *testing.T, dir string, n int) string {
	t.Helper()
	s := openStore(t, dir, nil)
	for i := range n {
		tr := prepare(t, s, "t", "s", ModeAppend, text("user", fmt.Sprintf("u%d", i)))
		if err := tr.Complete(text("assistant", fmt.Sprintf("a%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	return sessionPath(dir, "t", "s")
}

func messageTexts(v SessionView) string {
	var out []string
	for _, m := range v.Messages {
		out = append(out, m.Content)
	}
	return strings.Join(out, " ")
}

func wantTurns(n int, skip string) string {
	var out []string
	for i := range n {
		for _, m := range []string{fmt.Sprintf("u%d", i), fmt.Sprintf("a%d", i)} {
			if m != skip {
				out = append(out, m)
			}
		}
	}
	return strings.Join(out, " ")
}

// TestDamagedRecordLosesOnlyItself reproduces issue 12 row 9: one flipped
// byte mid-log used to drop every valid record after it (127 of 256).
func TestDamagedRecordLosesOnlyItself(t *testing.T) {
	dir := t.TempDir()
	path := writeTurns(t, dir, 128)
	data, _ := os.ReadFile(path)
	offs := recordOffsets(t, data)
	// Record 0 is meta; records 1+2i and 2+2i are turn i's messages.
	victim := offs[1+2*64+1] // a64
	data[victim+durable.RecordHeaderSize+5] ^= 0x08
	os.WriteFile(path, data, 0o600)

	s := openStore(t, dir, nil)
	v, err := s.Session("t", "s")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := messageTexts(v), wantTurns(128, "a64"); got != want {
		t.Fatalf("kept %d messages, want 255:\n%s", len(v.Messages), got)
	}
	if st := s.Stats(); st.Quarantined != 1 || st.RecordsLost != 1 {
		t.Fatalf("stats: quarantined %d, lost %d", st.Quarantined, st.RecordsLost)
	}
	// The session goes on: new turns are appended and survive a reopen.
	prepare(t, s, "t", "s", ModeAppend, text("user", "after")).Complete(text("assistant", "repair"))
	s.Close()
	s = openStore(t, dir, nil)
	v, _ = s.Session("t", "s")
	if got, want := messageTexts(v), wantTurns(128, "a64")+" after repair"; got != want || s.Stats().Quarantined != 0 {
		t.Fatalf("after reopen (quarantined %d): %s", s.Stats().Quarantined, got)
	}
}

// TestDamagedHeaderRecreatesSession: a flipped byte in the first record
// (meta) used to delete the whole session and leave its index behind; a
// bad magic made GET and DELETE answer 500 forever. Now the other records
// are kept and the session works.
func TestDamagedHeaderRecreatesSession(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(data []byte, offs []int)
	}{
		{"meta record", func(d []byte, offs []int) { d[offs[0]+durable.RecordHeaderSize+3] ^= 0x01 }},
		{"magic", func(d []byte, _ []int) { d[0] = 'X' }},
		{"magic and meta", func(d []byte, offs []int) { clear(d[:offs[1]]) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := writeTurns(t, dir, 10)
			data, _ := os.ReadFile(path)
			tc.damage(data, recordOffsets(t, data))
			os.WriteFile(path, data, 0o600)

			s := openStore(t, dir, nil)
			v, err := s.Session("t", "s")
			if err != nil {
				t.Fatalf("GET after damage: %v", err)
			}
			if got := messageTexts(v); got != wantTurns(10, "") {
				t.Fatalf("kept %q", got)
			}
			prepare(t, s, "t", "s", ModeAppend, text("user", "more")).Abort()
			s.Close()
			s = openStore(t, dir, nil)
			if v, err := s.Session("t", "s"); err != nil || messageTexts(v) != wantTurns(10, "")+" more" || s.Stats().Quarantined != 0 {
				t.Fatalf("reopen: %v %q quarantined %d", err, messageTexts(v), s.Stats().Quarantined)
			}
			if err := s.Delete("t", "s"); err != nil {
				t.Fatalf("DELETE: %v", err)
			}
		})
	}
}

func TestForeignOrEmptyLogStartsAfresh(t *testing.T) {
	dir := t.TempDir()
	path := writeTurns(t, dir, 3)
	idx := strings.TrimSuffix(path, ".log") + ".idx"
	os.WriteFile(idx, []byte("stale index"), 0o600)

	// Another session's log at this path: quarantined, never served.
	other := writeTurns(t, t.TempDir(), 1)
	data, _ := os.ReadFile(other)
	// Re-framed so the checksums hold: a well-formed log of another session.
	img := append([]byte(nil), journal.Magic...)
	durable.ScanRecords(data[len(journal.Magic):], 1<<20, func(_ int, p []byte) {
		p = bytes.Replace(p, []byte(`"session":"s"`), []byte(`"session":"x"`), 1)
		img = durable.AppendRecord(img, p)
	})
	os.WriteFile(path, img, 0o600)

	s := openStore(t, dir, nil)
	if _, err := s.Session("t", "s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("foreign log served: %v", err)
	}
	if _, err := os.Stat(idx); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("index left behind: %v", err)
	}
	q, _ := os.ReadDir(filepath.Join(dir, "quarantine"))
	if len(q) != 1 {
		t.Fatalf("quarantine holds %d files", len(q))
	}
	tr := prepare(t, s, "t", "s", ModeAppend, text("user", "fresh"))
	tr.Abort()
	if v, err := s.Session("t", "s"); err != nil || messageTexts(v) != "fresh" {
		t.Fatalf("recreated: %v %q", err, messageTexts(v))
	}

	// Only the magic (a creation torn by a crash): removed with its index.
	s.Close()
	os.WriteFile(path, journal.Magic, 0o600)
	os.WriteFile(idx, []byte("stale index"), 0o600)
	s = openStore(t, dir, nil)
	if _, err := s.Session("t", "s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("empty log: %v", err)
	}
	for _, f := range []string{path, idx} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left behind: %v", filepath.Base(f), err)
		}
	}
}

func TestVersion1LogIsConverted(t *testing.T) {
	dir := t.TempDir()
	path := sessionPath(dir, "t", "s")
	os.MkdirAll(filepath.Dir(path), 0o755)
	v1 := func(dst, p []byte) []byte {
		h := make([]byte, 8)
		h[0], h[1], h[2], h[3] = byte(len(p)), byte(len(p)>>8), byte(len(p)>>16), byte(len(p)>>24)
		c := crc32.Checksum(p, crc32.MakeTable(crc32.Castagnoli))
		h[4], h[5], h[6], h[7] = byte(c), byte(c>>8), byte(c>>16), byte(c>>24)
		return append(append(dst, h...), p...)
	}
	img := append([]byte(nil), journal.LegacyMagic...)
	img = v1(img, []byte(`{"k":"meta","v":1,"tenant":"t","session":"s","t":1}`))
	img = v1(img, []byte(`{"k":"msg","t":2,"seq":1,"msg":{"role":"user","content":"old"}}`))
	img = append(img, 1, 2, 3) // torn tail
	os.WriteFile(path, img, 0o600)
	s := openStore(t, dir, nil)
	prepare(t, s, "t", "s", ModeAppend, text("user", "new")).Abort()
	s.Close()
	data, _ := os.ReadFile(path)
	if !bytes.HasPrefix(data, journal.Magic) {
		t.Fatal("not converted")
	}
	s = openStore(t, dir, nil)
	if v, err := s.Session("t", "s"); err != nil || messageTexts(v) != "old new" {
		t.Fatalf("after conversion: %v %q", err, messageTexts(v))
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
	f.Write(durable.AppendRecord(nil, []byte(`{"k":"msg","seq":99}`))[:15])
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

// FuzzSessionLog: any bytes after the magic load as a session without an
// error or a panic, and the session accepts a new turn.
func FuzzSessionLog(f *testing.F) {
	meta := durable.AppendRecord(nil, []byte(`{"k":"meta","v":1,"tenant":"t","session":"s","t":1}`))
	f.Add(append(bytes.Clone(meta), durable.AppendRecord(nil, []byte(`{"k":"msg","seq":1,"msg":{"role":"user","content":"x"}}`))...))
	f.Add(append(bytes.Clone(meta), durable.AppendRecord(nil, []byte(`{"k":"trunc","keep":5}`))...))
	f.Add(append(bytes.Clone(meta), durable.AppendRecord(nil, []byte(`{"k":"unit","unit":{"id":"msg-000000000001","content":"c"}}`))...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := sessionPath(dir, "t", "s")
		os.MkdirAll(filepath.Dir(path), 0o755)
		os.WriteFile(path, append(bytes.Clone(journal.Magic), data...), 0o600)
		s := openStore(t, dir, nil)
		if _, err := s.Session("t", "s"); err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatalf("load: %v", err)
		}
		if _, err := s.Prepare(t.Context(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "m", Messages: []Message{text("user", "q")}}); err != nil && !errors.Is(err, ErrContextTooLarge) {
			t.Fatalf("prepare after load: %v", err)
		}
		s.Close()
	})
}
