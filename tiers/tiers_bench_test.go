package tiers

import (
	"strconv"
	"testing"
)

func benchValue(size int) Value {
	return Value{Meta: Meta{DType: DTypeF16}, Data: fp16Data(size/2, 1)}
}

func BenchmarkWorkingPut1MiB(b *testing.B) {
	s, err := Open(Options{DisableFocus: true, Working: Budget{MaxBytes: 64 << 20}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	v := benchValue(1 << 20)
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	i := 0
	for b.Loop() {
		if err := s.Put("k"+strconv.Itoa(i%32), v, PutOptions{}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkWorkingGet1MiB(b *testing.B) { benchStoreGet1MiB(b, Options{DisableFocus: true}) }

func BenchmarkFocusGet1MiB(b *testing.B) { benchStoreGet1MiB(b, Options{}) }

// benchStoreGet1MiB gets one 1 MiB block from a store opened with o, in
// whichever tier o lets it land.
func benchStoreGet1MiB(b *testing.B, o Options) {
	s, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.Put("k", benchValue(1<<20), PutOptions{})
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	for b.Loop() {
		if _, _, err := s.Get("k"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkArchivePut1MiB(b *testing.B) {
	a, err := OpenArchive(ArchiveOptions{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	v := benchValue(1 << 20)
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	i := 0
	for b.Loop() {
		if err := a.Put("k"+strconv.Itoa(i%16), v, false); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkArchiveGet1MiB(b *testing.B) {
	a, err := OpenArchive(ArchiveOptions{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	if err := a.Put("k", benchValue(1<<20), false); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	for b.Loop() {
		if _, _, err := a.Get("k"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodePayloadFP16(b *testing.B) {
	v := benchValue(1 << 20)
	buf := make([]byte, 0, 1<<20)
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	for b.Loop() {
		buf, _ = encodePayload(buf[:0], v.Data, DTypeF16, false, encoderLevel(1))
	}
}

func BenchmarkSplitJoinPlanes(b *testing.B) {
	v := benchValue(1 << 20)
	buf := make([]byte, 0, 1<<20)
	out := make([]byte, 0, 1<<20)
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	for b.Loop() {
		buf = splitPlanes(buf[:0], v.Data, 2)
		n := len(v.Data) / 2
		out = joinPlanes(out[:0], [][]byte{buf[:n], buf[n:]}, n)
	}
}

// BenchmarkPolicy is one reference per op (a hit, or a miss that evicts and
// adds) through each strategy on a cache of 1,000 keys drawn from 10,000,
// 80% of references to a fifth of them: what a tier pays under its lock.
//
//	go test ./tiers -run '^$' -bench Policy
func BenchmarkPolicy(b *testing.B) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "c\x24session-" + strconv.Itoa(i) + "/0123456789abcdef"
	}
	var x uint64 = 1
	refs := make([]string, 1<<16)
	for i := range refs {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if x%5 != 0 {
			refs[i] = keys[(x>>8)%2000]
		} else {
			refs[i] = keys[2000+(x>>8)%8000]
		}
	}
	for _, s := range Strategies() {
		b.Run(s, func(b *testing.B) {
			pol, _ := NewPolicy(s)
			sim := &policySim{pol: pol, cap: 1000, present: map[string]bool{}}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				sim.access(refs[i%len(refs)], Hint{})
				i++
			}
		})
	}
}
