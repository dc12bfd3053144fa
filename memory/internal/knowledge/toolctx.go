package knowledge

import (
	"fmt"
	"strings"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// toolCtxMarkers are the tags a condensed context may not contain.
var toolCtxMarkers = append([]string{"[SEARCH", "[PROMOTE", "[KEEP"}, opMarkers...)

// ToolCtxHeader introduces the condensed context in the recall block.
const ToolCtxHeader = "From the tools used in the previous turn: "

// ParseToolContext checks a condensing answer: "[SKIP]" is nothing ("",
// nil); otherwise the text, sanitized (valid UTF-8, control and format
// characters and runs of white space folded into one space), must be
// non-empty, at most maxBytes, and free of memory-operation tags. Anything
// else is an error wrapping memerr.ErrInvalid: the answer is dropped, never cut.
func ParseToolContext(out string, maxBytes int) (string, error) {
	if len(out) > 4*maxBytes {
		return "", fmt.Errorf("%w: tool context: answer of %d bytes (max %d)", memerr.ErrInvalid, len(out), maxBytes)
	}
	t := sanitize.Text(out, 4*maxBytes)
	if t == "[SKIP]" {
		return "", nil
	}
	if t == "" {
		return "", fmt.Errorf("%w: tool context: empty answer", memerr.ErrInvalid)
	}
	if len(t) > maxBytes {
		return "", fmt.Errorf("%w: tool context: %d bytes (max %d)", memerr.ErrInvalid, len(t), maxBytes)
	}
	upper := strings.ToUpper(t)
	for _, m := range toolCtxMarkers {
		if strings.Contains(upper, m) {
			return "", fmt.Errorf("%w: tool context: contains a tag %s]", memerr.ErrInvalid, m)
		}
	}
	return t, nil
}
