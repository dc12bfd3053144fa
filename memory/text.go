package memory

import (
	"hash/maphash"
	"math"
	"slices"
	"strings"

	"github.com/kvsidecar/kvsidecar/index"
)

// bow is a bag of words: hashed terms (index.AppendTokens), sorted, with counts, for
// cosine similarity by merge. Built once per message or unit and cached.
type bow struct {
	terms  []uint64
	counts []float32
	norm   float64
}

var termSeed = maphash.MakeSeed()

// makeBow builds the bag of text's terms as package index makes them (one
// tokenizer and stopword list for scoring, keyword recall and the index):
// lower case, stopwords dropped, English words stemmed, CJK as bigrams.
func makeBow(text string) *bow {
	toks := index.AppendTokens(nil, text)
	hs := make([]uint64, len(toks))
	for i, w := range toks {
		hs[i] = maphash.String(termSeed, w)
	}
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

// bowCovered is the share of q's distinct terms that b holds, 0 when q is
// empty.
func bowCovered(q, b *bow) float64 {
	if q == nil || b == nil || len(q.terms) == 0 {
		return 0
	}
	n := 0
	i, j := 0, 0
	for i < len(q.terms) && j < len(b.terms) {
		switch x, y := q.terms[i], b.terms[j]; {
		case x < y:
			i++
		case x > y:
			j++
		default:
			n++
			i++
			j++
		}
	}
	return float64(n) / float64(len(q.terms))
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
