package chatapi

import (
	"context"
	"net/http"
)

// Chat sends chat-completions requests through warmpath's routed client:
// admission, routing to the replica holding the prefix, retry, accounting.
// The gateway implements it once; the Responses and Messages fronts use
// it.
//
// Contract: the response is the upstream's (status, headers, a body that
// streams when the body says "stream": true, as text/event-stream of
// chat.completion.chunk with usage in the last chunk when
// stream_options.include_usage is true) when the upstream answered with a
// success. Every refusal (routing, admission, auth-limit, and the
// upstream's own error responses) is an error value, an *apierror.Error
// with the status, the envelope's fields and the retry headers
// (Retry-After, x-ratelimit-*, passed on); any other error means the
// context ended or the request could not be sent at all. A response with
// status >= 400 is never returned.
type Chat interface {
	Complete(ctx context.Context, t Turn) (*http.Response, error)
}

// ChatFunc adapts a function to Chat.
type ChatFunc func(ctx context.Context, t Turn) (*http.Response, error)

// Complete calls f.
func (f ChatFunc) Complete(ctx context.Context, t Turn) (*http.Response, error) { return f(ctx, t) }

// Turn is one chat-completions request a front sends through Chat.
type Turn struct {
	// Body is a /v1/chat/completions JSON body, exactly as a client would
	// POST it. The fronts always stream, with
	// stream_options.include_usage.
	Body []byte
	// Header holds the client's request headers, less its credentials
	// (priority, harness session headers such as
	// X-Claude-Code-Session-Id); for a background turn, the ones saved at
	// creation.
	Header http.Header
	// Tenant is the tenant the turn runs for. "" means the principal of
	// ctx. A turn whose ctx carries no principal of Tenant (a background
	// turn, run outside any client request) runs as the tenant: its
	// limits, not a key's.
	Tenant string
	// Session is the session key routing must use (the Responses API's
	// chain root, conversation, or "k:<tenant>:<hint>"); "" lets the
	// gateway derive one (harness headers, then the conversation
	// opening).
	Session string
	// Background marks a background-class turn (Responses background:
	// true).
	Background bool
	// ResponseID is the ID of the Responses API response the turn
	// answers, for tracing; "" for none.
	ResponseID string
}
