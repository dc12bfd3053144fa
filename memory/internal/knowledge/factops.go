package knowledge

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// FactOpKind is the kind of a memory operation produced by the Extractor.
type FactOpKind uint8

const (
	FactAdd    FactOpKind = iota + 1 // [ADD] text
	FactUpdate                       // [UPDATE:id] text
	FactBoost                        // [BOOST:id]
	FactDelete                       // [DELETE:id]
	FactSkip                         // [SKIP]
)

func (k FactOpKind) String() string {
	switch k {
	case FactAdd:
		return "ADD"
	case FactUpdate:
		return "UPDATE"
	case FactBoost:
		return "BOOST"
	case FactDelete:
		return "DELETE"
	case FactSkip:
		return "SKIP"
	}
	return fmt.Sprintf("FactOpKind(%d)", uint8(k))
}

// FactOp is one parsed memory operation. ID is set for UPDATE, BOOST and
// DELETE; Text for ADD and UPDATE.
type FactOp struct {
	Kind FactOpKind
	ID   string
	Text string
}

// String renders the operation in the form ParseFactOps accepts.
func (op FactOp) String() string {
	switch op.Kind {
	case FactAdd:
		return "[ADD] " + op.Text
	case FactUpdate:
		return "[UPDATE:" + op.ID + "] " + op.Text
	case FactBoost, FactDelete:
		return "[" + op.Kind.String() + ":" + op.ID + "]"
	case FactSkip:
		return "[SKIP]"
	}
	return op.Kind.String()
}

// Limits of the fact-operation parser.
const (
	MaxFactBytes     = 500      // text of one fact
	maxFactLineBytes = 1024     // one line of the reply
	maxFactOutput    = 64 << 10 // the reply; the rest is rejected unread
	maxFactOps       = 32       // operations per reply
	maxFactIDLen     = 64
)

// ParseFactOps parses an Extractor's reply strictly: one operation per
// line, exactly "[ADD] text", "[UPDATE:id] text", "[BOOST:id]",
// "[DELETE:id]" or "[SKIP]" (surrounding spaces and blank lines allowed).
// Ids are 1–64 characters of [a-z0-9-]; texts are 1–500 bytes of valid
// UTF-8 without control, format (zero-width, bidi) or line-separator
// characters and without anything that looks like another operation.
// Every other line — malformed, too long, hostile, beyond 32 operations or
// 64 KiB — is rejected with an error (wrapping memerr.ErrInvalid) and skipped; it
// never stops the valid ones. Whether an id exists is for the caller.
func ParseFactOps(out string) (ops []FactOp, rejected []error) {
	ops, _, rejected = ParseFactOpsNumbered(out)
	return ops, rejected
}

// ParseFactOpsNumbered is ParseFactOps that also gives, for each op, the
// ordinal of its line among the reply's "[ADD" lines (0 for other kinds),
// rejected lines counted: the n a triple's "+n" support names.
func ParseFactOpsNumbered(out string) (ops []FactOp, addN []int, rejected []error) {
	type numbered struct {
		op FactOp
		n  int
	}
	k := 0
	got, rejected := ParseLines(out, "fact ops", "operations", maxFactOps, func(line string) (numbered, error) {
		n := 0
		if strings.HasPrefix(line, "[ADD") {
			k++
			n = k
		}
		op, err := parseFactOp(line)
		return numbered{op, n}, err
	})
	ops, addN = make([]FactOp, len(got)), make([]int, len(got))
	for i, g := range got {
		ops[i], addN[i] = g.op, g.n
	}
	return ops, addN, rejected
}

// ParseLines is the strict line parser of model replies: at most
// maxFactOutput bytes read, blank lines skipped, each other line parsed
// alone; a line parse rejects, or one beyond limit, is an error wrapping
// memerr.ErrInvalid and never stops the others.
func ParseLines[T any](out, what, items string, limit int, parse func(string) (T, error)) (got []T, rejected []error) {
	if len(out) > maxFactOutput {
		rejected = append(rejected, fmt.Errorf("%w: %s: reply of %d bytes, only the first %d read", memerr.ErrInvalid, what, len(out), maxFactOutput))
		out = out[:maxFactOutput]
	}
	n := 0
	for line := range strings.Lines(out) {
		n++
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		v, err := parse(line)
		if err == nil && len(got) == limit {
			err = fmt.Errorf("more than %d %s", limit, items)
		}
		if err != nil {
			rejected = append(rejected, fmt.Errorf("%w: %s: line %d: %v: %q", memerr.ErrInvalid, what, n, err, sanitize.Truncate(line, 80)))
			continue
		}
		got = append(got, v)
	}
	return got, rejected
}

func parseFactOp(line string) (FactOp, error) {
	if len(line) > maxFactLineBytes {
		return FactOp{}, fmt.Errorf("line of %d bytes", len(line))
	}
	if !utf8.ValidString(line) {
		return FactOp{}, fmt.Errorf("invalid UTF-8")
	}
	if line[0] != '[' {
		return FactOp{}, fmt.Errorf("not an operation")
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return FactOp{}, fmt.Errorf("unterminated tag")
	}
	tag, rest := line[1:end], line[end+1:]
	name, id, hasID := strings.Cut(tag, ":")
	var op FactOp
	switch name {
	case "ADD":
		op.Kind = FactAdd
	case "UPDATE":
		op.Kind = FactUpdate
	case "BOOST":
		op.Kind = FactBoost
	case "DELETE":
		op.Kind = FactDelete
	case "SKIP":
		op.Kind = FactSkip
	default:
		return FactOp{}, fmt.Errorf("unknown operation")
	}
	needID := op.Kind == FactUpdate || op.Kind == FactBoost || op.Kind == FactDelete
	if hasID != needID {
		return FactOp{}, fmt.Errorf("%s takes %s id", op.Kind, map[bool]string{true: "an", false: "no"}[needID])
	}
	if needID {
		if err := ValidFactID(id); err != nil {
			return FactOp{}, err
		}
		op.ID = id
	}
	if op.Kind == FactAdd || op.Kind == FactUpdate {
		if rest == "" || rest[0] != ' ' {
			return FactOp{}, fmt.Errorf("%s needs a space and a text", op.Kind)
		}
		op.Text = strings.TrimSpace(rest)
		if err := ValidFactText(op.Text); err != nil {
			return FactOp{}, err
		}
		return op, nil
	}
	if strings.TrimSpace(rest) != "" {
		return FactOp{}, fmt.Errorf("%s takes no text", op.Kind)
	}
	return op, nil
}

func ValidFactID(id string) error {
	if id == "" || len(id) > maxFactIDLen {
		return fmt.Errorf("id of %d bytes", len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("bad character in id")
		}
	}
	return nil
}

// opMarkers are what a fact text may not contain: a model tricked into
// smuggling a second operation into a text must not get it stored either.
var opMarkers = []string{"[ADD", "[UPDATE", "[BOOST", "[DELETE", "[SKIP", "[TRIPLE"}

func ValidFactText(t string) error { return ValidFactTextMax(t, MaxFactBytes) }

// ValidFactTextMax is ValidFactText for texts of at most maxBytes.
func ValidFactTextMax(t string, maxBytes int) error {
	if t == "" {
		return fmt.Errorf("empty text")
	}
	if len(t) > maxBytes {
		return fmt.Errorf("text of %d bytes (max %d)", len(t), maxBytes)
	}
	if !utf8.ValidString(t) {
		return fmt.Errorf("invalid UTF-8")
	}
	for _, r := range t {
		if sanitize.Unsafe(r) {
			return fmt.Errorf("control or format character %U", r)
		}
	}
	upper := strings.ToUpper(t)
	for _, m := range opMarkers {
		if strings.Contains(upper, m) {
			return fmt.Errorf("text contains an operation marker")
		}
	}
	return nil
}
