package request

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

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
