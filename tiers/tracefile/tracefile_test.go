package tracefile_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/tiers"
	"github.com/kvsidecar/kvsidecar/tiers/tracefile"
)

// What a Writer records parses back line by line, with hashed keys, and a
// second Writer on the same file appends.
func TestRecordThenParse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.trace")
	evs := []tiers.TraceEvent{
		{Op: tiers.TraceGet, Key: "secret-session"},
		{Op: tiers.TracePut, Key: "secret-session", Size: 10},
		{Op: tiers.TraceGet, Key: "secret-session", Size: 10, Tier: tiers.TierWorking},
		{Op: tiers.TraceDelete, Key: "other"},
	}
	for _, batch := range [][]tiers.TraceEvent{evs[:2], evs[2:]} {
		w, err := tracefile.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range batch {
			w.Record(ev)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "secret") || strings.Contains(string(b), "other") {
		t.Fatalf("a key as it is:\n%s", b)
	}
	var got []tracefile.Access
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		a, err := tracefile.Parse(sc.Text())
		if err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		got = append(got, a)
	}
	if len(got) != len(evs) {
		t.Fatalf("%d lines:\n%s", len(got), b)
	}
	for i, a := range got {
		if a.Op != evs[i].Op || a.Tier != evs[i].Tier.String() || a.Hit() != (evs[i].Tier != tiers.TierNone) {
			t.Errorf("line %d: %+v from %+v", i, a, evs[i])
		}
	}
	if got[0].Key != got[1].Key || got[0].Key != got[2].Key || got[0].Key == got[3].Key {
		t.Errorf("keys %x", []uint64{got[0].Key, got[1].Key, got[2].Key, got[3].Key})
	}
}

func TestParseRefusesBadLines(t *testing.T) {
	for _, bad := range []string{"x 00 1 none", "g zz 1 none", "g 00 1", "gg 00 1 none", "g 00 1 none extra"} {
		if a, err := tracefile.Parse(bad); err == nil {
			t.Errorf("%q parsed: %+v", bad, a)
		}
	}
	for _, skip := range []string{"", "# comment"} {
		if !tracefile.Skip(skip) {
			t.Errorf("%q not skipped", skip)
		}
	}
}
