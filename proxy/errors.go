package proxy

import (
	"encoding/json"

	"github.com/valyala/fasthttp"
)

// Error types and codes a client may see, besides whatever the upstream sends.
const (
	typeInvalidRequest = "invalid_request_error"
	typeNotFound       = "not_found_error"
	typeUpstream       = "upstream_error"
	typeServer         = "server_error"
)

// apiError is the OpenAI error envelope.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// errorJSON renders the OpenAI error envelope.
func errorJSON(typ, code, msg string) []byte {
	b, err := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
	if err != nil { // unreachable: plain strings always marshal
		return []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal"}}`)
	}
	return b
}

// writeError answers the client with an OpenAI-shaped error.
func writeError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(errorJSON(typ, code, msg))
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
