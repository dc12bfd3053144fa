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

func BenchmarkWorkingGet1MiB(b *testing.B) {
	s, err := Open(Options{DisableFocus: true})
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

func BenchmarkFocusGet1MiB(b *testing.B) {
	s, err := Open(Options{})
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
