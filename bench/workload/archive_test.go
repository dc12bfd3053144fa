package workload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The quantiser: codes decode to their centroids, asymmetric scores equal
// the dot product with the decoded vectors, and a vector that is a
// centroid in every subspace comes back exactly.
func TestProductQuantiser(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var vecs [][]float32
	for range 300 {
		v := make([]float32, 16)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		vecs = append(vecs, v)
	}
	q, err := trainPQ(vecs, 4, 16, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	codes := make([][]byte, len(vecs))
	out := make([]float32, 16)
	for i, v := range vecs {
		codes[i] = q.encode(v)
		if len(codes[i]) != 4 {
			t.Fatalf("code of %d bytes", len(codes[i]))
		}
	}
	query := vecs[7]
	scores := q.scores(query, codes)
	for i, c := range codes {
		q.decode(c, out)
		if d := math.Abs(float64(scores[i] - dot32(query, out))); d > 1e-4 {
			t.Fatalf("vector %d: ADC %v, decoded dot %v", i, scores[i], dot32(query, out))
		}
	}
	q.decode(codes[0], out)
	again := q.encode(out)
	if !bytes.Equal(again, codes[0]) {
		t.Fatalf("a decoded vector encodes to %v, not %v", again, codes[0])
	}
	// Quantisation error is below the data's spread.
	var errSum, norm float64
	for i, v := range vecs {
		q.decode(codes[i], out)
		errSum += sqDist(v, out)
		norm += sqDist(v, make([]float32, 16))
	}
	if errSum >= norm/2 {
		t.Fatalf("quantisation error %.1f of %.1f", errSum, norm)
	}
	if _, err := trainPQ(vecs, 5, 16, 1, 1); err == nil {
		t.Fatal("5 subspaces of 16 dimensions accepted")
	}
}

func TestExtractiveSummary(t *testing.T) {
	turns := []string{
		"Alice: hello",
		"Bob: I adopted a dog named Pepper from the shelter, Pepper loves the beach",
		"Alice: nice",
		"Bob: Pepper and I walk on the beach every morning",
	}
	df := map[string]int{}
	sum := extractiveSummary(turns, df, 10, 80)
	if !strings.Contains(sum, "Pepper") || strings.Contains(sum, "hello") || len(sum) > 80 {
		t.Fatalf("summary %q", sum)
	}
	// Order is the document's; at least one turn even over the budget.
	if one := extractiveSummary(turns, df, 10, 1); one == "" || strings.Contains(one, "\n") {
		t.Fatalf("one-turn summary %q", one)
	}
	if got := evidenceSessions([]string{"D3:5", "D3:7", "D10:1", "x"}); fmt.Sprint(got) != "[S3 S10]" {
		t.Fatalf("evidence sessions %v", got)
	}
}

// A small LoCoMo-shaped file through the whole study: every row reported,
// text rows lossless and smaller with the dictionary.
func TestRunArchiveSmall(t *testing.T) {
	words := strings.Fields("Melanie Caroline painting beach camping adoption agency pottery class kids dog support group Pride parade guitar school")
	rng := rand.New(rand.NewPCG(3, 4))
	conv := map[string]any{"speaker_a": "Caroline", "speaker_b": "Melanie"}
	var qa []map[string]any
	for s := 1; s <= 6; s++ {
		var turns []map[string]string
		for i := 1; i <= 20; i++ {
			var b []string
			for range 12 {
				b = append(b, words[rng.IntN(len(words))])
			}
			sp := "Caroline"
			if i%2 == 0 {
				sp = "Melanie"
			}
			text := "I think " + strings.Join(b, " ") + "."
			if i == 3 {
				text = "Melanie went " + words[s] + " " + words[s] + " yesterday."
			}
			turns = append(turns, map[string]string{"speaker": sp, "dia_id": fmt.Sprintf("D%d:%d", s, i), "text": text})
		}
		conv[fmt.Sprintf("session_%d", s)] = turns
		conv[fmt.Sprintf("session_%d_date_time", s)] = "1:00 pm on 8 May, 2023"
		qa = append(qa, map[string]any{"question": "When did Melanie go " + words[s] + "?", "evidence": []string{fmt.Sprintf("D%d:3", s)}, "category": 1})
	}
	raw, _ := json.Marshal([]map[string]any{{"sample_id": "x", "conversation": conv, "qa": qa}})
	path := filepath.Join(t.TempDir(), "locomo.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := RunArchive(ArchiveOptions{Data: path, DictBytes: 1 << 10, Repeat: 1, PQBytes: 32})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rows) != 6 || r.Turns != 120 || r.Questions != 6 || r.CopyMBps <= 0 {
		t.Fatalf("report %+v", r)
	}
	plain, withDict := r.Rows[0], r.Rows[1]
	if !plain.Lossless || !withDict.Lossless || withDict.StoredBytes-withDict.SideBytes >= plain.StoredBytes || plain.DecodeMBps <= 0 {
		t.Fatalf("text rows %+v / %+v", plain, withDict)
	}
	v := r.Rows[4]
	if v.Lossless || v.RawBytes != 120*2048 || v.StoredBytes != 120*32+v.SideBytes || v.Recall10Base <= 0 {
		t.Fatalf("vector row %+v", v)
	}
	d := r.Rows[5]
	if d.Saving >= 90 || d.Meets90 || d.Recall10Base <= 0 {
		t.Fatalf("document row %+v", d)
	}
	var b bytes.Buffer
	if err := WriteArchiveTable(&b, r); err != nil || !strings.Contains(b.String(), "lossless") {
		t.Fatalf("table: %v\n%s", err, b.String())
	}
}
