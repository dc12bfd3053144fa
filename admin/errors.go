package admin

import "github.com/kvsidecar/kvsidecar/internal/httpapi"

// The admin listener answers as the proxy does (package httpapi): OpenAI-shaped
// errors {"error":{"message","type","param","code"}}, JSON answers, ids
// checked as the proxy checks session ids, paths read by their segments.
const (
	typeInvalidRequest = httpapi.TypeInvalidRequest
	typeNotFound       = httpapi.TypeNotFound
	typeServer         = httpapi.TypeServer
	maxIDLen           = httpapi.MaxIDLen
)

var (
	writeError   = httpapi.WriteError
	writeJSON    = httpapi.WriteJSON
	validID      = httpapi.ValidID
	pathSegments = httpapi.PathSegments
	isDotName    = httpapi.IsDotName
)
