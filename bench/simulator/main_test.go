package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/workload/cachesim"
)

func TestOtterContender(t *testing.T) {
	p, err := wTinyLFU.New(3)
	if err != nil {
		t.Fatal(err)
	}
	// A loop over three keys fits: every access after the first round hits.
	var keys []uint64
	for range 20 {
		keys = append(keys, 1, 2, 3)
	}
	if got := cachesim.Replay(cachesim.Trace{Name: "loop", Items: 3, Keys: keys}, p); got != 57.0/60 {
		t.Fatalf("hit ratio %v, want 57/60", got)
	}
	// A deleted key misses on its next access.
	tr := cachesim.Trace{Name: "del", Items: 1, Keys: []uint64{9, 9, 9, 9}, Deleted: []bool{false, false, true, false}}
	if got := cachesim.Replay(tr, p); got != 1.0/3 {
		t.Fatalf("hit ratio %v with a deletion, want 1/3", got)
	}
}

// TestDefaultMatchesWTinyLFU replays smaller draws of the synthetic traces
// and every recorded trace: the default strategy stays within half a point
// of otter's W-TinyLFU (or above it) at every size.
func TestDefaultMatchesWTinyLFU(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"-json", "-items", "4000", "-accesses", "40000", "-runs", "3"}, &out); err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Standing) < 6 || !strings.HasPrefix(r.Contenders[1], "w-tinylfu") {
		t.Fatalf("report %+v", r)
	}
	for _, s := range r.Standing {
		if s.VsWTinyLFU < -0.5 || s.Default > s.Belady+1e-9 {
			t.Errorf("%s at %d%%: default %.3f, w-tinylfu %.3f, belady %.3f", s.Trace, s.SizePct, s.Default, s.WTinyLFU, s.Belady)
		}
	}
	var table bytes.Buffer
	if err := writeTable(&table, r); err != nil || !strings.Contains(table.String(), "belady − default") {
		t.Fatalf("table: %v\n%s", err, table.String())
	}
}

// The AdaptiveTuner section: every fixed balance and the tuned run on the
// shifting trace. The tuned w-tinylfu beats the store's own (whose window
// climbs too slowly for the second half) and every fixed setting but the
// best few; its balance stays within bounds by construction.
func TestTunerOnShiftingTrace(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"-json", "-items", "4000", "-accesses", "40000", "-runs", "2", "-sizes", "20", "-trace", "../testdata/memory.trace"}, &out); err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Tuner) != len(TunedStrategies) || r.TunerEpoch != 1000 {
		t.Fatalf("tuner rows %+v", r.Tuner)
	}
	for _, row := range r.Tuner {
		if len(row.Fixed) != len(Balances) || row.Tuned.All > row.Belady+1e-9 || row.BestFixed < row.WorstFixed {
			t.Errorf("row %+v", row)
		}
		if row.Strategy == "w-tinylfu" && (row.Tuned.All < row.Own.All+0.05 || row.Tuned.All <= row.WorstFixed) {
			t.Errorf("w-tinylfu tuned %.3f, own %.3f, worst fixed %.3f", row.Tuned.All, row.Own.All, row.WorstFixed)
		}
	}
	var table bytes.Buffer
	if err := writeTable(&table, r); err != nil || !strings.Contains(table.String(), "tuned − best") {
		t.Fatalf("table: %v\n%s", err, table.String())
	}
}
