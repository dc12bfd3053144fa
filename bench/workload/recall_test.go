package workload

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/index"
)

const recallFixture = "testdata/recall/locomo-mini.json"

func TestLoadLocomoNormalises(t *testing.T) {
	convs, err := LoadLocomo(recallFixture)
	if err != nil {
		t.Fatal(err)
	}
	if len(convs) != 2 || convs[0].ID != "mini-1" {
		t.Fatalf("conversations %d", len(convs))
	}
	var turnIDs []string
	for _, tr := range convs[0].Turns {
		turnIDs = append(turnIDs, tr.DiaID)
	}
	// Sessions in numeric order: session_10 after session_2.
	want := []string{"D1:1", "D1:2", "D1:3", "D1:4", "D2:1", "D2:2", "D2:3", "D2:4", "D10:1", "D10:2"}
	if !slices.Equal(turnIDs, want) {
		t.Errorf("turns %v", turnIDs)
	}
	qa := convs[0].QA
	if !slices.Equal(qa[1].Evidence, []string{"D1:4"}) || !slices.Equal(qa[2].Evidence, []string{"D1:2", "D2:2"}) ||
		!slices.Equal(qa[3].Evidence, []string{"D10:1"}) || len(qa[6].Evidence) != 0 {
		t.Errorf("evidence %q %q %q %q", qa[1].Evidence, qa[2].Evidence, qa[3].Evidence, qa[6].Evidence)
	}
	if convs[0].SessionTimes[10] != "3:00 pm on 2 August, 2023" {
		t.Errorf("session times %v", convs[0].SessionTimes)
	}
	if _, err := ParseLocomo([]byte(`{"not":"a list"}`)); err == nil {
		t.Error("bad JSON accepted")
	}
}

func TestLocomoNormalizeEvidence(t *testing.T) {
	f := func(in []string, want ...string) {
		t.Helper()
		if got := locomoNormalizeEvidence(in); !slices.Equal(got, want) {
			t.Errorf("locomoNormalizeEvidence(%q) = %q, want %q", in, got, want)
		}
	}
	f(nil)
	f([]string{"D1:3"}, "D1:3")
	f([]string{"D8:6; D9:17"}, "D8:6", "D9:17")
	f([]string{" D 2:08 ", "D2:8"}, "D2:8")
	f([]string{"D1:1,D1:2;"}, "D1:1", "D1:2")
	f([]string{"weird"}, "weird")
}

func TestRunRecallOnFixture(t *testing.T) {
	r, err := RunRecall(RecallOptions{Data: recallFixture})
	if err != nil {
		t.Fatal(err)
	}
	if r.Conversations != 2 || r.Turns != 12 || r.Questions != 9 || r.SkippedNoEvidence != 1 || r.UnknownEvidence != 1 {
		t.Errorf("counts %+v", r)
	}
	if r.CategoryQuestions["single-hop"] != 5 || r.CategoryQuestions["multi-hop"] != 1 || r.CategoryQuestions["adversarial"] != 1 {
		t.Errorf("categories %v", r.CategoryQuestions)
	}
	if r.ContextTurns != 1 || !r.Captions || !r.Speaker || r.Embedder != "hash-v1-d512" {
		t.Errorf("settings %+v", r)
	}
	for _, m := range []string{"bm25", "vector", "hybrid"} {
		prev := -1.0
		for _, k := range []string{"5", "10", "25", "50"} {
			v, ok := r.Recall[m][k]
			if !ok || v < prev || v > 100 {
				t.Errorf("%s R@%s = %v (prev %v)", m, k, v, prev)
			}
			prev = v
		}
		// One question's only evidence does not exist, so 100% is out of
		// reach: 8 of 9 questions at most.
		if r.Recall[m]["50"] > 100*8.0/9+0.1 {
			t.Errorf("%s R@50 = %v counts the unknown evidence as found", m, r.Recall[m]["50"])
		}
	}
	// Every conversation has at most 10 turns, so hybrid and vector (which
	// rank every turn) find all known evidence by k=10.
	if got := r.Recall["hybrid"]["10"]; got != 88.9 {
		t.Errorf("hybrid R@10 = %v, want 88.9", got)
	}
	if got := r.ByCategory["bm25"]["temporal"]["5"]; got != 100 {
		t.Errorf("temporal bm25 R@5 = %v", got)
	}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var shape struct {
		Recall map[string]map[string]float64 `json:"recall"`
	}
	if err := json.Unmarshal(raw, &shape); err != nil || len(shape.Recall["hybrid"]) != 4 || len(shape.Recall["bm25"]) != 4 {
		t.Errorf("json shape: %s", raw)
	}
}

// TestRecallCaptions: the telescope is only in the photo's caption.
func TestRecallCaptions(t *testing.T) {
	r := func(noCaptions bool) float64 {
		rep, err := RunRecall(RecallOptions{Data: recallFixture, NoCaptions: noCaptions, ContextTurns: -1, Index: index.Options{}})
		if err != nil {
			t.Fatal(err)
		}
		return rep.ByCategory["bm25"]["single-hop"]["5"]
	}
	with, without := r(false), r(true)
	if with <= without {
		t.Errorf("single-hop bm25 R@5 with captions %v, without %v", with, without)
	}
}

func TestRunRecallErrors(t *testing.T) {
	if _, err := RunRecall(RecallOptions{}); err == nil {
		t.Error("no data: no error")
	}
	if _, err := RunRecall(RecallOptions{Data: "testdata/recall/missing.json"}); err == nil {
		t.Error("missing file: no error")
	}
}

func TestWriteRecallTable(t *testing.T) {
	r, err := RunRecall(RecallOptions{Data: recallFixture})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteRecallTable(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"R@5", "R@50", "bm25", "vector", "hybrid", "DRAGON", "56.7", "82.7", "single-hop (5) hybrid", "temporal (1) bm25"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestRunRecallScaleOnFixture(t *testing.T) {
	r, err := RunRecallScale(RecallScaleOptions{Data: recallFixture, N: 300, Queries: 20, Index: index.Options{ExactBelow: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Memories != 300 || r.Queries != 20 || !r.Graph || r.ApproxBytes <= 0 || len(r.Latency) != 3 {
		t.Errorf("report %+v", r)
	}
	for m, l := range r.Latency {
		if l.P50us <= 0 || l.P99us < l.P50us {
			t.Errorf("%s latency %+v", m, l)
		}
	}
	if _, err := RunRecallScale(RecallScaleOptions{}); err == nil {
		t.Error("no data: no error")
	}
}
