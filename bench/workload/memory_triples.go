package workload

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// LocomoExtraction answers the sidecar's fact-extraction calls the way a
// model would with the knowledge base, by rule, so the memory benchmark can
// measure graph recall end to end (sidecar bench memory --triples): each
// LoCoMo turn of the prompt's new messages becomes "[ADD] <the turn's
// text>" and LocomoLinks' triples on it "+n". Like LocomoLinks it is a
// stand-in used ONLY by the benchmark: it measures the graph retriever and
// its fusion in the session and user scopes given plausible triples, not a
// model's extraction. Every other background call gets "[SKIP]".
func LocomoExtraction(convs []LocomoConversation) func(prompt string) string {
	turns := map[string]LocomoTurn{}
	speakers := map[string]bool{}
	for _, c := range convs {
		for _, t := range c.Turns {
			turns[strings.Join(strings.Fields(LocomoTurnText(t, true, true)), " ")] = t
			speakers[t.Speaker] = true
		}
	}
	return func(prompt string) string {
		_, msgs, ok := strings.Cut(prompt, "\nNew messages:\n")
		if !ok || !strings.Contains(prompt, "Known facts:") {
			return "[SKIP]"
		}
		msgs, _, _ = strings.Cut(msgs, "\n\nReply with memory operations")
		var adds, triples []string
		for line := range strings.Lines(msgs) {
			_, text, _ := strings.Cut(strings.TrimSpace(line), ": ")
			for _, piece := range splitSpeakers(text, speakers) {
				t, ok := turns[piece]
				if !ok || len(adds) == 32 {
					continue
				}
				if !plainText(piece, 500, false) {
					continue // a fact the store would reject would shift every "+n" after it
				}
				adds = append(adds, "[ADD] "+piece)
				for _, l := range LocomoLinks(t) {
					if len(triples) < 32 && plainText(l.Subject, 200, true) && plainText(l.Predicate, 200, true) && plainText(l.Object, 200, true) {
						triples = append(triples, fmt.Sprintf("[TRIPLE] %s | %s | %s | +%d", l.Subject, l.Predicate, l.Object, len(adds)))
					}
				}
			}
		}
		if len(adds) == 0 {
			return "[SKIP]"
		}
		return strings.Join(append(adds, triples...), "\n")
	}
}

// splitSpeakers cuts a prompt message (whitespace collapsed) into the
// turns it joins: each starts with "<speaker>: ".
func splitSpeakers(text string, speakers map[string]bool) []string {
	var out []string
	start := 0
	for i := 0; i < len(text); i++ {
		if i > 0 && text[i-1] != ' ' {
			continue
		}
		name, _, ok := strings.Cut(text[i:], ": ")
		if ok && i > start && speakers[name] {
			out = append(out, strings.TrimSpace(text[start:i]))
			start = i
		}
	}
	return append(out, strings.TrimSpace(text[start:]))
}

// plainText reports whether s is a text the memory parsers accept in a
// fact (or, with triple, a triple's term): 1 to max bytes of UTF-8 with no
// control, format or line-separator character and no operation marker
// (and no "|", the triple separator).
func plainText(s string, max int, triple bool) bool {
	if s == "" || len(s) > max || !utf8.ValidString(s) || triple && strings.Contains(s, "|") {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' {
			return false
		}
	}
	upper := strings.ToUpper(s)
	for _, m := range []string{"[ADD", "[UPDATE", "[BOOST", "[DELETE", "[SKIP", "[TRIPLE"} {
		if strings.Contains(upper, m) {
			return false
		}
	}
	return true
}
