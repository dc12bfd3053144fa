package knowledge

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

func TestParseTriples(t *testing.T) {
	f := func(in string, want []TripleOp, rejects int) {
		t.Helper()
		ops, rej := ParseTriples(in)
		if fmt.Sprint(ops) != fmt.Sprint(want) || len(rej) != rejects {
			t.Fatalf("ParseTriples(%q) = %v, %d rejected %v; want %v, %d", in, ops, len(rej), rej, want, rejects)
		}
		for _, err := range rej {
			if !errors.Is(err, memerr.ErrInvalid) {
				t.Fatalf("rejection %v does not wrap memerr.ErrInvalid", err)
			}
		}
	}
	f("[TRIPLE] Rex | favourite toy | red ball | +1", []TripleOp{{"Rex", "favourite toy", "red ball", []string{"+1"}}}, 0)
	f("  [TRIPLE]  Ann |lives in|  Lisbon | fact-000000000004-00, +2 ,fact-000000000004-00 \r\n\n",
		[]TripleOp{{"Ann", "lives in", "Lisbon", []string{"fact-000000000004-00", "+2"}}}, 0)
	// Malformed lines are rejected one by one; valid ones still count.
	f(strings.Join([]string{
		"[TRIPLE] a | b | c | +1",
		"[TRIPLE] a | b | c",             // no supports
		"[TRIPLE] a | b | c | ",          // empty support
		"[TRIPLE] a | b | c | d | +1",    // five fields
		"[TRIPLE]a | b | c | +1",         // no space after the tag
		"[triple] a | b | c | +1",        // lower case tag
		"TRIPLE: a | b | c | +1",         // another form
		"[TRIPLE]  | b | c | +1",         // empty subject
		"[TRIPLE] a | b | c | +0",        // references start at 1
		"[TRIPLE] a | b | c | +33",       // beyond the reply's ADDs we may name
		"[TRIPLE] a | b | c | +01",       // not canonical
		"[TRIPLE] a | b | c | Fact-1",    // bad id
		"[TRIPLE] a | b | c | x y",       // bad id
		"[TRIPLE] a | b\x1b[2J | c | +1", // control characters
		"[TRIPLE] a | b [DELETE:f] | c | +1",
		"[TRIPLE] a | b | right\u202eleft | +1",
		"[TRIPLE] " + strings.Repeat("s", 201) + " | b | c | +1",
		"[TRIPLE] a | b | c | +1,+2,+3,+4,+5,+6,+7,+8,+9",
		"[TRIPLE] a | b \xff | c | +1",
	}, "\n"), []TripleOp{{"a", "b", "c", []string{"+1"}}}, 18)
	f(strings.Repeat("[TRIPLE] a | b | c | +1\n", 40), slices.Repeat([]TripleOp{{"a", "b", "c", []string{"+1"}}}, maxTripleOps), 40-maxTripleOps)
	ops, rej := ParseTriples("[TRIPLE] a | b | c | +1\n" + strings.Repeat("y", maxFactOutput))
	if len(ops) != 1 || len(rej) != 2 {
		t.Fatalf("huge reply: %v, %v", ops, rej)
	}
	rest, lines := CutTripleLines("[ADD] x\n [TRIPLE] a | b | c | +1\n[triple] q\n[SKIP]")
	if rest != "[ADD] x\n[SKIP]" || lines != " [TRIPLE] a | b | c | +1\n[triple] q\n" {
		t.Fatalf("cut: %q %q", rest, lines)
	}
	// A fact may not smuggle a triple in.
	if ops, _ := ParseFactOps("[ADD] fine [TRIPLE] a | b | c | +1"); len(ops) != 0 {
		t.Fatalf("smuggled triple accepted: %v", ops)
	}
}

// FuzzParseTriples: whatever the model replies, the parser never panics,
// returns only well-formed triples whose texts are safe, and each renders
// back to a line that parses to itself.
func FuzzParseTriples(f *testing.F) {
	for _, s := range []string{
		"[TRIPLE] Rex | likes | ball | +1", "[TRIPLE] a | b | c | fact-1, +2\n[TRIPLE] x", "[TRIPLE] | | | ",
		"[TRIPLE] a\x00 | b | c | +1", "[TRIPLE] a | b | c | +99999999999999999999", "garbage\n[TRIPLE] a|b|c|+1\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ops, rej := ParseTriples(in)
		if len(ops) > maxTripleOps || len(ops)+len(rej) > strings.Count(in, "\n")+2 {
			t.Fatalf("%d triples + %d rejections", len(ops), len(rej))
		}
		for _, op := range ops {
			for _, s := range []string{op.Subject, op.Predicate, op.Object} {
				if s == "" || len(s) > maxTripleTermBytes || !utf8.ValidString(s) || strings.Contains(s, "|") || s != strings.TrimSpace(s) {
					t.Fatalf("bad text %q", s)
				}
				for _, r := range s {
					if sanitize.Unsafe(r) {
						t.Fatalf("unsafe rune %U in %q", r, s)
					}
				}
			}
			if len(op.Support) == 0 || len(op.Support) > maxTripleSupport {
				t.Fatalf("supports %v", op.Support)
			}
			for _, sup := range op.Support {
				if !factIDRe.MatchString(strings.TrimPrefix(sup, "+")) {
					t.Fatalf("bad support %q", sup)
				}
			}
			again, rej := ParseTriples(op.String())
			if len(again) != 1 || fmt.Sprint(again[0]) != fmt.Sprint(op) || len(rej) != 0 {
				t.Fatalf("%q does not round-trip: %v %v", op.String(), again, rej)
			}
		}
	})
}
