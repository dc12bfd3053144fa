package knowledge

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// Review decisions.
const (
	ReviewPromote   = "promote"   // the fact became core
	ReviewKeep      = "keep"      // importance reset to Reviewer.DemoteBelow
	ReviewDelete    = "delete"    // the fact was deleted
	ReviewMalformed = "malformed" // the model's answer broke the format: nothing changed
	ReviewUndecided = "undecided" // no verdict within MaxRounds: nothing changed
	ReviewStale     = "stale"     // the fact changed meanwhile: the verdict was not applied
)

// Review answers: a verdict or a search.
const (
	ReviewSearch = "search"
)

// ReviewStep is one parsed answer of the reviewer's model. Kind is
// ReviewPromote, ReviewKeep, ReviewDelete (Reason: the model's, possibly
// empty) or ReviewSearch (Keywords).
type ReviewStep struct {
	Kind     string
	Keywords string
	Reason   string
}

// Limits of the review parser.
const (
	maxReviewOutput     = 2048 // the whole answer
	MaxReviewReason     = 300
	maxReviewKeywords   = 200
	MaxReviewShownBytes = 300 // one search hit shown to the model
)

// ParseReview parses one answer of the reviewer's model strictly: after
// trimming white space it must be exactly one line, and that line exactly
// one of "[PROMOTE]", "[KEEP]" or "[DELETE]", each optionally followed by a
// space and a reason (1–300 bytes, no brackets, no control or format
// characters), or "[SEARCH:keywords]" with nothing after it (keywords:
// 1–200 bytes, no brackets, no control or format characters). Anything
// else — other text, a second line, two tags, a verdict with a search, an
// unknown or lower-case tag, more than 2 KiB — is an error wrapping
// memerr.ErrInvalid.
func ParseReview(out string) (ReviewStep, error) {
	bad := func(format string, a ...any) (ReviewStep, error) {
		return ReviewStep{}, fmt.Errorf("%w: review: "+format, append([]any{memerr.ErrInvalid}, a...)...)
	}
	if len(out) > maxReviewOutput {
		return bad("answer of %d bytes", len(out))
	}
	if !utf8.ValidString(out) {
		return bad("invalid UTF-8")
	}
	line := strings.TrimSpace(out)
	if line == "" {
		return bad("empty answer")
	}
	if strings.ContainsAny(line, "\r\n\u2028\u2029") {
		return bad("more than one line")
	}
	if line[0] != '[' {
		return bad("does not start with a tag: %q", sanitize.Truncate(line, 80))
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return bad("unterminated tag")
	}
	tag, rest := line[1:end], line[end+1:]
	if kw, ok := strings.CutPrefix(tag, "SEARCH:"); ok {
		if rest != "" {
			return bad("text after a search")
		}
		kw = strings.TrimSpace(kw)
		if err := reviewText(kw, maxReviewKeywords); err != nil {
			return bad("keywords: %v", err)
		}
		return ReviewStep{Kind: ReviewSearch, Keywords: kw}, nil
	}
	var st ReviewStep
	switch tag {
	case "PROMOTE":
		st.Kind = ReviewPromote
	case "KEEP":
		st.Kind = ReviewKeep
	case "DELETE":
		st.Kind = ReviewDelete
	default:
		return bad("unknown tag %q", sanitize.Truncate(tag, 40))
	}
	if rest != "" {
		if rest[0] != ' ' {
			return bad("%s needs a space before its reason", tag)
		}
		st.Reason = strings.TrimSpace(rest)
		if err := reviewText(st.Reason, MaxReviewReason); err != nil {
			return bad("reason: %v", err)
		}
	}
	return st, nil
}

// reviewText checks keywords or a reason.
func reviewText(t string, maxBytes int) error {
	if t == "" {
		return errors.New("empty")
	}
	if len(t) > maxBytes {
		return fmt.Errorf("%d bytes (max %d)", len(t), maxBytes)
	}
	if strings.ContainsAny(t, "[]") {
		return errors.New("contains a bracket (a second tag?)")
	}
	for _, r := range t {
		if sanitize.Unsafe(r) {
			return fmt.Errorf("control or format character %U", r)
		}
	}
	return nil
}
