package gpu

import (
	"fmt"
	"testing"
)

// BenchmarkParallelCopy compares the staging copy with a plain copy of
// 4 MiB chunks (the default StagingBytes) taken in turn from a 256 MiB
// source, so that memory, not cache, feeds them as in a real transfer. It
// pays on hosts with cores to spare (GPU hosts); on two cores it cannot.
func BenchmarkParallelCopy(b *testing.B) {
	const chunk = defaultStagingBytes
	big, dst := make([]byte, 256<<20), make([]byte, chunk)
	for i := range big {
		big[i] = byte(i)
	}
	off := 0
	src := func() []byte {
		off = (off + chunk) % len(big)
		return big[off : off+chunk]
	}
	for _, c := range []struct {
		name string
		f    func(dst, src []byte)
	}{
		{"copy", func(dst, src []byte) { copy(dst, src) }},
		{"parallel", parallelCopy},
	} {
		b.Run(fmt.Sprintf("%s/%dMiB", c.name, chunk>>20), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(chunk)
			for b.Loop() {
				c.f(dst, src())
			}
		})
	}
}

func TestParallelCopy(t *testing.T) {
	for _, n := range []int{0, 1, 512 << 10, 1<<20 + 3, 4<<20 + 1} {
		src, dst := make([]byte, n), make([]byte, n)
		for i := range src {
			src[i] = byte(i * 7)
		}
		parallelCopy(dst, src)
		for i := range dst {
			if dst[i] != src[i] {
				t.Fatalf("%d bytes: byte %d differs", n, i)
			}
		}
	}
}
