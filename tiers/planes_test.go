package tiers

import (
	"bytes"
	"testing"
)

func TestPlanes(t *testing.T) {
	for _, width := range []int{2, 4} {
		for _, n := range []int{0, 1, 3, 4, 5, 64, 1001} {
			src := value("p", n*width)
			split := splitPlanes([]byte("x"), src, width)[1:]
			for i := range n {
				for p := range width {
					if split[p*n+i] != src[i*width+p] {
						t.Fatalf("width %d n %d: element %d byte %d misplaced", width, n, i, p)
					}
				}
			}
			planes := make([][]byte, width)
			for p := range width {
				planes[p] = split[p*n : (p+1)*n]
			}
			if got := joinPlanes(nil, planes, n); !bytes.Equal(got, src) {
				t.Fatalf("width %d n %d: join(split(x)) != x", width, n)
			}
		}
	}
}
