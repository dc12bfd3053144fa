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
	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/internal/jsonscan"
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

// parse is the route step's reading of the body: the fields the later steps
// need. A body its endpoint cannot take is answered 400.
func (f *flow) parse(ctx *fasthttp.RequestCtx) bool {
	if ep := endpointOf(f.route); ep != epOther && ctx.IsPost() {
		var err error
		if f.info, err = parseRequest(ep, f.in); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_request", err.Error())
			return false
		}
	}
	return true
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
	var (
		model, stream, key, user gjson.Result
		messages, prompt, input  []byte // raw, slices of the body
		tools, functions         []byte
		maxTokens                [3]gjson.Result
	)
	// One pass checks the body and hands over its top-level members; a
	// value is read (gjson, on a string view: no copy) only when its key is
	// one the proxy needs. The strings kept in info are copied (modelName,
	// strings.Clone): fasthttp reuses the body's buffer once the handler
	// returns, and a relay keeps info longer.
	value := func(v []byte) gjson.Result { return gjson.Parse(unsafe.String(unsafe.SliceData(v), len(v))) }
	m := jsonscan.Members(trimmed)
	for m.Next() {
		v := m.Value()
		switch jsonscan.Name(m.Key()) { // later duplicates win, as with encoding/json
		case "model":
			model = value(v)
		case "stream":
			stream = value(v)
		case "prompt_cache_key":
			key = value(v)
		case "user":
			user = value(v)
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
			maxTokens[0] = value(v)
		case "max_tokens":
			maxTokens[1] = value(v)
		case "n_predict":
			maxTokens[2] = value(v)
		}
	}
	if !m.Valid() {
		return info, badRequest("malformed JSON: %s", jsonSyntaxError(trimmed))
	}
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
	present := func(raw []byte) bool { return len(raw) > 0 && string(raw) != "null" }
	switch ep {
	case epChat:
		if len(messages) == 0 || messages[0] != '[' {
			return info, badRequest("'messages' is required and must be an array")
		}
		info.Messages = messages
		for _, t := range [][]byte{tools, functions} {
			if present(t) {
				info.Tools = append(info.Tools, t...)
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
