package memory

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// BenchmarkCountPathological counts one long "word" — 'a'×N, CJK without
// spaces, punctuation — against prose of the same size, with no cache. Cost
// per byte stays flat as N grows 4× (linear); on main 'a'×100 KB took
// 12.5 s and 400 KB 151 s (quadratic, issue 12 row 1).
func BenchmarkCountPathological(b *testing.B) {
	tk := NewTokenizer(0)
	if err := tk.Load(CL100K); err != nil {
		b.Fatal(err)
	}
	inputs := []struct {
		name string
		unit string
	}{
		{"a", "a"},
		{"cjk", "中文没有空格的长句子"},
		{"punct", "!?"},
		{"prose", ""},
	}
	for _, in := range inputs {
		for _, n := range []int{100_000, 400_000} {
			s := strings.Repeat(in.unit, max(1, n/max(1, len(in.unit))))
			if in.unit == "" {
				s = ordinaryText(rand.New(rand.NewPCG(5, 6)), n)
			}
			b.Run(fmt.Sprintf("%s/%dKB", in.name, n/1000), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(s)))
				for b.Loop() {
					tk.Count(CL100K, s)
				}
			})
		}
	}
}
