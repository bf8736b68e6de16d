package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/session"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// API says which OpenAI endpoint a request came in on.
type API int

// The inference APIs the routed client forwards.
const (
	APIChat        API = iota // POST /v1/chat/completions
	APICompletions            // POST /v1/completions
)

func (k API) path() string {
	if k == APICompletions {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// Request is an inference request parsed once: the original body plus the
// fields routing and accounting need, located with gjson so large
// conversations are never unmarshalled into Go values. Build one with
// ParseRequest and send it with Gateway.Do.
type Request struct {
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
	// before (or instead of) tokenizing; four bytes a token for prompts
	// of token ids (tokenIDs).
	textBytes int
	tokenIDs  bool
	cacheSalt string
	maxTokens int    // max_completion_tokens or max_tokens, 0 when unset
	text      []byte // approxText: rendered by scanMessages (chat), else once on first use
	// clientSalt is the body's own cache_salt ("" when none), top which
	// top-level fields the body carries that the upstream body rewrites.
	clientSalt string
	top        topSeen
	// early is the tokenization route started before the session lookup
	// (tokenizeEarly), nil when it did not.
	early *tokenCall
	// placement is the request's routing, prepared before admission
	// (placement.go); nil until then.
	placement *placement

	// Admission (priority.go, queue.go): the class and what chose it
	// (background marks a Responses background turn, background: true,
	// set through SetBackground); the conversation's turns so far
	// (assistant messages) and the prompt bytes up to the last of them,
	// which the replica serving the session is expected to hold cached;
	// and the time spent in the queue.
	class       fairq.Class
	serviceTier string
	background  bool
	turns       int
	priorBytes  int
	queueWait   time.Duration

	// bytesPerToken is the model's learned ratio (see tokenRatios), 0
	// while unknown; the gateway sets it before routing.
	bytesPerToken float64
}

// estimatedTokens guesses the prompt's token count from its text, at the
// model's learned bytes per token (defaultBytesPerToken until one is
// learned); a prompt of token ids is counted exactly.
func (r *Request) estimatedTokens() int {
	bpt := r.bytesPerToken
	if bpt <= 0 || r.tokenIDs {
		bpt = defaultBytesPerToken
	}
	return max(1, int(float64(r.textBytes)/bpt))
}

// Model returns the requested model.
func (r *Request) Model() string { return r.model }

// tenantID is the sender's tenant, "" when unknown.
func (r *Request) tenantID() string {
	if r.principal == nil {
		return ""
	}
	return r.principal.TenantID
}

// Session returns the request's session key.
func (r *Request) Session() session.Key { return r.session }

// SetSession overrides the session key derived from the request (the
// Responses API keys a chained run by its root).
func (r *Request) SetSession(k session.Key) { r.session = k }

// ParseRequest validates and parses a chat or completions body sent with
// headers h by p (nil when nobody authenticated it, as in the offline
// analyzer). The tenant scopes the session key, so one tenant can neither
// steer nor read another's session; a model outside p's allow-list is a
// 403; an isolated tenant's cache salt joins the client's own. Its other
// errors are 400s naming the offending parameter.
func ParseRequest(api API, h http.Header, body []byte, p *tenancy.Principal) (*Request, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, apierror.BadRequest("", "request body is empty; expected a JSON object")
	}
	if !gjson.ValidBytes(body) {
		return nil, apierror.BadRequest("", "request body is not valid JSON")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, apierror.BadRequest("", "request body must be a JSON object")
	}
	f, err := scanTop(root)
	if err != nil {
		return nil, err
	}
	r := &Request{api: api, body: body, header: h, principal: p, id: h.Get("X-Request-Id"), top: f.seen}
	if f.model.Type != gjson.String || f.model.String() == "" {
		return nil, apierror.BadRequest("model", "you must provide a model parameter")
	}
	r.model = f.model.String()
	if s := f.stream; s.Exists() && s.Type != gjson.Null {
		if s.Type != gjson.True && s.Type != gjson.False {
			return nil, apierror.BadRequest("stream", "stream must be a boolean")
		}
		r.stream = s.Bool()
	}
	if so := f.streamOptions; so.Exists() && so.Type != gjson.Null {
		if !so.IsObject() {
			return nil, apierror.BadRequest("stream_options", "stream_options must be an object")
		}
		r.wantUsage = so.Get("include_usage").Bool()
	}
	if cs := f.cacheSalt; cs.Exists() && cs.Type != gjson.Null {
		if cs.Type != gjson.String || cs.String() == "" {
			return nil, apierror.BadRequest("cache_salt", "cache_salt must be a non-empty string")
		}
		r.cacheSalt = cs.String()
	}
	r.clientSalt = r.cacheSalt
	if mt := f.maxCompletionTokens; mt.Type == gjson.Number {
		r.maxTokens = int(max(0, min(mt.Int(), 1<<20)))
	} else if mt := f.maxTokens; mt.Type == gjson.Number {
		r.maxTokens = int(max(0, min(mt.Int(), 1<<20)))
	}
	if p != nil {
		if err := p.Allows(r.model); err != nil {
			return nil, err
		}
		r.cacheSalt = p.CacheSalt(r.cacheSalt)
	}
	if err := r.parseClass(f.serviceTier); err != nil {
		return nil, err
	}
	var opening []byte
	switch api {
	case APIChat:
		r.messages = f.messages
		if !r.messages.IsArray() {
			return nil, apierror.BadRequest("messages", "messages must be a non-empty array")
		}
		r.tools = f.tools
		if r.tools.Exists() && r.tools.Type != gjson.Null && !r.tools.IsArray() {
			return nil, apierror.BadRequest("tools", "tools must be an array")
		}
		if opening, err = r.scanMessages(); err != nil {
			return nil, err
		}
	case APICompletions:
		r.prompt = f.prompt
		switch {
		case r.prompt.Type == gjson.String:
			r.textBytes = len(r.prompt.String())
		case r.prompt.IsArray() && len(r.prompt.Array()) > 0:
			first := r.prompt.Array()[0]
			switch {
			case first.Type == gjson.String:
				r.textBytes = len(first.String())
			case first.Type == gjson.Number:
				r.textBytes, r.tokenIDs = defaultBytesPerToken*len(r.prompt.Array()), true
			case first.IsArray():
				r.textBytes, r.tokenIDs = defaultBytesPerToken*len(first.Array()), true
			default:
				return nil, apierror.BadRequest("prompt", "prompt must be a string, an array of strings, or token ids")
			}
		default:
			return nil, apierror.BadRequest("prompt", "prompt must be a non-empty string or array")
		}
		// Completions carry no roles, so no opening can be told from the
		// rest: keying on the prompt's start would merge every request
		// that shares a system prompt into one session. They are sessions
		// only when the client names one; prefix routing still applies.
	}
	r.session = session.Identify(r.tenantID(), h, session.Body{
		SessionID:        f.sessionID.String(),
		PromptCacheKey:   f.promptCacheKey.String(),
		User:             f.user.String(),
		SafetyIdentifier: f.safetyIdentifier.String(),
		Opening:          opening,
	})
	return r, nil
}

// topFields are the body's top-level fields the gateway reads, found in
// one pass over the body (each gjson Get of an absent field would scan
// all of it: a 16k-token prompt is ~100 KB).
type topFields struct {
	model, stream, streamOptions, cacheSalt, maxCompletionTokens, maxTokens, serviceTier gjson.Result
	messages, tools, prompt                                                              gjson.Result
	sessionID, promptCacheKey, user, safetyIdentifier                                    gjson.Result
	seen                                                                                 topSeen
}

// topSeen records which top-level fields the client sent that the
// upstream body rewrites (upstreamBody, classBody).
type topSeen struct {
	sessionID, priority bool
}

// scanTop finds the top-level fields of root, an object. A field the
// gateway reads that appears twice is a 400: the gateway and the engine
// could disagree on which one counts (the model the tenant may use, say).
func scanTop(root gjson.Result) (topFields, error) {
	var f topFields
	var dup string
	root.ForEach(func(k, v gjson.Result) bool {
		var dst *gjson.Result
		switch k.Str {
		case "model":
			dst = &f.model
		case "stream":
			dst = &f.stream
		case "stream_options":
			dst = &f.streamOptions
		case "cache_salt":
			dst = &f.cacheSalt
		case "max_completion_tokens":
			dst = &f.maxCompletionTokens
		case "max_tokens":
			dst = &f.maxTokens
		case "service_tier":
			dst = &f.serviceTier
		case "messages":
			dst = &f.messages
		case "tools":
			dst = &f.tools
		case "prompt":
			dst = &f.prompt
		case "session_id":
			dst, f.seen.sessionID = &f.sessionID, true
		case "prompt_cache_key":
			dst = &f.promptCacheKey
		case "user":
			dst = &f.user
		case "safety_identifier":
			dst = &f.safetyIdentifier
		case "priority":
			f.seen.priority = true
			return true
		default:
			return true
		}
		if dst.Exists() {
			dup = k.Str
			return false
		}
		*dst = v
		return true
	})
	if dup != "" {
		return f, apierror.BadRequest(dup, "%s appears more than once", dup)
	}
	return f, nil
}

// scanMessages checks each message's shape, sums the prompt text,
// renders it for approxText, and returns the conversation's opening:
// system and developer messages, the tools, and the first user message.
// Each message is read in one pass over its fields.
func (r *Request) scanMessages() ([]byte, error) {
	var opening []byte
	var bad error
	sawUser := false
	i := 0
	text := make([]byte, 0, len(r.messages.Raw)+len(r.tools.Raw)+16)
	if r.tools.IsArray() {
		text = append(text, "tools\x00"...)
		text = append(text, r.tools.Raw...)
		text = append(text, 0)
	}
	r.messages.ForEach(func(_, msg gjson.Result) bool {
		if !msg.IsObject() {
			bad = apierror.BadRequest("messages", "messages[%d] must be an object", i)
			return false
		}
		role, content, toolCalls := messageFields(msg)
		if role.Type != gjson.String || role.String() == "" {
			bad = apierror.BadRequest("messages", "messages[%d].role must be a non-empty string", i)
			return false
		}
		switch {
		case content.Type == gjson.String, content.Type == gjson.Null, !content.Exists(), content.IsArray():
		default:
			bad = apierror.BadRequest("messages", "messages[%d].content must be a string, an array of parts or null", i)
			return false
		}
		r.textBytes += len(content.Raw) + len(toolCalls.Raw)
		if role.Str == "assistant" {
			r.turns, r.priorBytes = r.turns+1, r.textBytes
		}
		if !sawUser {
			switch role.Str {
			case "system", "developer", "user":
				sawUser = role.Str == "user"
				opening = append(opening, role.Str...)
				opening = append(opening, 0)
				opening = append(opening, content.Raw...)
				opening = append(opening, 0)
			}
		}
		text = appendMessageText(text, role, content, toolCalls)
		i++
		return true
	})
	if bad != nil {
		return nil, bad
	}
	if i == 0 {
		return nil, apierror.BadRequest("messages", "messages must be a non-empty array")
	}
	if r.tools.IsArray() {
		opening = append(opening, r.tools.Raw...)
		r.textBytes += len(r.tools.Raw)
	}
	r.text = text
	return opening, nil
}

// messageFields returns a message's role, content and tool_calls (the
// first of each), in one pass over its fields.
func messageFields(msg gjson.Result) (role, content, toolCalls gjson.Result) {
	msg.ForEach(func(k, v gjson.Result) bool {
		switch {
		case k.Str == "role" && !role.Exists():
			role = v
		case k.Str == "content" && !content.Exists():
			content = v
		case k.Str == "tool_calls" && !toolCalls.Exists():
			toolCalls = v
		}
		return true
	})
	return role, content, toolCalls
}

// appendMessageText appends one message as approxText renders it: its
// role, its text (a string, or the text of its parts), its tool calls.
func appendMessageText(b []byte, role, content, toolCalls gjson.Result) []byte {
	b = append(b, role.String()...)
	b = append(b, 0)
	if content.Type == gjson.String {
		b = append(b, content.String()...)
	} else {
		content.ForEach(func(_, part gjson.Result) bool {
			b = append(b, part.Get("text").String()...)
			return true
		})
	}
	if toolCalls.Exists() {
		b = append(b, strings.TrimSpace(toolCalls.Raw)...)
	}
	return append(b, 0)
}

// upstreamBody is the body sent to the replica: the client's, with
// stream_options.include_usage forced on for streams (the gateway meters
// every request; the extra chunk is removed again for clients that did not
// ask), the session key passed on as vLLM's session_id so the engine tags
// the blocks it stores with it, and an isolated tenant's cache_salt.
func (r *Request) upstreamBody() ([]byte, error) {
	body := r.body
	var err error
	if r.stream && !r.wantUsage {
		if body, err = sjson.SetBytes(body, "stream_options.include_usage", true); err != nil {
			return nil, err
		}
	}
	if r.session.Value != "" && !r.top.sessionID {
		if body, err = sjson.SetBytes(body, "session_id", r.session.Value); err != nil {
			return nil, err
		}
	}
	if r.cacheSalt != "" && r.clientSalt != r.cacheSalt {
		// An isolated tenant's salt (joined with the client's own): its
		// cached prefixes are shared with nobody, nor can they be timed.
		if body, err = sjson.SetBytes(body, "cache_salt", r.cacheSalt); err != nil {
			return nil, err
		}
	}
	return body, nil
}

// tokenizeBody is the body for vLLM's POST /tokenize that yields the token
// ids the engine will see: the chat form applies the chat template.
// It returns nil when the prompt is already token ids (see promptTokenIDs).
func (r *Request) tokenizeBody() []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	mb, _ := json.Marshal(r.model)
	b.Write(mb)
	switch r.api {
	case APIChat:
		b.WriteString(`,"messages":`)
		b.WriteString(r.messages.Raw)
		if r.tools.IsArray() {
			b.WriteString(`,"tools":`)
			b.WriteString(r.tools.Raw)
		}
		b.WriteString(`,"add_generation_prompt":true}`)
	case APICompletions:
		p := r.prompt
		if p.IsArray() {
			p = p.Array()[0]
		}
		if p.Type != gjson.String {
			return nil
		}
		b.WriteString(`,"prompt":`)
		b.WriteString(p.Raw)
		b.WriteString(`}`)
	}
	return b.Bytes()
}

// promptTokenIDs returns the prompt's token ids when a completions request
// sends them directly, so no tokenizer is needed.
func (r *Request) promptTokenIDs() ([]uint32, bool) {
	if r.api != APICompletions || !r.prompt.IsArray() {
		return nil, false
	}
	arr := r.prompt.Array()
	if len(arr) > 0 && arr[0].IsArray() {
		arr = arr[0].Array()
	}
	out := make([]uint32, 0, len(arr))
	for _, v := range arr {
		if v.Type != gjson.Number || v.Num < 0 || v.Num > 1<<32-1 {
			return nil, false
		}
		out = append(out, uint32(v.Uint()))
	}
	return out, len(out) > 0
}

// approxText renders the conversation for the approximate index and the
// session fingerprint: each message's role and text, in order, so a
// conversation's turns render as prefixes of each other whatever JSON
// formatting the client uses. It is rendered once per request.
func (r *Request) approxText() []byte {
	if r.text == nil {
		r.text = r.renderText()
	}
	return r.text
}

// renderText renders a completions prompt (a chat request's text is
// rendered by scanMessages).
func (r *Request) renderText() []byte {
	if r.api != APICompletions {
		return []byte{}
	}
	p := r.prompt
	if p.IsArray() {
		p = p.Array()[0]
	}
	if p.Type == gjson.String {
		return []byte(p.String())
	}
	return []byte(p.Raw)
}
