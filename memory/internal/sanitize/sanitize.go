package sanitize

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Unsafe reports control, format (zero-width, bidi override) and line or
// paragraph separator characters.
func Unsafe(r rune) bool {
	return r == utf8.RuneError || unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// Text makes model or operator text safe to store and inject: valid UTF-8,
// unsafe characters and runs of white space folded into one space, at most
// maxBytes.
func Text(s string, maxBytes int) string {
	s = strings.ToValidUTF8(s, " ")
	s = strings.Map(func(r rune) rune {
		if Unsafe(r) {
			return ' '
		}
		return r
	}, s)
	return Truncate(strings.Join(strings.Fields(s), " "), maxBytes)
}

// Truncate cuts s to at most n bytes on a rune boundary, adding "…".
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
