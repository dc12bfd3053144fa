package index

import (
	"unicode"
	"unicode/utf8"
)

// maxTokenBytes bounds one token: longer runs of letters are cut, so hostile
// input (a megabyte without spaces) costs linear time and bounded memory.
const maxTokenBytes = 64

// tokenize returns the index terms of text: see AppendTokens.
func tokenize(text string) []string { return AppendTokens(nil, text) }

// Tokenize returns the terms the index makes of text (see AppendTokens). It
// is the one text tokenizer of the sidecar: package memory scores and
// recalls with the same terms the index ranks by.
func Tokenize(text string) []string { return AppendTokens(nil, text) }

// AppendTokens appends the index terms of text to dst and returns it. Its
// cost is linear in len(text) and its memory bounded by the terms produced.
//
// Terms are produced the same way for documents and queries:
//   - letters, digits and combining marks form words, lower-cased; apostrophes
//     inside a word are dropped ("don't" → "dont") and a possessive "'s" is
//     removed ("Caroline's" → "caroline");
//   - English stopwords are dropped, then pure-ASCII words are reduced to
//     their Porter stem ("camping" → "camp");
//   - runs of CJK characters (Han, Hiragana, Katakana, Hangul), which are
//     written without spaces, become overlapping character bigrams
//     ("北京大学" → "北京" "京大" "大学"); a lone CJK character is one term;
//   - everything else (punctuation, symbols, spaces, invalid UTF-8)
//     separates terms.
//
// Words longer than maxTokenBytes bytes are truncated there.
func AppendTokens(dst []string, text string) []string {
	var word [maxTokenBytes + utf8.UTFMax]byte
	n := 0 // bytes used in word
	flush := func() {
		if n == 0 {
			return
		}
		w := string(word[:n])
		n = 0
		if isStopword(w) {
			return
		}
		dst = append(dst, stem(w))
	}
	var cjkPrev rune  // previous rune of the current CJK run, 0 when none
	cjkSingle := true // the current CJK run has one character so far
	endCJK := func() {
		if cjkPrev != 0 && cjkSingle {
			dst = append(dst, string(cjkPrev))
		}
		cjkPrev = 0
		cjkSingle = true
	}
	for i := 0; i < len(text); {
		r, size := utf8.DecodeRuneInString(text[i:])
		i += size
		switch {
		case r == utf8.RuneError && size <= 1:
			flush()
			endCJK()
		case isCJK(r):
			flush()
			if cjkPrev != 0 {
				var b [2 * utf8.UTFMax]byte
				m := utf8.EncodeRune(b[:], cjkPrev)
				m += utf8.EncodeRune(b[m:], r)
				dst = append(dst, string(b[:m]))
				cjkSingle = false
			}
			cjkPrev = r
		case unicode.IsLetter(r) || unicode.IsDigit(r) || (n > 0 && unicode.Is(unicode.Mn, r)):
			endCJK()
			if n < maxTokenBytes {
				n += utf8.EncodeRune(word[n:], unicode.ToLower(r))
			}
		case (r == '\'' || r == '’') && n > 0:
			// Inside a word: drop it; drop a possessive "s" after it too.
			if i < len(text) && (text[i] == 's' || text[i] == 'S') {
				next, _ := utf8.DecodeRuneInString(text[i+1:])
				if i+1 == len(text) || !(unicode.IsLetter(next) || unicode.IsDigit(next)) {
					i++
				}
			}
		default:
			flush()
			endCJK()
		}
	}
	flush()
	endCJK()
	return dst
}

// isCJK reports whether r belongs to a script written without spaces between
// words, which the tokenizer splits into character bigrams.
func isCJK(r rune) bool {
	if r < 0x2E80 {
		return false
	}
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}
