package workload

import (
	"strings"
	"unicode"

	"github.com/kvsidecar/kvsidecar/index"
)

// The recall benchmark's graph column needs triples for every LoCoMo turn,
// and no model runs in the benchmark. LocomoLinks is a deterministic,
// rule-based stand-in for the background model's triple extraction, used
// ONLY by this benchmark: what it measures is the graph retriever and its
// fusion given plausible triples, not the quality of a model's extraction.

// recallGraphVariant is the hybrid search with the entity graph attached.
const recallGraphVariant = "hybrid+graph"

// locomoSkipCaps are capitalised words that are no entity at a sentence's
// start or anywhere (pronouns, greetings, fillers).
var locomoSkipCaps = map[string]bool{
	"I": true, "I'm": true, "I've": true, "I'll": true, "I'd": true, "Hey": true, "Hi": true, "Hello": true, "Wow": true,
	"Thanks": true, "Thank": true, "Yes": true, "Yeah": true, "No": true, "Oh": true, "Ok": true, "Okay": true, "Sure": true,
	"That's": true, "It's": true, "What": true, "How": true, "Why": true, "When": true, "Where": true, "Who": true,
	"The": true, "A": true, "An": true, "And": true, "But": true, "So": true, "My": true, "We": true, "You": true,
	"It": true, "That": true, "This": true, "Those": true, "These": true, "Do": true, "Did": true, "Have": true,
	"Glad": true, "Good": true, "Great": true, "Awesome": true, "Definitely": true, "Absolutely": true, "Totally": true,
}

// locomoFiller are words skipped between a verb and its object.
var locomoFiller = map[string]bool{"a": true, "an": true, "the": true, "to": true, "some": true, "my": true, "our": true,
	"really": true, "just": true, "also": true, "been": true, "in": true, "on": true, "at": true, "for": true, "about": true,
	"into": true, "with": true, "out": true, "up": true, "this": true, "that": true, "it": true, "so": true}

// LocomoLinks extracts triples from one turn by rules, each supported by
// the turn: (speaker, mentions, a capitalised name of the text), (speaker,
// has, the word after "my"), and (speaker, verb, the next one or two
// content words) after "I <verb>".
func LocomoLinks(t LocomoTurn) []index.Link {
	if t.Speaker == "" {
		return nil
	}
	var out []index.Link
	add := func(p, o string) {
		o = strings.TrimSpace(o)
		if o != "" && !strings.EqualFold(o, t.Speaker) {
			out = append(out, index.Link{Subject: t.Speaker, Predicate: p, Object: o, Docs: []string{t.DiaID}})
		}
	}
	text := t.Text
	if t.BlipCaption != "" {
		text += ". " + t.BlipCaption
	}
	for sent := range strings.FieldsFuncSeq(text, func(r rune) bool { return r == '.' || r == '!' || r == '?' || r == ';' }) {
		words := strings.Fields(sent)
		clean := make([]string, len(words))
		for i, w := range words {
			clean[i] = strings.TrimFunc(w, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '\'' })
		}
		// Capitalised names: runs of capitalised words.
		for i := 0; i < len(clean); i++ {
			if !locomoCap(clean[i]) {
				continue
			}
			j := i
			for j < len(clean) && locomoCap(clean[j]) && j-i < 3 {
				j++
			}
			add("mentions", strings.Join(clean[i:j], " "))
			i = j - 1
		}
		for i, w := range clean {
			lw := strings.ToLower(w)
			switch {
			case lw == "my" && i+1 < len(clean):
				add("has", clean[i+1])
			case w == "I" && i+1 < len(clean):
				verb := strings.ToLower(clean[i+1])
				var obj []string
				for _, o := range clean[i+2 : min(len(clean), i+7)] {
					lo := strings.ToLower(o)
					if lo == "" {
						break
					}
					if locomoFiller[lo] {
						if len(obj) > 0 {
							break
						}
						continue
					}
					obj = append(obj, o)
					if len(obj) == 2 {
						break
					}
				}
				if len(obj) > 0 {
					add(verb, strings.Join(obj, " "))
				}
			}
		}
	}
	return out
}

// locomoCap reports a capitalised word that may name an entity.
func locomoCap(w string) bool {
	if w == "" || locomoSkipCaps[w] {
		return false
	}
	r := []rune(w)
	return unicode.IsUpper(r[0]) && len(r) > 1
}
