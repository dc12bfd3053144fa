package memory

import (
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
