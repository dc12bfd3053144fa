package memory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
)

// Message is one chat message as the client sent it. Raw is the original
// JSON object and is what MarshalJSON emits, byte for byte; the other fields
// are read from it for counting, matching and scoring.
//
// The zero Message is invalid. Build messages with json.Unmarshal,
// ParseMessages or NewMessage. A Message is immutable once built: Raw is
// shared, never modify it.
type Message struct {
	Role string
	// Content is the text of the message: string content, or the text parts
	// of array content concatenated.
	Content string
	// Name is the optional participant or function name.
	Name string
	// ToolCallID is set on role "tool" messages.
	ToolCallID string
	// Raw is the original JSON object.
	Raw json.RawMessage

	// toolText holds the ids, names and arguments of tool_calls and
	// function_call, which count and match like content.
	toolText string
	// nonText counts content parts that are not text (images, audio, files).
	nonText int
	// pre is the message's cost, counted before the session was locked
	// (Tokenizer.precount in prepare.go).
	pre precounted
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type wireMessage struct {
	Role         string          `json:"role"`
	Content      json.RawMessage `json:"content"`
	Name         string          `json:"name"`
	ToolCallID   string          `json:"tool_call_id"`
	ToolCalls    []wireToolCall  `json:"tool_calls"`
	FunctionCall *struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function_call"`
	Refusal *string `json:"refusal"`
}

type wirePart struct {
	Type    string  `json:"type"`
	Text    *string `json:"text"`
	Refusal *string `json:"refusal"`
}

// UnmarshalJSON parses a chat message object and keeps a copy of data as Raw.
func (m *Message) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return fmt.Errorf("%w: message is not a JSON object", ErrInvalid)
	}
	var w wireMessage
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("%w: message: %v", ErrInvalid, err)
	}
	if w.Role == "" {
		return fmt.Errorf("%w: message has no role", ErrInvalid)
	}
	out := Message{Role: w.Role, Name: w.Name, ToolCallID: w.ToolCallID}
	text, nonText, err := contentText(w.Content)
	if err != nil {
		return err
	}
	out.Content, out.nonText = text, nonText
	if out.Content == "" && w.Refusal != nil {
		out.Content = *w.Refusal
	}
	var tb strings.Builder
	for _, tc := range w.ToolCalls {
		tb.WriteString(tc.ID)
		tb.WriteByte(' ')
		tb.WriteString(tc.Function.Name)
		tb.WriteByte(' ')
		tb.WriteString(argText(tc.Function.Arguments))
		tb.WriteByte('\n')
	}
	if w.FunctionCall != nil {
		tb.WriteString(w.FunctionCall.Name)
		tb.WriteByte(' ')
		tb.WriteString(argText(w.FunctionCall.Arguments))
	}
	out.toolText = tb.String()
	out.Raw = append(json.RawMessage(nil), data...)
	*m = out
	return nil
}

// argText returns tool-call arguments as text: the string's value when they
// are a JSON string (OpenAI), else the raw JSON (some servers send objects).
func argText(raw json.RawMessage) string {
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

func contentText(raw json.RawMessage) (text string, nonText int, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", 0, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", 0, fmt.Errorf("%w: message content: %v", ErrInvalid, err)
		}
		return s, 0, nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", 0, fmt.Errorf("%w: message content: %v", ErrInvalid, err)
		}
		var b strings.Builder
		for _, p := range parts {
			p = bytes.TrimSpace(p)
			if len(p) > 0 && p[0] == '"' {
				var s string
				if json.Unmarshal(p, &s) == nil {
					b.WriteString(s)
					continue
				}
			}
			var wp wirePart
			if len(p) == 0 || p[0] != '{' || json.Unmarshal(p, &wp) != nil {
				nonText++
				continue
			}
			switch {
			case wp.Text != nil:
				b.WriteString(*wp.Text)
			case wp.Refusal != nil:
				b.WriteString(*wp.Refusal)
			default:
				nonText++
			}
		}
		return b.String(), nonText, nil
	}
	return "", 0, fmt.Errorf("%w: message content must be a string, an array or null", ErrInvalid)
}

// MarshalJSON returns Raw unchanged, or {"role","content"} when Raw is
// empty. Note that json.Marshal compacts what a Marshaler returns; to
// re-emit messages byte for byte use AppendMessagesJSON or Raw directly.
func (m Message) MarshalJSON() ([]byte, error) {
	if len(m.Raw) > 0 {
		return m.Raw, nil
	}
	return json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{m.Role, m.Content})
}

// NewMessage builds a text message, e.g. the assistant reply assembled from
// a stream: {"role":role,"content":content}.
func NewMessage(role, content string) Message {
	raw, _ := json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{role, content})
	return Message{Role: role, Content: content, Raw: raw}
}

// ParseMessages parses a JSON array of chat messages (the request's
// "messages" field).
func ParseMessages(data []byte) ([]Message, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '[' {
		return nil, fmt.Errorf("%w: messages must be a JSON array", ErrInvalid)
	}
	var msgs []Message
	if err := json.Unmarshal(data, &msgs); err != nil {
		if errors.Is(err, ErrInvalid) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: messages: %v", ErrInvalid, err)
	}
	return msgs, nil
}

// AppendMessagesJSON appends msgs as a JSON array of their raw objects.
func AppendMessagesJSON(dst []byte, msgs []json.RawMessage) []byte {
	dst = append(dst, '[')
	for i, m := range msgs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, m...)
	}
	return append(dst, ']')
}

// isSystem reports whether the role is pinned as the client's system prompt.
func isSystem(role string) bool { return role == "system" || role == "developer" }

var keySeed = maphash.MakeSeed()

// matchKey identifies a message by meaning, not bytes: clients re-serialize
// assistant messages with other key orders and null fields. In-process only.
func (m *Message) matchKey() uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	h.WriteString(m.Role)
	h.WriteByte(0)
	h.WriteString(m.Content)
	h.WriteByte(0)
	h.WriteString(m.Name)
	h.WriteByte(0)
	h.WriteString(m.ToolCallID)
	h.WriteByte(0)
	h.WriteString(m.toolText)
	h.WriteByte(byte(m.nonText))
	return h.Sum64()
}

// hasToolCalls reports whether an assistant message calls tools.
func (m *Message) hasToolCalls() bool { return m.toolText != "" }
