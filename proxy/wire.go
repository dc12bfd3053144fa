package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Endpoint kinds whose bodies the proxy reads.
type endpoint uint8

const (
	epOther endpoint = iota
	epChat
	epCompletions
	epEmbeddings
)

// requestInfo is what the proxy reads from an OpenAI request body. The body
// itself is forwarded unchanged.
type requestInfo struct {
	Model          string
	Stream         bool
	PromptCacheKey string
	// Messages is the raw "messages" array of a chat request; Tools the raw
	// "tools" and "functions" values (their token cost is reserved).
	Messages json.RawMessage
	Tools    []byte
}

// badRequestError is a request body the client must fix (400); its message
// is fit for the client.
type badRequestError struct{ msg string }

func (e *badRequestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &badRequestError{msg: fmt.Sprintf(format, args...)}
}

// parseRequest validates an OpenAI request body for the endpoint and returns
// what the proxy needs from it. Its errors are *badRequestError.
func parseRequest(ep endpoint, body []byte) (requestInfo, error) {
	var info requestInfo
	trimmed := bytes.Trim(body, jsonSpace)
	if len(trimmed) == 0 {
		return info, badRequest("request body is empty; expected a JSON object")
	}
	if trimmed[0] != '{' {
		return info, badRequest("request body must be a JSON object")
	}
	// Top-level keys are matched exactly (encoding/json alone would accept
	// "MESSAGES"); the values the proxy reads are checked for type.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &top); err != nil {
		return info, badRequest("malformed JSON: %s", err)
	}
	for _, f := range []struct {
		key string
		dst any
	}{{"model", &info.Model}, {"stream", &info.Stream}, {"prompt_cache_key", &info.PromptCacheKey}} {
		raw, ok := top[f.key]
		if !ok || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			want := "string"
			if f.key == "stream" {
				want = "boolean"
			}
			return info, badRequest("invalid type for '%s': expected %s", f.key, want)
		}
	}
	present := func(k string) bool { v, ok := top[k]; return ok && string(v) != "null" }
	switch ep {
	case epChat:
		if !isJSONArray(top["messages"]) {
			return info, badRequest("'messages' is required and must be an array")
		}
		info.Messages = top["messages"]
		for _, k := range []string{"tools", "functions"} {
			if present(k) {
				info.Tools = append(info.Tools, top[k]...)
			}
		}
	case epCompletions:
		if !present("prompt") {
			return info, badRequest("'prompt' is required")
		}
	case epEmbeddings:
		if !present("input") {
			return info, badRequest("'input' is required")
		}
		if info.Stream {
			return info, badRequest("embeddings cannot be streamed")
		}
	}
	return info, nil
}

// jsonSpace is the whitespace JSON allows between tokens.
const jsonSpace = " \t\r\n"

func isJSONArray(raw json.RawMessage) bool {
	raw = bytes.Trim(raw, jsonSpace)
	return len(raw) > 0 && raw[0] == '['
}

// replaceValue returns body with the value of its top-level key replaced by
// val, every other byte unchanged. body must be a valid JSON object holding
// key.
func replaceValue(body []byte, key string, val []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("proxy: body is not a JSON object")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("proxy: scan body: %w", err)
		}
		k, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("proxy: scan body: %w", err)
		}
		if k != key {
			continue
		}
		end := int(dec.InputOffset())
		start := end - len(raw)
		out := make([]byte, 0, len(body)-len(raw)+len(val))
		out = append(append(append(out, body[:start]...), val...), body[end:]...)
		return out, nil
	}
	return nil, fmt.Errorf("proxy: body has no %q", key)
}
