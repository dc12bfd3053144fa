package memory

import (
	"bytes"
	"slices"
	"strings"
)

// Mode is how a client sends its conversation.
type Mode uint8

const (
	// ModeAuto (no X-Session-Mode header) detects the client's style per
	// request: a request whose non-system messages are only new input (no
	// assistant message, not extending the stored history) is an append;
	// anything else is matched as a full history (extend, trimmed,
	// diverged).
	ModeAuto Mode = iota
	// ModeFull: every request carries the whole conversation (the OpenAI
	// default); the stored history is matched and only the new tail appended.
	ModeFull
	// ModeAppend: requests carry only new messages (X-Session-Mode: append).
	ModeAppend
)

func (m Mode) String() string {
	switch m {
	case ModeFull:
		return "full"
	case ModeAppend:
		return "append"
	}
	return "auto"
}

// ParseMode maps the X-Session-Mode header: "append" is ModeAppend, "full"
// is ModeFull, anything else (an absent header) ModeAuto.
func ParseMode(header string) Mode {
	switch strings.ToLower(strings.TrimSpace(header)) {
	case "append":
		return ModeAppend
	case "full":
		return ModeFull
	}
	return ModeAuto
}

func sameMessages(msgs []Message, es []*entry) bool {
	if len(msgs) != len(es) {
		return false
	}
	for i := range msgs {
		if msgs[i].matchKey() != es[i].key {
			return false
		}
	}
	return true
}

// matchRequest relates a request's non-system messages to the stored
// history. It returns the mode taken, how many stored messages to keep,
// the request's messages to append, and the kind of match.
//
// ModeAppend appends everything. Otherwise, in this order:
//   - no stored history: "new", everything is appended;
//   - the request extends the stored history: "extend";
//   - (ModeAuto only) the request holds no assistant message: new input
//     from a client that sends only its newest message: "append";
//   - the request starts inside the stored history and runs to its end
//     (the client trimmed its oldest turns): "trimmed";
//   - the request shares a start with the stored history, or starts inside
//     it and then differs (edit, regenerate, branch): "diverged", the
//     stored history is cut after the shared part (the cut messages become
//     archive units, nothing is lost);
//   - nothing shared: "diverged" at the start (a reused session id).
func matchRequest(sess *session, req []Message, mode Mode) (Mode, int, []Message, string) {
	hist := sess.hist
	if mode == ModeAppend {
		return ModeAppend, len(hist), req, "append"
	}
	if len(hist) == 0 && len(sess.sys) == 0 {
		return ModeFull, 0, req, "new"
	}
	// Equal raw bytes imply equal keys; hash only what differs (typically
	// assistant messages the client re-serialized).
	same := func(e *entry, m *Message) bool {
		return bytes.Equal(e.msg.Raw, m.Raw) || e.key == m.matchKey()
	}
	k := 0
	for k < len(hist) && k < len(req) && same(hist[k], &req[k]) {
		k++
	}
	if k == len(hist) {
		return ModeFull, k, req[k:], "extend"
	}
	if mode == ModeAuto && !slices.ContainsFunc(req, func(m Message) bool { return m.Role == "assistant" }) {
		return ModeAppend, len(hist), req, "append"
	}
	if k > 0 {
		return ModeFull, k, req[k:], "diverged"
	}
	if len(req) == 0 {
		return ModeFull, 0, req, "diverged"
	}
	// The request starts inside the stored history: a trimmed client when
	// it runs to the end from some alignment of its first message, else an
	// edit after the longest (latest on ties) alignment.
	k0 := req[0].matchKey()
	bestP, bestJ := 0, 0
	for p := 1; p < len(hist); p++ {
		if hist[p].key != k0 {
			continue
		}
		j := 1
		for p+j < len(hist) && j < len(req) && same(hist[p+j], &req[j]) {
			j++
		}
		if p+j == len(hist) {
			return ModeFull, len(hist), req[j:], "trimmed"
		}
		if j >= bestJ {
			bestP, bestJ = p, j
		}
	}
	if bestJ > 0 {
		return ModeFull, bestP + bestJ, req[bestJ:], "diverged"
	}
	return ModeFull, 0, req, "diverged"
}
