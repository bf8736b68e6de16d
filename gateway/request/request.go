// Package request is the per-request value every stage of the gateway
// reads: an inference request parsed once (the original body plus the
// fields admission, routing and accounting need, located with gjson so a
// large conversation is never unmarshalled into Go values), its sender,
// session key and scheduling class, and the bodies derived from it (the
// upstream body, the /tokenize body, the rendered text). It is a leaf:
// it imports no stage, and holds no routing or admission state.
package request

import (
	"net/http"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/session"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// API says which OpenAI endpoint a request came in on.
type API int

// The inference APIs the gateway forwards.
const (
	Chat        API = iota // POST /v1/chat/completions
	Completions            // POST /v1/completions
)

// Path is the API's path on the replica.
func (k API) Path() string {
	if k == Completions {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// Operation is the API's gen_ai.operation.name (OpenTelemetry GenAI
// semantic conventions).
func (k API) Operation() string {
	if k == Completions {
		return "text_completion"
	}
	return "chat"
}

// DefaultBytesPerToken is the prompt-length estimate before a model's
// ratio is learned: about four bytes a token for English under BPE
// tokenizers. A prompt of token ids counts this many bytes per id.
const DefaultBytesPerToken = 4

// R is an inference request parsed once. Build one with Parse; it is
// read-only afterwards but for SetSession and SetBackground, which its
// front calls before sending it.
type R struct {
	api    API
	body   []byte
	header http.Header // the client's headers, forwarded upstream
	id     string      // X-Request-Id, for logs and the engine
	model  string
	stream bool
	// wantUsage reports that a streaming client asked for the usage chunk.
	wantUsage bool
	session   session.Key
	principal *tenancy.Principal // who sent it; nil without tenancy (the analyzer)
	// messages, tools (chat) and prompt (completions) are views into body.
	messages, tools, prompt gjson.Result
	// textBytes is the size of the prompt text, for estimating tokens
	// before (or instead of) tokenizing; DefaultBytesPerToken a token
	// for prompts of token ids (tokenIDs).
	textBytes int
	tokenIDs  bool
	cacheSalt string
	maxTokens int    // max_completion_tokens or max_tokens, 0 when unset
	text      []byte // ApproxText: rendered by scanMessages (chat), else once on first use
	// clientSalt is the body's own cache_salt ("" when none), top which
	// top-level fields the body carries that the upstream body rewrites.
	clientSalt string
	top        topSeen

	// Admission (class.go): the class and what chose it (background
	// marks a Responses background turn, background: true, set through
	// SetBackground); the conversation's turns so far (assistant
	// messages) and the prompt bytes up to the last of them, which the
	// replica serving the session is expected to hold cached.
	class       fairq.Class
	serviceTier string
	background  bool
	turns       int
	priorBytes  int
}

// Usage is what a replica reported for one request.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int
}

// EstimatedTokens guesses the prompt's token count from its text, at
// bytesPerToken (the model's learned ratio; DefaultBytesPerToken when 0);
// a prompt of token ids is counted exactly.
func (r *R) EstimatedTokens(bytesPerToken float64) int {
	bpt := bytesPerToken
	if bpt <= 0 || r.tokenIDs {
		bpt = DefaultBytesPerToken
	}
	return max(1, int(float64(r.textBytes)/bpt))
}

// API returns the endpoint the request came in on.
func (r *R) API() API { return r.api }

// Header returns the client's headers.
func (r *R) Header() http.Header { return r.header }

// ID returns the request's X-Request-Id ("" when none).
func (r *R) ID() string { return r.id }

// Model returns the requested model.
func (r *R) Model() string { return r.model }

// Stream reports whether the client asked for a stream.
func (r *R) Stream() bool { return r.stream }

// WantUsage reports whether a streaming client asked for the usage chunk.
func (r *R) WantUsage() bool { return r.wantUsage }

// Principal returns who sent the request, nil without tenancy.
func (r *R) Principal() *tenancy.Principal { return r.principal }

// TenantID is the sender's tenant, "" when unknown.
func (r *R) TenantID() string {
	if r.principal == nil {
		return ""
	}
	return r.principal.TenantID
}

// Session returns the request's session key.
func (r *R) Session() session.Key { return r.session }

// SetSession overrides the session key derived from the request (the
// Responses API keys a chained run by its root).
func (r *R) SetSession(k session.Key) { r.session = k }

// TextBytes is the size of the prompt's text (DefaultBytesPerToken per
// id for a prompt of token ids).
func (r *R) TextBytes() int { return r.textBytes }

// TokenIDs reports whether the prompt is token ids.
func (r *R) TokenIDs() bool { return r.tokenIDs }

// CacheSalt is the salt the replica caches the prompt under: the
// client's, joined with an isolated tenant's.
func (r *R) CacheSalt() string { return r.cacheSalt }

// MaxTokens is max_completion_tokens or max_tokens, 0 when unset.
func (r *R) MaxTokens() int { return r.maxTokens }

// Turns is the number of assistant turns in a chat conversation so far.
func (r *R) Turns() int { return r.turns }

// Parts returns the views of a chat request's messages and tools into
// its body (tools absent when the request has none; both absent for a
// completions request), for readers that render the conversation
// themselves (the break locator). They must not outlive the request.
func (r *R) Parts() (messages, tools gjson.Result) { return r.messages, r.tools }

// HeldBytes is the prompt's bytes that the replica serving the session is
// expected to hold cached: the tools and the conversation up to its last
// assistant turn (0 on a first turn).
func (r *R) HeldBytes() int {
	if r.turns == 0 {
		return 0
	}
	held := r.priorBytes
	if r.tools.IsArray() {
		held += len(r.tools.Raw)
	}
	return held
}
