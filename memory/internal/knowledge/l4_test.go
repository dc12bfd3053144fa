package knowledge

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

func TestL4Keywords(t *testing.T) {
	f := func(in string, want ...string) {
		t.Helper()
		if want == nil {
			want = []string{}
		}
		if got := Keywords(in); !slices.Equal(got, want) {
			t.Errorf("Keywords(%q) = %q; want %q", in, got, want)
		}
	}
	// Capitalised phrases and words; stop words and words touching other
	// letters are not keywords.
	f("The user studies Machine Learning in Tokyo.", "Learning", "Machine", "Machine Learning", "Tokyo")
	f("This is McDonald and iPhone, not OpenAI.")
	f("snake_case ids like max_tokens_2 and api_server but not _x or a_", "api_server", "max_tokens_2", "snake_case")
	f("paths such as loom.memory.core and config.yaml; not 3.14 or A.B", "config.yaml", "loom.memory.core")
	f("ALL_CAPS names: HTTP_PROXY, API and GPU2 but not APIs or aAPI", "ALL_CAPS", "API", "GPU", "HTTP_PROXY")
	// CJK runs are split at stop words; segments of one character drop.
	f("用户的猫叫汤姆，住在柏林。", "柏林", "猫叫汤姆", "用户")
	f("我们已经在北京部署了服务", "北京部署", "服务")
	f("用Kubernetes部署api_server服务", "Kubernetes", "api_server", "服务", "部署")
	f("")
}

// FuzzParseL4Merge: whatever the model answers, the parser never panics
// and accepts only a skip or one short, single-line, safe, tag-free text,
// which renders back to an answer that parses to itself.
func FuzzParseL4Merge(f *testing.F) {
	for _, s := range []string{"[MERGE] a", "[SKIP]", "[MERGE] a\nb", "[MERGE] [DELETE:x]", "\u202e", "[MERGE] 用户"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		txt, skip, err := ParseMerge(in)
		if err != nil {
			if txt != "" || skip || !errors.Is(err, memerr.ErrInvalid) {
				t.Fatalf("%q, %v, %v", txt, skip, err)
			}
			return
		}
		if skip {
			if txt != "" {
				t.Fatalf("skip with text %q", txt)
			}
			return
		}
		if txt == "" || len(txt) > maxMergedBytes || strings.ContainsAny(txt, "\n\r") || ValidFactTextMax(txt, maxMergedBytes) != nil {
			t.Fatalf("unsafe text %q", txt)
		}
		again, sk, err := ParseMerge("[MERGE] " + txt)
		if err != nil || sk || again != txt {
			t.Fatalf("%q parses back to %q, %v, %v", txt, again, sk, err)
		}
	})
}

func TestL4ClustersUnionFind(t *testing.T) {
	v := func(x, y float32) []float32 { return UnitVector([]float32{x, y}) }
	// a~b and b~c join a and c (transitively) though a and c are apart;
	// d alone; e~f form a pair, below the minimum size.
	facts := []Fact{
		{ID: "a", Vec: v(1, 0)}, {ID: "b", Vec: v(1, 0.45)}, {ID: "c", Vec: v(1, 0.9)},
		{ID: "d", Vec: v(-1, 0)}, {ID: "e", Vec: v(0, -1)}, {ID: "f", Vec: v(0.05, -1)}, {ID: "g"},
	}
	if c := CosineVec(facts[0].Vec, facts[2].Vec); c >= 0.9 {
		t.Fatalf("a and c too close: %v", c)
	}
	cl := Clusters(facts, 0.9, 3)
	if len(cl) != 1 || len(cl[0]) != 3 || cl[0][0].ID != "a" || cl[0][2].ID != "c" {
		t.Fatalf("clusters %v", cl)
	}
	if cl := Clusters(facts, 0.9, 2); len(cl) != 2 || len(cl[1]) != 2 || cl[1][0].ID != "e" {
		t.Fatalf("clusters of 2: %v", cl)
	}
	parts := SplitCluster(make([]*Fact, 25), 12, 3)
	if len(parts) != 3 || len(parts[0]) != 8 || len(parts[2]) != 9 {
		t.Fatalf("split 25 by 12: %d parts", len(parts))
	}
}

func TestParseL4Merge(t *testing.T) {
	ok := func(in, want string, skip bool) {
		t.Helper()
		got, sk, err := ParseMerge(in)
		if err != nil || got != want || sk != skip {
			t.Fatalf("ParseMerge(%q) = %q, %v, %v; want %q, %v", in, got, sk, err, want, skip)
		}
	}
	ok("[MERGE] The user's cat Tom likes fish.", "The user's cat Tom likes fish.", false)
	ok("\n  [MERGE]   用户的猫叫汤姆。 \r\n", "用户的猫叫汤姆。", false)
	ok(" [SKIP] ", "", true)
	for _, bad := range []string{
		"", " ", "SKIP", "[skip]", "[MERGE]", "[MERGE]x", "[MERGE] ", "Merged: [MERGE] x", "[MERGE] a\n[MERGE] b",
		"[MERGE] a\nb", "[MERGE] a [DELETE:fact-1]", "[MERGE] a [MERGE] b", "[MERGE] a\x1b[2J", "[MERGE] a\u202eb",
		"[MERGE] a\u2028b", "[MERGE] \xff", "[MERGE] " + strings.Repeat("x", maxMergedBytes+1), "[SKIP] because", "[ADD] x",
		strings.Repeat(" ", 3000) + "[SKIP]",
	} {
		if txt, sk, err := ParseMerge(bad); err == nil || !errors.Is(err, memerr.ErrInvalid) {
			t.Errorf("ParseMerge(%q) = %q, %v, %v; want an ErrInvalid error", bad, txt, sk, err)
		}
	}
}

// TestClusterFPStable: a refused cluster's fingerprint is written to the
// log and compared in a later process, so it must not depend on the
// process (a maphash seed would).
func TestClusterFPStable(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	fs := []*Fact{{ID: "fact-000000000001-00", Content: "The user lives in Lisbon.", Updated: at},
		{ID: "fact-000000000002-00", Content: "The user moved to Lisbon.", Updated: at}}
	const want uint64 = 0xde3d6c8c9fbc4bdd
	got := ClusterFP(fs)
	if got != ClusterFP(fs) || got&1 != 1 {
		t.Fatalf("ClusterFP not deterministic or not odd: %#x", got)
	}
	if got != want {
		t.Fatalf("ClusterFP = %#x, want %#x (the value earlier processes wrote)", got, want)
	}
	other := []*Fact{fs[0], {ID: fs[1].ID, Content: fs[1].Content, Updated: at.Add(time.Nanosecond)}}
	if ClusterFP(other) == got {
		t.Fatal("a fact's new state did not change the fingerprint")
	}
}
