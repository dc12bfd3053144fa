package histogram

import (
	"testing"
	"time"
)

func BenchmarkObserve(b *testing.B) {
	b.ReportAllocs()
	var h Histogram
	for i := range b.N {
		h.Observe(time.Duration(i%1000) * time.Millisecond)
	}
}
