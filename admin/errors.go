package admin

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// The admin listener's errors are OpenAI-shaped, as the proxy's
// (package proxy's errors.go): {"error":{"message","type","param","code"}}.
const (
	typeInvalidRequest = "invalid_request_error"
	typeNotFound       = "not_found_error"
	typeServer         = "server_error"
)

type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// writeError answers with an OpenAI-shaped error.
func writeError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	b, err := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
	if err != nil { // unreachable: plain strings always marshal
		b = []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal"}}`)
	}
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// writeJSON answers with v as JSON.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "could not encode the answer")
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// maxIDLen bounds a tenant, session or user id, as the proxy's session ids.
const maxIDLen = 256

// validID checks a tenant, session or user id as the proxy checks session
// ids: valid UTF-8 of at most maxIDLen bytes without control characters.
func validID(id string) error {
	if len(id) > maxIDLen {
		return fmt.Errorf("session id is %d bytes; at most %d allowed", len(id), maxIDLen)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("session id must be valid UTF-8")
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("session id must not contain control characters")
		}
	}
	return nil
}

// pathSegments splits a raw path tail ("/a/b") into decoded segments.
func pathSegments(tail []byte) ([]string, error) {
	if len(tail) == 0 {
		return nil, nil
	}
	parts := strings.Split(string(tail[1:]), "/")
	for i, p := range parts {
		s, err := url.PathUnescape(p)
		if err != nil {
			return nil, err
		}
		parts[i] = s
	}
	return parts, nil
}

// isDotName reports whether a decoded segment is "." or "..".
func isDotName(s string) bool { return s == "." || s == ".." }
