package memory

import (
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// bow is a bag of words: hashed lower-case terms, sorted, with counts, for
// cosine similarity by merge. Built once per message or unit and cached.
type bow struct {
	terms  []uint64
	counts []float32
	norm   float64
}

var termSeed = maphash.MakeSeed()

var stopwords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`a an and are as at be but by can could did do does for from had has have he her
	his how i if in into is it its me my no not of on or our she so than that the their them then there these they
	this to too us was we were what when where which who why will with would you your yes ok okay please just about
	also any all some more most very`) {
		m[w] = true
	}
	return m
}()

// words calls fn for each lower-case word of text that is not a stopword.
func words(text string, fn func(w string)) {
	var buf [64]byte
	w := buf[:0]
	flush := func() {
		if len(w) >= 2 && len(w) <= 40 {
			if s := string(w); !stopwords[s] {
				fn(s)
			}
		}
		w = w[:0]
	}
	for _, r := range text {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			w = utf8.AppendRune(w, unicode.ToLower(r))
			continue
		}
		flush()
	}
	flush()
}

func makeBow(text string) *bow {
	var hs []uint64
	words(text, func(w string) { hs = append(hs, maphash.String(termSeed, w)) })
	slices.Sort(hs)
	b := &bow{}
	for i, h := range hs {
		if i > 0 && hs[i-1] == h {
			b.counts[len(b.counts)-1]++
			continue
		}
		b.terms = append(b.terms, h)
		b.counts = append(b.counts, 1)
	}
	for _, c := range b.counts {
		b.norm += float64(c) * float64(c)
	}
	b.norm = math.Sqrt(b.norm)
	return b
}

// cosine is the cosine similarity of two bags, 0 when either is empty.
func cosine(a, b *bow) float64 {
	if a == nil || b == nil || a.norm == 0 || b.norm == 0 {
		return 0
	}
	dot := 0.0
	i, j := 0, 0
	for i < len(a.terms) && j < len(b.terms) {
		switch x, y := a.terms[i], b.terms[j]; {
		case x < y:
			i++
		case x > y:
			j++
		default:
			dot += float64(a.counts[i]) * float64(b.counts[j])
			i++
			j++
		}
	}
	return dot / (a.norm * b.norm)
}

var emphasisMarkers = []string{
	"important", "remember", "don't forget", "do not forget", "must", "never", "always",
	"make sure", "keep in mind", "note:", "critical", "crucial", "essential", "required",
}

// emphasis scores how much the user stressed a message, in [0, 1]: half
// for being the user's own words, half for explicit markers ("important",
// "remember", "!!", words in capitals).
func emphasis(m *Message) float64 {
	e := 0.0
	if m.Role == "user" {
		e += 0.5
	}
	lower := strings.ToLower(m.Content)
	marked := strings.Contains(m.Content, "!!")
	for _, k := range emphasisMarkers {
		if marked {
			break
		}
		marked = strings.Contains(lower, k)
	}
	if !marked {
		caps := 0
		for _, f := range strings.Fields(m.Content) {
			if len(f) >= 3 && strings.ToUpper(f) == f && strings.ToLower(f) != f {
				caps++
			}
		}
		marked = caps >= 2
	}
	if marked {
		e += 0.5
	}
	return e
}

// structure scores content that is costly to lose because it is exact: code,
// tool calls and results, lists, headings, tables. In [0, 1].
func structure(m *Message) float64 {
	s := 0.0
	if strings.Contains(m.Content, "```") {
		s += 0.5
	}
	if m.hasToolCalls() || m.Role == "tool" || m.Role == "function" {
		s += 0.5
	}
	lists, heads, tables := 0, 0, 0
	for line := range strings.Lines(m.Content) {
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "- "), strings.HasPrefix(t, "* "), len(t) > 2 && t[0] >= '0' && t[0] <= '9' && (t[1] == '.' || t[1] == ')'):
			lists++
		case strings.HasPrefix(t, "#"):
			heads++
		case strings.HasPrefix(t, "|"):
			tables++
		}
	}
	if lists >= 2 {
		s += 0.25
	}
	if heads > 0 || tables >= 2 {
		s += 0.25
	}
	return min(s, 1)
}

// truncateRunes cuts s to at most n bytes on a rune boundary, adding "…".
func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
