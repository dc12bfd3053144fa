// Package httpapi holds what the sidecar's two HTTP surfaces (package proxy's
// main listener and package admin's listener) answer alike: the OpenAI error
// envelope, JSON answers, the check of a client-chosen id and the reading of
// a path's segments. It imports only fasthttp.
package httpapi

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// Error types a client may see, besides whatever an upstream sends.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeUpstream       = "upstream_error"
	TypeServer         = "server_error"
)

// Error is the OpenAI error envelope: {"error":{"message","type","param","code"}}.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is the envelope's inner object.
type ErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// ErrorJSON renders the OpenAI error envelope.
func ErrorJSON(typ, code, msg string) []byte {
	b, err := json.Marshal(Error{Error: ErrorBody{Message: msg, Type: typ, Code: code}})
	if err != nil { // unreachable: plain strings always marshal
		return []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal"}}`)
	}
	return b
}

// WriteError answers with an OpenAI-shaped error, replacing whatever the
// response held.
func WriteError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(ErrorJSON(typ, code, msg))
}

// WriteJSON answers with v as JSON (a 500 error when v cannot be encoded).
func WriteJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		WriteError(ctx, fasthttp.StatusInternalServerError, TypeServer, "internal", "could not encode the answer")
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// MaxIDLen bounds a client-chosen session, tenant or user id. Ids are never
// used as file names (those are hashes), but they are logged and stored.
const MaxIDLen = 256

// ValidID reports whether id may name a session (or a tenant or user on the
// admin API): at most MaxIDLen bytes of UTF-8 without control characters.
func ValidID(id string) error {
	if len(id) > MaxIDLen {
		return fmt.Errorf("session id is %d bytes; at most %d allowed", len(id), MaxIDLen)
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

// PathSegments splits a raw path tail ("/a/b") into decoded segments.
func PathSegments(tail []byte) ([]string, error) {
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

// IsDotName reports whether a decoded segment is "." or "..".
func IsDotName(s string) bool { return s == "." || s == ".." }

// TooLarge answers 413 and closes the connection when the request's body
// exceeds limit bytes; the server reads up to the largest limit of any route.
func TooLarge(ctx *fasthttp.RequestCtx, limit int) bool {
	if n := len(ctx.Request.Body()); n > limit {
		WriteError(ctx, fasthttp.StatusRequestEntityTooLarge, TypeInvalidRequest, "body_too_large",
			fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", n, limit))
		ctx.SetConnectionClose()
		return true
	}
	return false
}
