package request

import (
	"bytes"
	"net/http"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/session"
	"github.com/warmpath/warmpath/tenancy"
)

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
		if opening, err = r.parseChat(f.messages, f.tools); err != nil {
			return nil, err
		}
	case Completions:
		// Completions carry no roles, so no opening can be told from the
		// rest: keying on the prompt's start would merge every request
		// that shares a system prompt into one session. They are sessions
		// only when the client names one; prefix routing still applies.
		if err = r.parsePrompt(f.prompt); err != nil {
			return nil, err
		}
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

// parseChat reads a chat request's messages and tools and returns the
// conversation's opening (scanMessages).
func (r *R) parseChat(messages, tools gjson.Result) ([]byte, error) {
	r.messages = messages
	if !r.messages.IsArray() {
		return nil, apierror.BadRequest("messages", "messages must be a non-empty array")
	}
	r.tools = tools
	if r.tools.Exists() && r.tools.Type != gjson.Null && !r.tools.IsArray() {
		return nil, apierror.BadRequest("tools", "tools must be an array")
	}
	return r.scanMessages()
}

// parsePrompt reads a completions request's prompt: a string, strings,
// or token ids (one list, or a list of lists of which the first counts).
func (r *R) parsePrompt(prompt gjson.Result) error {
	r.prompt = prompt
	switch {
	case prompt.Type == gjson.String:
		r.textBytes = len(prompt.String())
	case prompt.IsArray() && len(prompt.Array()) > 0:
		first := prompt.Array()[0]
		switch {
		case first.Type == gjson.String:
			r.textBytes = len(first.String())
		case first.Type == gjson.Number:
			r.textBytes, r.tokenIDs = DefaultBytesPerToken*len(prompt.Array()), true
		case first.IsArray():
			r.textBytes, r.tokenIDs = DefaultBytesPerToken*len(first.Array()), true
		default:
			return apierror.BadRequest("prompt", "prompt must be a string, an array of strings, or token ids")
		}
	default:
		return apierror.BadRequest("prompt", "prompt must be a non-empty string or array")
	}
	return nil
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
