package knowledge

import "context"

// ExtractRequest is one extraction call: its prompt and the session it is
// made for.
type ExtractRequest struct {
	// Tenant and SessionID name the session; Model is the model of its
	// latest turn (the call's model unless the Extractor overrides it).
	Tenant, SessionID, Model string
	// Kind is "facts" (the reply is fact operations, see ParseFactOps),
	// "episode" (the reply is a short summary), "review" (one round of the
	// memory reviewer, see ParseReview), "tool_context" (tool calls and
	// results condensed, see ParseToolContext) or "l4_merge" (overlapping
	// facts merged into one, see ParseMerge).
	Kind string
	// Prompt is the whole prompt, sent as one user message.
	Prompt string
}

// Extractor completes an extraction prompt with a model (package llm calls
// the upstream). It is called from background goroutines package memory's Store owns,
// never on the request path; ctx is cancelled on Close and after
// Extraction.Timeout. Safe for concurrent use.
type Extractor interface {
	Extract(ctx context.Context, req ExtractRequest) (string, error)
}

// ExtractorFunc adapts a function to Extractor.
type ExtractorFunc func(ctx context.Context, req ExtractRequest) (string, error)

// Extract implements Extractor.
func (f ExtractorFunc) Extract(ctx context.Context, req ExtractRequest) (string, error) {
	return f(ctx, req)
}
