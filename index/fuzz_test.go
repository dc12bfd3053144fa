package index

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzTokenize(f *testing.F) {
	for _, s := range []string{"", "Caroline's camping", "北京大学 and ソウル", "don't", "\xff\xfe", "a'", "'s", strings.Repeat("é", 70), "x\u0301y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		toks := tokenize(s)
		for _, tok := range toks {
			if tok == "" || !utf8.ValidString(tok) || len(tok) > maxTokenBytes+utf8.UTFMax {
				t.Fatalf("bad token %q from %q", tok, s)
			}
		}
		if len(toks) > len(s) {
			t.Fatalf("%d tokens from %d bytes", len(toks), len(s))
		}
	})
}

// FuzzSearch runs untrusted query strings through every search mode.
func FuzzSearch(f *testing.F) {
	x, err := New(Options{})
	if err != nil {
		f.Fatal(err)
	}
	for i, s := range append(pets, "北京大学", "") {
		x.Add(ctx, Doc{ID: string(rune('a' + i)), Text: s})
	}
	for _, s := range []string{"camping", "", "\x00\xff", "the the the", "北京", strings.Repeat("a ", 500)} {
		f.Add(s, uint8(5))
	}
	f.Fuzz(func(t *testing.T, q string, k uint8) {
		for _, mode := range []Mode{ModeBM25, ModeVector, ModeHybrid} {
			hits, err := x.Search(ctx, q, int(k%20)+1, mode)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hits {
				if math.IsNaN(h.Score) || math.IsInf(h.Score, 0) || h.Relevance < 0 || h.Relevance > 1+1e-9 {
					t.Fatalf("%v %q: hit %+v", mode, q, h)
				}
			}
		}
	})
}

func validIndexFile(t testing.TB) []byte {
	x := newTestIndex(t, Options{Embedder: NewHashEmbedder(HashOptions{Dim: 8})}, "one two", "three")
	p := filepath.Join(t.TempDir(), "i.bin")
	if err := x.Save(p); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzLoad feeds arbitrary files to Load: it returns an index or an error,
// never panics.
func FuzzLoad(f *testing.F) {
	good := validIndexFile(f)
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte(fileMagic))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "f.bin")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		x, err := Load(p, Options{Embedder: NewHashEmbedder(HashOptions{Dim: 8})})
		if err == nil {
			x.Search(ctx, "one", 3, ModeHybrid)
		}
	})
}

// FuzzDecodeBody skips the checksum so the fuzzer reaches the parser.
func FuzzDecodeBody(f *testing.F) {
	good := validIndexFile(f)
	f.Add(good[len(fileMagic) : len(good)-4])
	f.Fuzz(func(t *testing.T, body []byte) {
		_, dim, docs, err := decodeBody(body)
		if err != nil {
			return
		}
		for _, d := range docs {
			if d.ID == "" || (d.Vector != nil && len(d.Vector) != dim) {
				t.Fatalf("accepted bad doc %+v (dim %d)", d, dim)
			}
		}
	})
}
