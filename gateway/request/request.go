// Package request is the per-request value every stage of the gateway
// reads: an inference request parsed once (the original body plus the
// fields admission, routing and accounting need, located with gjson so a
// large conversation is never unmarshalled into Go values), its sender,
// session key and scheduling class, and the bodies derived from it (the
// upstream body, the /tokenize body, the rendered text). It is a leaf:
// it imports no stage, and holds no routing or admission state.
package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/warmpath/warmpath/internal/apierror"
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

// Parse validates and parses a chat or completions body sent with
// headers h by p (nil when nobody authenticated it, as in the offline
// analyzer). The tenant scopes the session key, so one tenant can neither
// steer nor read another's session; a model outside p's allow-list is a
// 403; an isolated tenant's cache salt joins the client's own. Its other
// errors are 400s naming the offending parameter. The Request refers to
// body, which the caller must not modify afterwards.
func Parse(api API, h http.Header, body []byte, p *tenancy.Principal) (*R, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, apierror.BadRequest("", "request body is empty; expected a JSON object")
	}
	valid := validate(body)
	r, err := parseFields(api, h, body, p)
	if !valid() {
		return nil, apierror.BadRequest("", "request body is not valid JSON")
	}
	return r, err
}

// parallelValidateBytes is the body size from which validate runs beside
// the parse: for a 16k-token prompt (~100 KB) the validation pass is a
// fifth of the parse's time.
const parallelValidateBytes = 64 << 10

// validate reports whether body is valid JSON: a large body on a
// goroutine of its own, joined by the one call of the func it returns,
// while the parse (which reads invalid JSON without failing; its result
// is then dropped) runs beside it.
func validate(body []byte) func() bool {
	if len(body) < parallelValidateBytes {
		ok := gjson.ValidBytes(body)
		return func() bool { return ok }
	}
	done := make(chan bool, 1)
	go func() { done <- gjson.ValidBytes(body) }()
	return func() bool { return <-done }
}

// parseFields is Parse's parse of a body that may not be valid
// JSON (Parse drops its result then).
func parseFields(api API, h http.Header, body []byte, p *tenancy.Principal) (*R, error) {
	root := parseBody(body)
	if !root.IsObject() {
		return nil, apierror.BadRequest("", "request body must be a JSON object")
	}
	f, err := scanTop(root)
	if err != nil {
		return nil, err
	}
	r := &R{api: api, body: body, header: h, principal: p, id: h.Get("X-Request-Id"), top: f.seen}
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
	case Chat:
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
	case Completions:
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
				r.textBytes, r.tokenIDs = DefaultBytesPerToken*len(r.prompt.Array()), true
			case first.IsArray():
				r.textBytes, r.tokenIDs = DefaultBytesPerToken*len(first.Array()), true
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
	r.session = session.Identify(r.TenantID(), h, session.Body{
		SessionID:        f.sessionID.String(),
		PromptCacheKey:   f.promptCacheKey.String(),
		User:             f.user.String(),
		SafetyIdentifier: f.safetyIdentifier.String(),
		Opening:          opening,
	})
	return r, nil
}

// parseBody is gjson.ParseBytes without its copy of the body: the
// Request's views alias body, which nothing writes after it is read (the
// upstream body is a new buffer). The copy was a tenth of a 16k-token
// prompt's parse.
func parseBody(body []byte) gjson.Result {
	return gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
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
// upstream body rewrites (UpstreamBody).
type topSeen struct {
	sessionID, priority, streamOptions, cacheSalt bool
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
			dst, f.seen.streamOptions = &f.streamOptions, true
		case "cache_salt":
			dst, f.seen.cacheSalt = &f.cacheSalt, true
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
// renders it for ApproxText, and returns the conversation's opening:
// system and developer messages, the tools, and the first user message.
// Each message is read in one pass over its fields.
func (r *R) scanMessages() ([]byte, error) {
	var open openingParts
	var bad error
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
		open.add(role.Str, content.Raw)
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
		r.textBytes += len(r.tools.Raw)
	}
	r.text = text
	return open.render(r.tools), nil
}

// openingParts collects a conversation's opening: its system and
// developer messages up to and including the first user message. It is
// rendered once its size is known, in one allocation (a 16k-token first
// message is ~100 KB).
type openingParts struct {
	parts   []string // role, content, role, content…
	n       int
	sawUser bool
}

func (o *openingParts) add(role, content string) {
	if o.sawUser || (role != "system" && role != "developer" && role != "user") {
		return
	}
	o.sawUser = role == "user"
	o.parts = append(o.parts, role, content)
	o.n += len(role) + len(content) + 2
}

// render joins the opening as role\0content\0… followed by the tools.
func (o *openingParts) render(tools gjson.Result) []byte {
	var toolsRaw string
	if tools.IsArray() {
		toolsRaw = tools.Raw
	}
	if o.n == 0 && toolsRaw == "" {
		return nil
	}
	b := make([]byte, 0, o.n+len(toolsRaw))
	for _, p := range o.parts {
		b = append(b, p...)
		b = append(b, 0)
	}
	return append(b, toolsRaw...)
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

// appendMessageText appends one message as ApproxText renders it: its
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

// UpstreamBody is the body sent to the replica: the client's, with
// stream_options.include_usage forced on for streams (the gateway meters
// every request; the extra chunk is removed again for clients that did not
// ask), the session key passed on as vLLM's session_id so the engine tags
// the blocks it stores with it, an isolated tenant's cache_salt, and the
// class applied (classBody; vllmPriority is queue.vllm_priority).
func (r *R) UpstreamBody(vllmPriority bool) ([]byte, error) {
	body, err := r.upstreamFields()
	if err != nil {
		return nil, err
	}
	return r.classBody(body, vllmPriority)
}

// upstreamFields is UpstreamBody before the class is applied.
func (r *R) upstreamFields() ([]byte, error) {
	body := r.body
	var add []byte // fields the body lacks, appended without a scan of it
	var err error
	if r.stream && !r.wantUsage {
		if !r.top.streamOptions {
			add = appendField(add, "stream_options", json.RawMessage(`{"include_usage":true}`))
		} else if body, err = sjson.SetBytes(body, "stream_options.include_usage", true); err != nil {
			return nil, err
		}
	}
	if r.session.Value != "" && !r.top.sessionID {
		add = appendField(add, "session_id", r.session.Value)
	}
	if r.cacheSalt != "" && r.clientSalt != r.cacheSalt {
		// An isolated tenant's salt (joined with the client's own): its
		// cached prefixes are shared with nobody, nor can they be timed.
		if !r.top.cacheSalt {
			add = appendField(add, "cache_salt", r.cacheSalt)
		} else if body, err = sjson.SetBytes(body, "cache_salt", r.cacheSalt); err != nil {
			return nil, err
		}
	}
	return appendFields(body, add), nil
}

// appendField appends "key":value to fields, comma-separated.
func appendField(fields []byte, key string, value any) []byte {
	if len(fields) > 0 {
		fields = append(fields, ',')
	}
	k, _ := json.Marshal(key)
	v, _ := json.Marshal(value) // strings and raw JSON: cannot fail
	fields = append(append(append(fields, k...), ':'), v...)
	return fields
}

// appendFields returns obj, a valid JSON object, with fields (from
// appendField, none of them in obj) added before its closing brace, in a
// new buffer. Unlike sjson it does not scan obj for the keys: a 16k-token
// prompt's body is ~100 KB.
func appendFields(obj, fields []byte) []byte {
	if len(fields) == 0 {
		return obj
	}
	end := len(bytes.TrimRight(obj, " \t\r\n")) - 1 // the closing brace
	inner := bytes.TrimRight(obj[:end], " \t\r\n")
	out := make([]byte, 0, len(inner)+len(fields)+2)
	out = append(out, inner...)
	if inner[len(inner)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, fields...)
	return append(out, '}')
}

// TokenizeBody is the body for vLLM's POST /tokenize that yields the token
// ids the engine will see: the chat form applies the chat template.
// It returns nil when the prompt is already token ids (see PromptTokenIDs).
func (r *R) TokenizeBody() []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	mb, _ := json.Marshal(r.model)
	b.Write(mb)
	switch r.api {
	case Chat:
		b.WriteString(`,"messages":`)
		b.WriteString(r.messages.Raw)
		if r.tools.IsArray() {
			b.WriteString(`,"tools":`)
			b.WriteString(r.tools.Raw)
		}
		b.WriteString(`,"add_generation_prompt":true}`)
	case Completions:
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

// Tokenizer tokenizes prompts in process, as a replica's /tokenize would.
type Tokenizer interface {
	// Chat tokenizes a chat prompt of model with add_generation_prompt:
	// messages and tools are the request's JSON arrays (tools "" when
	// absent).
	Chat(model, messages, tools string) ([]uint32, error)
	// Prompt tokenizes a completions prompt's text.
	Prompt(model, text string) ([]uint32, error)
}

// LocalTokens tokenizes r's prompt with tok, as TokenizeBody's body
// would be; r's prompt is text (PromptTokenIDs covers ids).
func (r *R) LocalTokens(tok Tokenizer) ([]uint32, error) {
	if r.api == Chat {
		var tools string
		if r.tools.IsArray() {
			tools = r.tools.Raw
		}
		return tok.Chat(r.model, r.messages.Raw, tools)
	}
	p := r.prompt
	if p.IsArray() {
		p = p.Array()[0]
	}
	if p.Type != gjson.String {
		return nil, errors.New("request: prompt is not text")
	}
	return tok.Prompt(r.model, p.String())
}

// PromptTokenIDs returns the prompt's token ids when a completions request
// sends them directly, so no tokenizer is needed.
func (r *R) PromptTokenIDs() ([]uint32, bool) {
	if r.api != Completions || !r.prompt.IsArray() {
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

// ApproxText renders the conversation for the approximate index and the
// session fingerprint: each message's role and text, in order, so a
// conversation's turns render as prefixes of each other whatever JSON
// formatting the client uses. It is rendered once per request.
func (r *R) ApproxText() []byte {
	if r.text == nil {
		r.text = r.renderText()
	}
	return r.text
}

// renderText renders a completions prompt (a chat request's text is
// rendered by scanMessages).
func (r *R) renderText() []byte {
	if r.api != Completions {
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
