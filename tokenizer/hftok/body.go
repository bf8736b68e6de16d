package hftok

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
	"github.com/tidwall/gjson"
)

// request is the part of a /tokenize body TokenizeBody reads, in one
// pass over the body (a Get per field would scan a long prompt each time).
type request struct {
	messages, tools, prompt gjson.Result
	addGenerationPrompt     gjson.Result
	addSpecialTokens        gjson.Result
	unsupported             string // the first field set that hftok cannot honour
}

func parseRequest(body []byte) (request, error) {
	var r request
	if !gjson.ValidBytes(body) {
		return r, errors.New("hftok: body is not JSON")
	}
	gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
		switch k.String() {
		case "messages":
			r.messages = v
		case "tools":
			r.tools = v
		case "prompt":
			r.prompt = v
		case "add_generation_prompt":
			r.addGenerationPrompt = v
		case "add_special_tokens":
			r.addSpecialTokens = v
		case "continue_final_message", "chat_template", "chat_template_kwargs", "documents", "return_token_strs":
			if v.Type != gjson.Null && v.Type != gjson.False && r.unsupported == "" {
				r.unsupported = k.String()
			}
		}
		return true
	})
	if r.unsupported != "" {
		return r, fmt.Errorf("hftok: %s is not supported", r.unsupported)
	}
	return r, nil
}

// TokenizeBody returns the ids vLLM's POST /tokenize answers for body: a
// chat ("messages", with "tools", "add_generation_prompt" default true and
// "add_special_tokens" default false) or a completions prompt ("prompt", a
// string, "add_special_tokens" default true). A body it cannot tokenize
// exactly as vLLM would (continue_final_message, chat_template_kwargs,
// content parts other than text, a template that fails) is an error, so
// the caller asks a replica instead.
func (t *Tokenizer) TokenizeBody(body []byte) ([]uint32, error) {
	r, err := parseRequest(body)
	if err != nil {
		return nil, err
	}
	if r.messages.Exists() {
		agp := r.addGenerationPrompt
		return t.tokenizeChat(r.messages, r.tools, !agp.Exists() || agp.Bool(), r.addSpecialTokens.Bool())
	}
	if r.prompt.Type != gjson.String {
		return nil, errors.New("hftok: the body has neither messages nor a string prompt")
	}
	return t.Encode(r.prompt.String(), !r.addSpecialTokens.Exists() || r.addSpecialTokens.Bool())
}

// TokenizeChat returns the ids TokenizeBody gives a body of these
// messages and tools (tools may be absent) with add_generation_prompt
// true and add_special_tokens unset: a gateway that parsed the request
// passes its arrays rather than build and parse a /tokenize body.
func (t *Tokenizer) TokenizeChat(messages, tools gjson.Result) ([]uint32, error) {
	return t.tokenizeChat(messages, tools, true, false)
}

// TokenizePrompt returns the ids TokenizeBody gives a completions prompt
// of text with add_special_tokens unset.
func (t *Tokenizer) TokenizePrompt(text string) ([]uint32, error) { return t.Encode(text, true) }

func (t *Tokenizer) tokenizeChat(messages, tools gjson.Result, addGenerationPrompt, addSpecial bool) ([]uint32, error) {
	text, err := t.RenderChat(messages, tools, addGenerationPrompt)
	if err != nil {
		return nil, err
	}
	return t.Encode(text, addSpecial)
}

// renderBody renders a chat body's messages as TokenizeBody would.
func (t *Tokenizer) renderBody(body []byte) (string, error) {
	r, err := parseRequest(body)
	if err != nil {
		return "", err
	}
	return t.renderRequest(r)
}

func (t *Tokenizer) renderRequest(r request) (string, error) {
	agp := r.addGenerationPrompt
	return t.RenderChat(r.messages, r.tools, !agp.Exists() || agp.Bool())
}

// RenderChat renders messages (and tools, when it is an array) with the
// chat template, as vLLM does before tokenizing: each message reduced to
// what vLLM keeps of it (role, content with text parts joined by "\n",
// tool_calls with their arguments parsed, tool_call_id, name, reasoning).
func (t *Tokenizer) RenderChat(messages, tools gjson.Result, addGenerationPrompt bool) (string, error) {
	c := t.chat
	if c == nil {
		return "", errors.New("hftok: the model has no chat template")
	}
	if !messages.IsArray() {
		return "", errors.New("hftok: messages is not an array")
	}
	if c.indentJSON && (tools.IsArray() || strings.Contains(messages.Raw, `"tool_calls"`)) {
		return "", errors.New("hftok: the chat template's tojson(indent=…) does not render as Python's; tools are tokenized by the replicas")
	}
	conv, err := conversation(messages)
	if err != nil {
		return "", err
	}
	vars := make(map[string]jinja.Value, len(c.vars)+4)
	for k, v := range c.vars {
		vars[k] = v
	}
	vars["messages"] = conv
	vars["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	vars["tools"], vars["documents"] = jinja.None(), jinja.None()
	tmpl := c.tmpl
	if tools.IsArray() {
		if vars["tools"], err = toolDicts(tools); err != nil {
			return "", err
		}
		if c.toolUse != nil {
			tmpl = c.toolUse
		}
	}
	out, err := renderSafely(tmpl, vars)
	if err != nil {
		return "", fmt.Errorf("hftok: chat template: %w", err)
	}
	return out, nil
}

// renderSafely renders, turning a panic in the template engine (it runs
// operator-supplied templates on client-supplied messages) into an error.
func renderSafely(tmpl *jinja.Template, vars map[string]jinja.Value) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("template engine panicked: %v", r)
		}
	}()
	return tmpl.RenderValues(vars)
}
