package frontdoor

import "fmt"

// Error is a request the front door refuses: the status and an
// OpenAI-style code and message to answer with, after which the connection
// closes. A message never quotes the request's bytes.
type Error struct {
	Status int
	Code   string
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("frontdoor: %d %s: %s", e.Status, e.Code, e.Msg) }

func errBadRequest(msg string) *Error {
	return &Error{Status: 400, Code: "bad_request", Msg: msg}
}

func errHeadTooLarge(limit int) *Error {
	return &Error{Status: 431, Code: "header_too_large", Msg: fmt.Sprintf("the request head passes %d bytes", limit)}
}

func errTooLarge(limit int64) *Error {
	return &Error{Status: 413, Code: "body_too_large", Msg: fmt.Sprintf("the request body exceeds the limit of %d bytes", limit)}
}

// ErrTimeout is the Error for a request not read whole within the read
// timeout.
var ErrTimeout = &Error{Status: 408, Code: "request_timeout", Msg: "timed out reading the request"}
