package workload

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"strings"
	"testing"
)

func TestRunAmortization(t *testing.T) {
	r, err := RunAmortization(AmortOptions{Preset: "tiny", PrefixTokens: 128, MaxTurns: 8, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tiers) != 3 || r.TurnsTier != "focus" || len(r.Turns) != 8 || r.PrefixTokens != 128 {
		t.Fatalf("report %+v", r)
	}
	for _, tr := range r.Tiers {
		if tr.Loads != 14 || tr.Hits != 14 || tr.HitRate != 1 || tr.ComputeMs <= 0 || tr.LoadMs <= 0 {
			t.Fatalf("%s: %+v", tr.Tier, tr)
		}
		// T = 1 is one computing turn, which the formula takes as C_compute;
		// it contains the prefill.
		if d := tr.Turns[0].FormulaMs - tr.MissMs; d*d > 1e-12 || tr.MissMs < tr.ComputeMs || tr.StoreMs <= 0 {
			t.Fatalf("%s T=1: %+v, compute %v", tr.Tier, tr.Turns[0], tr.ComputeMs)
		}
		// The formula falls with T toward C_load.
		for i := 1; i < len(tr.Turns); i++ {
			if tr.Turns[i].FormulaMs > tr.Turns[i-1].FormulaMs && tr.LoadMs < tr.ComputeMs {
				t.Fatalf("%s: formula rises at T=%d", tr.Tier, i+1)
			}
		}
	}
	if r.BlockBytes != 128*2*2*2*16*2 {
		t.Fatalf("block of %d bytes", r.BlockBytes)
	}

	// The JSON carries the contract's members.
	data, err := json.Marshal(map[string]any{"amortization": r})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Amortization struct {
			PrefixTokens *int               `json:"prefix_tokens"`
			ComputeMs    *float64           `json:"compute_ms"`
			LoadMs       map[string]float64 `json:"load_ms"`
			Turns        []struct {
				T          *int     `json:"t"`
				MeasuredMs *float64 `json:"measured_ms"`
				FormulaMs  *float64 `json:"formula_ms"`
			} `json:"turns"`
		} `json:"amortization"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	a := got.Amortization
	if a.PrefixTokens == nil || a.ComputeMs == nil || len(a.LoadMs) != 3 || len(a.Turns) != 8 ||
		a.Turns[7].T == nil || *a.Turns[7].T != 8 || a.Turns[7].MeasuredMs == nil || a.Turns[7].FormulaMs == nil {
		t.Fatalf("json %s", data)
	}
	for _, tier := range []string{"focus", "working", "archive"} {
		if _, ok := a.LoadMs[tier]; !ok {
			t.Fatalf("no load_ms.%s in %s", tier, data)
		}
	}

	var tab bytes.Buffer
	if err := WriteAmortTable(&tab, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"focus", "working", "archive", "prefill/load", "goal"} {
		if !strings.Contains(tab.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, tab.String())
		}
	}
	var svg bytes.Buffer
	if err := WriteAmortSVG(&svg, r); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&svg)
	lines := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("svg: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 6 {
		t.Fatalf("%d curves, want measured and formula for 3 tiers", lines)
	}
}

func TestAmortOptions(t *testing.T) {
	for _, o := range []AmortOptions{{Preset: "nope"}, {Tiers: []string{"disk"}}, {MaxTurns: 1}, {PrefixTokens: -1}, {Tiers: []string{}}} {
		if _, err := RunAmortization(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
