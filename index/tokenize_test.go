package index

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTokenize(t *testing.T) {
	f := func(in string, want ...string) {
		t.Helper()
		got := tokenize(in)
		if !slices.Equal(got, want) {
			t.Errorf("tokenize(%q) = %q, want %q", in, got, want)
		}
	}
	f("")
	f("   ,,, !!!")
	f("The cats were running", "cat", "run")
	f("I went to a LGBTQ support group yesterday", "went", "lgbtq", "support", "group", "yesterdai")
	f("Caroline's camping trip", "carolin", "camp", "trip")
	f("Caroline’s", "carolin")
	f("I don't know, it's fine", "know", "fine")
	f("self-care matters", "self", "care", "matter")
	f("born in 1990, turned 18th", "born", "1990", "turn", "18th")
	f("Café CRÈME", "café", "crème")
	f("北京大学", "北京", "京大", "大学")
	f("我", "我")
	f("东京とパリ", "东京", "京と", "とパ", "パリ")
	f("안녕하세요 world", "안녕", "녕하", "하세", "세요", "world")
	f("go北京go", "go", "北京", "go")
	f("bad\xffbytes", "bad", "byte")
}

func TestTokenizeBoundsTokenLength(t *testing.T) {
	got := tokenize(strings.Repeat("x", 10000) + " end")
	if len(got) != 2 || len(got[0]) > maxTokenBytes || got[1] != "end" {
		t.Fatalf("got %d tokens, first %d bytes", len(got), len(got[0]))
	}
	got = tokenize(strings.Repeat("é", 1000))
	if len(got) != 1 || len(got[0]) > maxTokenBytes+utf8.UTFMax || !utf8.ValidString(got[0]) {
		t.Fatalf("got %q", got)
	}
}

func TestStopwordsNeverIndexed(t *testing.T) {
	for w := range stopwords {
		if got := tokenize(w); len(got) != 0 {
			t.Errorf("stopword %q tokenized to %q", w, got)
		}
	}
}
