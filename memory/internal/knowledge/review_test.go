package knowledge

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

func TestParseReview(t *testing.T) {
	ok := func(in string, want ReviewStep) {
		t.Helper()
		got, err := ParseReview(in)
		if err != nil || got != want {
			t.Fatalf("ParseReview(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	ok("[PROMOTE]", ReviewStep{Kind: ReviewPromote})
	ok("  [KEEP] still true, used last week \n", ReviewStep{Kind: ReviewKeep, Reason: "still true, used last week"})
	ok("[DELETE] duplicate of the cat fact", ReviewStep{Kind: ReviewDelete, Reason: "duplicate of the cat fact"})
	ok("[SEARCH:cat name Tom]", ReviewStep{Kind: ReviewSearch, Keywords: "cat name Tom"})
	ok("\r\n[SEARCH: lisbon ]\r\n", ReviewStep{Kind: ReviewSearch, Keywords: "lisbon"})
	for _, bad := range []string{
		"", "   ", "PROMOTE", "[promote]", "[Keep]", "[MERGE]", "[ARCHIVE] x", "[PROMOTE", "[]",
		"I think [KEEP]", "Reasoning: it is fine.\n[KEEP]", "[KEEP]\n[DELETE]", "[KEEP] [DELETE]",
		"[PROMOTE][DELETE]", "[KEEP] then [SEARCH:x]", "[SEARCH:x] [KEEP]", "[SEARCH:x]\n[KEEP]",
		"[SEARCH:x] more", "[SEARCH:]", "[SEARCH:  ]", "[SEARCH:a[b]", "[KEEP]reason", "[KEEP] a\x1b[2J",
		"[KEEP] right\u202eleft", "[KEEP] line\u2028two", "[DELETE] bad \xff", "[KEEP] " + strings.Repeat("x", 301),
		"[SEARCH:" + strings.Repeat("k", 201) + "]", strings.Repeat(" ", 3000) + "[KEEP]", "[SKIP]", "[DELETE:fact-1]",
	} {
		if st, err := ParseReview(bad); err == nil || !errors.Is(err, memerr.ErrInvalid) {
			t.Errorf("ParseReview(%q) = %+v, %v; want an ErrInvalid error", bad, st, err)
		}
	}
}

// render writes a step back in the form ParseReview accepts.
func (st ReviewStep) render() string {
	if st.Kind == ReviewSearch {
		return "[SEARCH:" + st.Keywords + "]"
	}
	s := "[" + strings.ToUpper(st.Kind) + "]"
	if st.Reason != "" {
		s += " " + st.Reason
	}
	return s
}

// FuzzParseReview: whatever the model answers, the parser never panics,
// accepts only one well-formed step whose texts are safe, and a step
// renders back to an answer that parses to itself.
func FuzzParseReview(f *testing.F) {
	for _, s := range []string{"[PROMOTE]", "[KEEP] fine", "[DELETE] dup", "[SEARCH:cat]", "[KEEP]\n[DELETE]",
		"[SEARCH:x] [KEEP]", "[KEEP] \u202e", "x [KEEP]", "[", "]", "[SEARCH:[KEEP]]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		st, err := ParseReview(in)
		if err != nil {
			if !errors.Is(err, memerr.ErrInvalid) {
				t.Fatalf("error %v does not wrap memerr.ErrInvalid", err)
			}
			return
		}
		switch st.Kind {
		case ReviewPromote, ReviewKeep, ReviewDelete:
			if st.Keywords != "" {
				t.Fatalf("verdict with keywords: %+v", st)
			}
		case ReviewSearch:
			if st.Keywords == "" || st.Reason != "" {
				t.Fatalf("bad search %+v", st)
			}
		default:
			t.Fatalf("unknown kind %+v", st)
		}
		for _, txt := range []string{st.Keywords, st.Reason} {
			if strings.ContainsAny(txt, "[]\n\r") || len(txt) > MaxReviewReason {
				t.Fatalf("unsafe text %q", txt)
			}
			for _, r := range txt {
				if sanitize.Unsafe(r) {
					t.Fatalf("unsafe rune %U in %q", r, txt)
				}
			}
		}
		again, err := ParseReview(st.render())
		if err != nil || again != st {
			t.Fatalf("%+v renders to %q which parses to %+v, %v", st, st.render(), again, err)
		}
	})
}

// FuzzParseToolContext: a condensed context is either dropped with
// memerr.ErrInvalid or short, single-line, safe and tag-free.
func FuzzParseToolContext(f *testing.F) {
	for _, s := range []string{"get_weather said sunny.", "[SKIP]", "a\nb", "[DELETE:x]", "\u202e", strings.Repeat("x", 500)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseToolContext(in, 400)
		if err != nil {
			if got != "" || !errors.Is(err, memerr.ErrInvalid) {
				t.Fatalf("%q, %v", got, err)
			}
			return
		}
		if len(got) > 400 || strings.ContainsAny(got, "\n\r") || strings.Contains(strings.ToUpper(got), "[DELETE") {
			t.Fatalf("unsafe context %q", got)
		}
		for _, r := range got {
			if sanitize.Unsafe(r) {
				t.Fatalf("unsafe rune %U in %q", r, got)
			}
		}
	})
}
