package mockup

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// describePrefix starts every described answer (and, quoted back in a
// later request's history, is shown short).
const describePrefix = "[demo upstream: no model here, this answer describes the request]"

// describeLast is how many of the newest messages a described answer
// quotes, and describeText how many bytes of each.
const (
	describeLast = 4
	describeText = 160
)

// Describe is the answer of Options.Describe to a chat request body: the
// number of messages the upstream received by role, then the newest few,
// each on one line and cut short. A client that sent only its newest
// message sees in it the history and the memory the sidecar added.
func Describe(body []byte) string {
	msgs := gjson.GetBytes(body, "messages").Array()
	roles := map[string]int{}
	var order []string
	for _, m := range msgs {
		r := m.Get("role").String()
		if roles[r] == 0 {
			order = append(order, r)
		}
		roles[r]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s I received %d message", describePrefix, len(msgs))
	if len(msgs) != 1 {
		b.WriteByte('s')
	}
	for i, r := range order {
		sep := ", "
		if i == 0 {
			sep = " ("
		}
		fmt.Fprintf(&b, "%s%d %s", sep, roles[r], r)
		if i == len(order)-1 {
			b.WriteByte(')')
		}
	}
	first := max(0, len(msgs)-describeLast)
	if first > 0 {
		fmt.Fprintf(&b, "; the newest %d:", len(msgs)-first)
	} else {
		b.WriteByte(':')
	}
	for i, m := range msgs[first:] {
		text := contentText(m)
		if strings.HasPrefix(text, describePrefix) {
			text = "(an earlier answer of this demo upstream)"
		}
		fmt.Fprintf(&b, "\n%d. %s: %s", first+i+1, m.Get("role").String(), oneLine(text, describeText))
	}
	return b.String()
}

// contentText is a message's text: its content string, or the text parts
// of a content array.
func contentText(m gjson.Result) string {
	c := m.Get("content")
	if !c.IsArray() {
		return c.String()
	}
	var parts []string
	for _, p := range c.Array() {
		if t := p.Get("text"); t.Exists() {
			parts = append(parts, t.String())
		}
	}
	return strings.Join(parts, " ")
}

// oneLine joins s's lines with " / " and cuts it to at most n bytes (on a
// rune boundary), marking the cut with "…".
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " / ")), " ")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// splitWords cuts s into n pieces at spaces (fewer when s has fewer
// words), each piece keeping its trailing space, so that the pieces
// concatenate to s: the chunks of a streamed answer.
func splitWords(s string, n int) []string {
	words := strings.SplitAfter(s, " ")
	if n <= 0 || len(words) <= n {
		return words
	}
	out := make([]string, 0, n)
	per := (len(words) + n - 1) / n
	for i := 0; i < len(words); i += per {
		out = append(out, strings.Join(words[i:min(i+per, len(words))], ""))
	}
	return out
}

// DemoBackground answers the sidecar's own background calls in the demo,
// a stand-in for a model with two simple rules: a fact extraction prompt
// (it lists "Known facts:" and "New messages:") gets one "[ADD]" per new
// user message that is not a question, its text as the fact; a summary prompt ("New messages:"
// alone) gets "The user said: " and those messages. Everything else (a
// review, a merge) gets "[SKIP]", which changes nothing.
func DemoBackground(prompt string) string {
	_, msgs, ok := strings.Cut(prompt, "New messages:\n")
	if !ok {
		return "[SKIP]"
	}
	msgs, _, _ = strings.Cut(msgs, "\n\n")
	var said []string
	for line := range strings.Lines(msgs) {
		if text, ok := strings.CutPrefix(strings.TrimSpace(line), "user: "); ok && strings.TrimSpace(text) != "" {
			said = append(said, oneLine(text, 300))
		}
	}
	if len(said) == 0 {
		return "[SKIP]"
	}
	if strings.Contains(prompt, "Known facts:") {
		var adds []string
		for _, t := range said {
			if !strings.HasSuffix(t, "?") {
				adds = append(adds, "[ADD] "+t)
			}
		}
		if len(adds) == 0 {
			return "[SKIP]"
		}
		return strings.Join(adds, "\n")
	}
	return "The user said: " + strings.Join(said, "; ")
}
