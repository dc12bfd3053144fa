package knowledge

import (
	"fmt"
	"strings"

	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// The prompts of the memory model's calls. Each is sent as one user
// message (ExtractRequest.Prompt); every text the conversation or the
// memory brings is sanitized and cut to a bound first, so a prompt is
// bounded by what its caller passes.

// MaxPromptMsgBytes bounds one message in a prompt.
const MaxPromptMsgBytes = 1500

// Line is one message of the conversation as a prompt shows it.
type Line struct {
	Role, Text string
}

// PromptLen is what a message costs in a prompt, in bytes (for choosing
// the newest that fit).
func PromptLen(l Line) int { return min(len(l.Text), MaxPromptMsgBytes) + len(l.Role) + 3 }

func writeLines(b *strings.Builder, ls []Line) {
	for _, l := range ls {
		b.WriteString(l.Role)
		b.WriteString(": ")
		b.WriteString(sanitize.Text(l.Text, MaxPromptMsgBytes))
		b.WriteByte('\n')
	}
}

// EpisodePrompt asks for an episodic summary of msgs (kind "episode").
func EpisodePrompt(msgs []Line) string {
	var b strings.Builder
	b.WriteString("Summarize this part of a conversation between a user and an assistant in at most five sentences, " +
		"for the assistant's long-term memory: what the user wanted, what was decided or done, and facts learned. " +
		"Reply with the summary only.\n\n")
	writeLines(&b, msgs)
	return b.String()
}

// KnownFact is a fact the fact prompt shows: the only ids the reply's
// operations may name.
type KnownFact struct {
	ID, Content string
	Review      string // the fact's review flag, shown when set
}

// FactPrompt asks for fact operations and triples about msgs, given the
// facts already known (kind "facts"; the reply is parsed by CutTripleLines,
// ParseFactOps and ParseTriples).
func FactPrompt(facts []KnownFact, msgs []Line) string {
	var b strings.Builder
	b.WriteString("You maintain the long-term memory of a conversation between a user and an assistant.\n\nKnown facts:\n")
	if len(facts) == 0 {
		b.WriteString("(none)\n")
	}
	for _, f := range facts {
		fmt.Fprintf(&b, "[%s] %s", f.ID, sanitize.Text(f.Content, MaxFactBytes))
		if f.Review != "" {
			fmt.Fprintf(&b, " (review: %s)", f.Review)
		}
		b.WriteByte('\n')
	}
	b.WriteString("\nNew messages:\n")
	writeLines(&b, msgs)
	b.WriteString("\nReply with memory operations only, one per line, exactly in these forms:\n" +
		"[ADD] <a new standalone fact worth remembering, one sentence>\n" +
		"[UPDATE:<id>] <the corrected text of a known fact>\n" +
		"[BOOST:<id>]   (a known fact was confirmed or used again)\n" +
		"[DELETE:<id>]  (a known fact is no longer true)\n" +
		"[SKIP]         (nothing worth remembering)\n" +
		"Use only the ids listed above. Do not repeat known facts. No other text.\n")
	b.WriteString(TripleInstructions)
	return b.String()
}

// ReviewFact is the fact a review is about, as the review prompt shows it.
type ReviewFact struct {
	ID, Content string
	Importance  float64
	Created     string // its creation date, as the recall block dates memories
	Promote     bool   // reviewed for promotion (else: fading)
}

// ReviewPrompt is the prompt of one round of a review (kind "review"):
// round of maxRounds, with the searches made so far; the answer is parsed
// by ParseReview.
func ReviewPrompt(f ReviewFact, round, maxRounds int, searches string) string {
	var b strings.Builder
	b.WriteString("You review one memory in an assistant's long-term memory about a user.\n\n")
	fmt.Fprintf(&b, "Memory [%s], importance %.2f, created %s:\n%s\n\n", f.ID, f.Importance,
		f.Created, sanitize.Text(f.Content, MaxFactBytes))
	if f.Promote {
		b.WriteString("It was confirmed often: decide whether it becomes a core memory, shown to the assistant in every conversation.\n")
	} else {
		b.WriteString("It has not been used for a long time and is fading: decide whether it is still worth keeping.\n")
	}
	if searches != "" {
		b.WriteString("\nYour searches so far:\n")
		b.WriteString(searches)
	}
	left := maxRounds - round
	fmt.Fprintf(&b, "\nAnswer with exactly one line, nothing else:\n"+
		"[PROMOTE] <short reason>   make it a core memory (a lasting, important fact about the user)\n"+
		"[KEEP] <short reason>      keep it as an ordinary memory\n"+
		"[DELETE] <short reason>    delete it (wrong, outdated, duplicated or worthless)\n")
	if left > 0 {
		fmt.Fprintf(&b, "[SEARCH:<keywords>]        first look up related memories (%d searches left)\n", left)
	} else {
		b.WriteString("This is the last round: decide now.\n")
	}
	return b.String()
}

// ToolLine is a tool call (Call: the assistant's tool_calls as text) or a
// tool result (Name, the tool's name, and Text) as the tool-context prompt
// shows it.
type ToolLine struct {
	Call       bool
	Name, Text string
}

// ToolContextPrompt asks to condense tool calls and results (kind
// "tool_context"); each gets an equal share of promptBytes. The answer is
// checked by ParseToolContext.
func ToolContextPrompt(src []ToolLine, promptBytes int) string {
	per := max(promptBytes/max(len(src), 1), 64)
	var b strings.Builder
	b.WriteString("An assistant called tools for a user. Condense the tool calls and their results below into one or two " +
		"short sentences of context for the assistant's next reply: which tools were used and what they returned that " +
		"matters. Reply with the sentences only, or [SKIP] if nothing matters.\n\n")
	for _, l := range src {
		if l.Call {
			b.WriteString("assistant called: ")
			b.WriteString(sanitize.Text(l.Text, per))
		} else {
			b.WriteString("tool result")
			if n := sanitize.Text(l.Name, 64); n != "" {
				b.WriteString(" (" + n + ")")
			}
			b.WriteString(": ")
			b.WriteString(sanitize.Text(l.Text, per))
		}
		b.WriteByte('\n')
	}
	return b.String()
}
