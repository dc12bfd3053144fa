package memory

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// BenchmarkCompleteDurable is what recording a complete reply costs the
// proxy before the client sees the end of the answer (issue 12 row 15):
// count the reply's tokens, append its record and fsync per the policy
// (the worker's background indexing runs alongside).
func BenchmarkCompleteDurable(b *testing.B) {
	for _, p := range []FsyncPolicy{FsyncAlways, FsyncNever} {
		for _, size := range []int{1 << 10, 16 << 10} {
			b.Run(fmt.Sprintf("%s/%dKiB", p, size>>10), func(b *testing.B) {
				s := openStore(b, b.TempDir(), func(o *Options) { o.Fsync = p; o.Window.Limit = 65536 })
				body := strings.Repeat("The answer has several words. ", size/30)
				i := 0
				b.ReportAllocs()
				b.SetBytes(int64(size))
				for b.Loop() {
					b.StopTimer()
					tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "bench", Mode: ModeAppend, Model: "m", Messages: []Message{text("user", fmt.Sprintf("question %d", i))}})
					if err != nil {
						b.Fatal(err)
					}
					reply := text("assistant", fmt.Sprintf("%d %s", i, body)) // new text: not in the count cache
					i++
					b.StartTimer()
					if err := tr.Complete(reply); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
