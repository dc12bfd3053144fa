package proxy

import (
	"testing"
	"time"
)

// BenchmarkRequestMetrics is what the metrics cost one proxied chat
// request: its count by route and code, its duration and its time to first
// byte, and its body bytes both ways.
func BenchmarkRequestMetrics(b *testing.B) {
	m := newMetrics(nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.ttfb[routeChat].observe(3 * time.Millisecond)
			m.bytesIn.Add(120)
			m.bytesOut.Add(300)
			m.countRequest(routeChat, 200, 4*time.Millisecond)
		}
	})
}
