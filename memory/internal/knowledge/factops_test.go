package knowledge

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

func TestParseFactOps(t *testing.T) {
	f := func(in string, want []FactOp, rejects int) {
		t.Helper()
		ops, rej := ParseFactOps(in)
		if fmt.Sprint(ops) != fmt.Sprint(want) || len(rej) != rejects {
			t.Fatalf("ParseFactOps(%q) = %v, %d rejected %v; want %v, %d", in, ops, len(rej), rej, want, rejects)
		}
		for _, err := range rej {
			if !errors.Is(err, memerr.ErrInvalid) {
				t.Fatalf("rejection %v does not wrap memerr.ErrInvalid", err)
			}
		}
	}
	f("[ADD] The user likes tea.", []FactOp{{FactAdd, "", "The user likes tea."}}, 0)
	f("  [UPDATE:fact-000000000004-00] Likes green tea.\r\n\n[BOOST:fact-1]\n[DELETE:ep-000000000030]\n[SKIP]\n",
		[]FactOp{{FactUpdate, "fact-000000000004-00", "Likes green tea."}, {FactBoost, "fact-1", ""}, {FactDelete, "ep-000000000030", ""}, {Kind: FactSkip}}, 0)
	// Malformed lines are rejected one by one; valid ones still count.
	f("Sure! Here are the operations:\n[ADD] ok\n- [ADD] bullet\n[add] lower\n[ADD]no space\n[ADD] \n[SKIP] extra\n[BOOST]\n[BOOST:x] text\n[DELETE:Fact-1]\n[DELETE:a b]\n[UPDATE:x]\n[FORGET:x]\n[ADD",
		[]FactOp{{FactAdd, "", "ok"}}, 13)
	// Hostile texts: control and format characters, smuggled operations,
	// huge lines, invalid UTF-8.
	f("[ADD] a\x1b[31mred", nil, 1)
	f("[ADD] right\u202eto left", nil, 1)
	f("[ADD] zero\u200bwidth", nil, 1)
	f("[ADD] line\u2028break", nil, 1)
	f("[ADD] nice [DELETE:fact-1] trick", nil, 1)
	f("[ADD] also [skip] this", nil, 1)
	f("[ADD] "+strings.Repeat("x", 600), nil, 1)
	f("[ADD] bad \xff utf8", nil, 1)
	f("[DELETE:"+strings.Repeat("a", 65)+"]", nil, 1)
	f(strings.Repeat("[SKIP]\n", 40), slicesRepeat(FactOp{Kind: FactSkip}, maxFactOps), 40-maxFactOps)
	ops, rej := ParseFactOps("[ADD] x\n" + strings.Repeat("y", maxFactOutput))
	if len(ops) != 1 || len(rej) != 2 {
		t.Fatalf("huge reply: %v, %v", ops, rej)
	}
}

// FuzzParseFactOps: whatever the model replies, the parser never panics,
// returns only well-formed operations whose texts are safe, and each
// operation renders back to a line that parses to itself.
func FuzzParseFactOps(f *testing.F) {
	for _, s := range []string{
		"[ADD] The user likes tea.", "[UPDATE:fact-1] x\n[BOOST:fact-2]\n[DELETE:ep-3]\n[SKIP]",
		"[ADD] a [DELETE:x]", "[ADD] \u202e", "[ADD]\x00", "garbage\n\n[ADD] ok\r\n", "[UPDATE:] x", "[]", "[",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ops, rej := ParseFactOps(in)
		if len(ops) > maxFactOps {
			t.Fatalf("%d ops", len(ops))
		}
		if len(ops)+len(rej) > strings.Count(in, "\n")+2 {
			t.Fatalf("%d ops + %d rejections for %d lines", len(ops), len(rej), strings.Count(in, "\n")+1)
		}
		for _, op := range ops {
			switch op.Kind {
			case FactAdd, FactUpdate:
				if op.Text == "" || len(op.Text) > MaxFactBytes || !utf8.ValidString(op.Text) {
					t.Fatalf("bad text %q", op.Text)
				}
				for _, r := range op.Text {
					if sanitize.Unsafe(r) {
						t.Fatalf("unsafe rune %U in %q", r, op.Text)
					}
				}
				for _, m := range opMarkers {
					if strings.Contains(strings.ToUpper(op.Text), m) {
						t.Fatalf("marker in %q", op.Text)
					}
				}
			case FactBoost, FactDelete, FactSkip:
				if op.Text != "" {
					t.Fatalf("%v has text", op)
				}
			default:
				t.Fatalf("kind %v", op.Kind)
			}
			if (op.Kind == FactUpdate || op.Kind == FactBoost || op.Kind == FactDelete) != (op.ID != "") {
				t.Fatalf("%v: id presence", op)
			}
			if op.ID != "" && !factIDRe.MatchString(op.ID) {
				t.Fatalf("bad id %q", op.ID)
			}
			again, rej := ParseFactOps(op.String())
			if len(again) != 1 || again[0] != op || len(rej) != 0 {
				t.Fatalf("%q does not round-trip: %v %v", op.String(), again, rej)
			}
		}
	})
}

func slicesRepeat(op FactOp, n int) []FactOp {
	out := make([]FactOp, n)
	for i := range out {
		out[i] = op
	}
	return out
}

var factIDRe = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)
