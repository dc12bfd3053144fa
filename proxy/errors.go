package proxy

import "github.com/kvsidecar/kvsidecar/internal/httpapi"

// Error types and codes a client may see, besides whatever the upstream
// sends, and the OpenAI error envelope: package httpapi's, which the admin
// listener answers with too.
const (
	typeInvalidRequest = httpapi.TypeInvalidRequest
	typeNotFound       = httpapi.TypeNotFound
	typeUpstream       = httpapi.TypeUpstream
	typeServer         = httpapi.TypeServer
)

type apiErrorBody = httpapi.ErrorBody

var (
	errorJSON  = httpapi.ErrorJSON  // the envelope's bytes
	writeError = httpapi.WriteError // answers with an OpenAI-shaped error
	writeJSON  = httpapi.WriteJSON  // answers with v as JSON
)
