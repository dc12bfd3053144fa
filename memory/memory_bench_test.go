package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// zipfWords is a vocabulary of made-up words drawn with Zipf's law
// (exponent 1.1 over 5,000 words), as words are in conversation: a few
// frequent, most rare. (Uniform draws from a small vocabulary would put
// every word in most messages, which no conversation does.)
var zipfWords = func() []string {
	r := rand.New(rand.NewPCG(11, 11))
	syl := strings.Fields("ka lo mi ne ru sa ti vo pe da gi lu ze ba no fi ro te mu ya")
	words := make([]string, 5000)
	seen := map[string]bool{}
	for i := range words {
		for {
			var b strings.Builder
			for range 2 + r.IntN(3) {
				b.WriteString(syl[r.IntN(len(syl))])
			}
			if w := b.String(); !seen[w] {
				seen[w] = true
				words[i] = w
				break
			}
		}
	}
	return words
}()

func zipfText(r *rand.Rand, z *rand.Zipf, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(zipfWords[z.Uint64()])
	}
	return b.String()
}

// benchSession builds a session of n turns (user + assistant) and returns
// the full-history request of the next turn.
func benchSession(b *testing.B, s *Store, n int) []Message {
	b.Helper()
	r := rand.New(rand.NewPCG(7, 7))
	z := rand.NewZipf(r, 1.1, 1, uint64(len(zipfWords)-1))
	randText := func(_ *rand.Rand, n int) string { return zipfText(r, z, n) }
	msgs := []Message{text("system", "You are a helpful assistant. "+randText(r, 40))}
	for i := 0; i < n; i++ {
		msgs = append(msgs, text("user", fmt.Sprintf("q%d %s", i, randText(r, 30))))
		tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "bench", Mode: ModeFull, Model: "test-model", Messages: msgs})
		if err != nil {
			b.Fatal(err)
		}
		a := text("assistant", fmt.Sprintf("a%d %s", i, randText(r, 60)))
		tr.Complete(a)
		msgs = append(msgs, a)
	}
	return append(msgs, text("user", "next question "+randText(r, 30)))
}

// BenchmarkPrepare measures the request-path cost of Prepare on a session
// of n turns (texts from zipfWords). "full": a full-history client re-sends the same request
// (nothing new to append), which isolates matching and window building.
// "turn": a new user message per iteration in append mode, then Complete
// with a new reply: tokenizing the new text, the log appends (FsyncNever),
// recall and block over a new query, and the worker running alongside.
func BenchmarkPrepare(b *testing.B) {
	for _, turns := range []int{10, 50, 100, 1000} {
		b.Run(fmt.Sprintf("turns=%d/full", turns), func(b *testing.B) {
			s := openStore(b, b.TempDir(), nil)
			req := benchSession(b, s, turns)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				tr, err := s.Prepare(ctx, TurnRequest{Tenant: "t", SessionID: "bench", Mode: ModeFull, Model: "test-model", Messages: req})
				if err != nil {
					b.Fatal(err)
				}
				tr.Abort()
			}
		})
		b.Run(fmt.Sprintf("turns=%d/turn", turns), func(b *testing.B) {
			s := openStore(b, b.TempDir(), nil)
			benchSession(b, s, turns)
			ctx := context.Background()
			r := rand.New(rand.NewPCG(3, 3))
			z := rand.NewZipf(r, 1.1, 1, uint64(len(zipfWords)-1))
			randText := func(_ *rand.Rand, n int) string { return zipfText(r, z, n) }
			const distinct = 512
			var users, replies [distinct]Message
			for i := range users {
				users[i] = text("user", fmt.Sprintf("n%d %s", i, randText(r, 30)))
				replies[i] = text("assistant", fmt.Sprintf("r%d %s", i, randText(r, 60)))
			}
			i := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				tr, err := s.Prepare(ctx, TurnRequest{Tenant: "t", SessionID: "bench", Mode: ModeAppend, Model: "test-model", Messages: users[i%distinct : i%distinct+1]})
				if err != nil {
					b.Fatal(err)
				}
				tr.Complete(replies[i%distinct])
				i++
			}
		})
	}
}

// BenchmarkCount compares counting a ~1,000-token message cold (no cache)
// with a cache hit.
func BenchmarkCount(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	msg := randText(r, 900)
	cold := NewTokenizer(0)
	n := cold.Count(CL100K, msg)
	b.Run("uncached", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(msg)))
		for b.Loop() {
			cold.Count(CL100K, msg)
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	})
	b.Run("cached", func(b *testing.B) {
		warm := NewTokenizer(1024)
		warm.Count(CL100K, msg)
		b.ReportAllocs()
		b.SetBytes(int64(len(msg)))
		for b.Loop() {
			warm.Count(CL100K, msg)
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	})
}

// BenchmarkLogAppend measures one ~300-byte record append per fsync policy.
func BenchmarkLogAppend(b *testing.B) {
	payload := durable.AppendRecord(nil, []byte(`{"k":"msg","msg":{"role":"user","content":"`+strings.Repeat("x", 260)+`"}}`))
	for _, p := range []FsyncPolicy{FsyncAlways, FsyncInterval, FsyncNever} {
		b.Run(p.String(), func(b *testing.B) {
			s := openStore(b, b.TempDir(), func(o *Options) { o.Fsync = p })
			l, err := s.j.Create(b.TempDir()+"/bench.log", durable.AppendRecord(nil, []byte("meta")))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if err := l.Append(payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
