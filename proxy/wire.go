package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tidwall/gjson"
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
	// User is the body's "user" field (OpenAI's end-user id): the memory
	// user scope when no X-User-ID header names one.
	User string
	// Messages is the raw "messages" array of a chat request; Tools the raw
	// "tools" and "functions" values (their token cost is reserved).
	Messages json.RawMessage
	Tools    []byte
	// MaxTokens is what the client asked the reply may take
	// (max_completion_tokens, max_tokens, or llama.cpp's n_predict; the
	// first present and positive), 0 when none.
	MaxTokens int
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
//
// It validates the whole body and reads only the top-level keys it needs,
// without decoding the rest (BenchmarkParseRequest): keys match exactly,
// as OpenAI's server does ("MESSAGES" is not "messages").
func parseRequest(ep endpoint, body []byte) (requestInfo, error) {
	var info requestInfo
	trimmed := bytes.Trim(body, jsonSpace)
	if len(trimmed) == 0 {
		return info, badRequest("request body is empty; expected a JSON object")
	}
	if trimmed[0] != '{' {
		return info, badRequest("request body must be a JSON object")
	}
	if !gjson.ValidBytes(trimmed) {
		return info, badRequest("malformed JSON: %s", jsonSyntaxError(trimmed))
	}
	var (
		model, stream, key, user, messages, prompt, input, tools, functions gjson.Result
		maxTokens                                                           [3]gjson.Result
	)
	// A string view of the body: no copy of it. The strings kept in info
	// are copied (modelName, strings.Clone): fasthttp reuses the body's
	// buffer once the handler returns, and a relay keeps info longer.
	gjson.Parse(unsafe.String(unsafe.SliceData(trimmed), len(trimmed))).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model":
			model = v
		case "stream":
			stream = v
		case "prompt_cache_key":
			key = v
		case "user":
			user = v
		case "messages":
			messages = v
		case "prompt":
			prompt = v
		case "input":
			input = v
		case "tools":
			tools = v
		case "functions":
			functions = v
		case "max_completion_tokens":
			maxTokens[0] = v
		case "max_tokens":
			maxTokens[1] = v
		case "n_predict":
			maxTokens[2] = v
		}
		return true // later duplicates win, as with encoding/json
	})
	switch model.Type {
	case gjson.Null:
	case gjson.String:
		info.Model = modelName(model.Str)
	default:
		return info, badRequest("invalid type for 'model': expected string")
	}
	switch stream.Type {
	case gjson.Null:
	case gjson.True, gjson.False:
		info.Stream = stream.Type == gjson.True
	default:
		return info, badRequest("invalid type for 'stream': expected boolean")
	}
	switch key.Type {
	case gjson.Null:
	case gjson.String:
		info.PromptCacheKey = strings.Clone(key.Str)
	default:
		return info, badRequest("invalid type for 'prompt_cache_key': expected string")
	}
	switch user.Type {
	case gjson.Null:
	case gjson.String:
		info.User = strings.Clone(user.Str)
	default:
		return info, badRequest("invalid type for 'user': expected string")
	}
	for _, m := range maxTokens {
		if m.Type == gjson.Number && m.Num >= 1 && info.MaxTokens == 0 {
			info.MaxTokens = int(min(m.Num, 1<<30))
		}
	}
	present := func(r gjson.Result) bool { return r.Exists() && r.Type != gjson.Null }
	switch ep {
	case epChat:
		if !messages.IsArray() {
			return info, badRequest("'messages' is required and must be an array")
		}
		info.Messages = rawOf(trimmed, messages)
		for _, t := range []gjson.Result{tools, functions} {
			if present(t) {
				info.Tools = append(info.Tools, rawOf(trimmed, t)...)
			}
		}
	case epCompletions:
		if !present(prompt) {
			return info, badRequest("'prompt' is required")
		}
	case epEmbeddings:
		if !present(input) {
			return info, badRequest("'input' is required")
		}
		if info.Stream {
			return info, badRequest("embeddings cannot be streamed")
		}
	}
	return info, nil
}

// modelNames interns the model names requests carry, so that the
// common case, a few models named again and again, costs no copy per
// request. It holds at most maxModelNames; past that a name is copied.
var (
	modelNames     sync.Map // string -> the same string, owned
	modelNamesHeld atomic.Int32
)

const maxModelNames = 256

// modelName returns an owned copy of name, which may be a view of a
// buffer reused after the request.
func modelName(name string) string {
	if v, ok := modelNames.Load(name); ok {
		return v.(string)
	}
	owned := strings.Clone(name)
	if modelNamesHeld.Load() < maxModelNames {
		if v, loaded := modelNames.LoadOrStore(owned, owned); loaded {
			return v.(string)
		}
		modelNamesHeld.Add(1)
	}
	return owned
}

// rawOf returns r's raw bytes as a slice of body (no copy) when gjson
// reports its position, else a copy.
func rawOf(body []byte, r gjson.Result) json.RawMessage {
	if r.Index > 0 && r.Index+len(r.Raw) <= len(body) {
		return body[r.Index : r.Index+len(r.Raw) : r.Index+len(r.Raw)]
	}
	return json.RawMessage(r.Raw)
}

// jsonSyntaxError describes why body is not valid JSON, for the client.
func jsonSyntaxError(body []byte) string {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return err.Error()
	}
	return "invalid JSON"
}

// jsonSpace is the whitespace JSON allows between tokens.
const jsonSpace = " \t\r\n"

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
