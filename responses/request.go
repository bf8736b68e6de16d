package responses

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"unicode/utf8"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
)

// createRequest is the CreateResponse body. Unions stay raw until
// parseCreate checks them; fields warmpath ignores are listed in doc.go.
type createRequest struct {
	Model              string            `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       json.RawMessage   `json:"instructions"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Conversation       json.RawMessage   `json:"conversation"`
	Store              *bool             `json:"store"`
	Stream             *bool             `json:"stream"`
	Background         *bool             `json:"background"`
	Tools              json.RawMessage   `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	MaxToolCalls       *int              `json:"max_tool_calls"`
	Text               json.RawMessage   `json:"text"`
	Reasoning          json.RawMessage   `json:"reasoning"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	TopLogprobs        *int              `json:"top_logprobs"`
	Truncation         *string           `json:"truncation"`
	Metadata           map[string]string `json:"metadata"`
	User               *string           `json:"user"`
	SafetyIdentifier   *string           `json:"safety_identifier"`
	PromptCacheKey     *string           `json:"prompt_cache_key"`
	ServiceTier        *string           `json:"service_tier"`
	Include            []string          `json:"include"`
	Prompt             json.RawMessage   `json:"prompt"`
	ContextManagement  json.RawMessage   `json:"context_management"`
}

// params is a validated CreateResponse: everything the turn needs, with
// defaults applied.
type params struct {
	raw          *createRequest
	model        string
	input        []Item // may hold unresolved item references
	instructions *string
	previous     string
	conversation string
	store        bool
	stream       bool
	background   bool
	tools        []chatTool
	toolsEcho    json.RawMessage
	toolChoice   any // chat tool_choice; nil when not sent
	choiceEcho   json.RawMessage
	format       any // chat response_format; nil for text
	textEcho     json.RawMessage
	effort       string
	logprobs     bool
}

// parseCreate decodes and validates a CreateResponse body. Every problem is
// a 400 in OpenAI's envelope naming the field.
func parseCreate(body []byte) (*params, error) {
	var r createRequest
	if err := decodeObject(body, &r); err != nil {
		return nil, err
	}
	p := &params{raw: &r, model: r.Model, store: true, previous: deref(r.PreviousResponseID)}
	if r.Model == "" {
		return nil, apierror.BadRequest("model", "Missing required parameter: 'model'.")
	}
	if err := rejectUnsupported(&r); err != nil {
		return nil, err
	}
	var err error
	if p.input, err = parseInput(r.Input, "input"); err != nil {
		return nil, err
	}
	if p.instructions, err = parseInstructions(r.Instructions); err != nil {
		return nil, err
	}
	if p.conversation, err = conversationID(r.Conversation); err != nil {
		return nil, err
	}
	if p.conversation != "" && p.previous != "" {
		return nil, apierror.BadRequest("conversation", "previous_response_id cannot be used in conjunction with conversation.")
	}
	p.store = r.Store == nil || *r.Store
	p.stream = r.Stream != nil && *r.Stream
	p.background = r.Background != nil && *r.Background
	if p.background && !p.store {
		return nil, apierror.BadRequest("background", "background mode requires store: true.")
	}
	if p.conversation != "" && !p.store {
		return nil, apierror.BadRequest("store", "store: false cannot be used with conversation: a conversation stores every turn.")
	}
	if err := validateSampling(&r); err != nil {
		return nil, err
	}
	if err := validateMetadata(r.Metadata, "metadata"); err != nil {
		return nil, err
	}
	if err := p.parseTools(); err != nil {
		return nil, err
	}
	if err := p.parseText(); err != nil {
		return nil, err
	}
	if err := p.parseReasoning(); err != nil {
		return nil, err
	}
	p.logprobs = (r.TopLogprobs != nil && *r.TopLogprobs > 0) || slices.Contains(r.Include, "message.output_text.logprobs")
	return p, nil
}

// decodeObject unmarshals a JSON object body into v, mapping every decode
// error onto a 400 that names the field when it can.
func decodeObject(body []byte, v any) error {
	b := bytes.TrimSpace(body)
	if len(b) == 0 {
		return apierror.BadRequest("", "request body is empty; expected a JSON object")
	}
	if b[0] != '{' {
		return apierror.BadRequest("", "request body must be a JSON object")
	}
	if err := json.Unmarshal(b, v); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			return apierror.BadRequest(te.Field, "Invalid type for '%s': %s", te.Field, jsonErrText(err))
		}
		return apierror.BadRequest("", "request body is not valid JSON: %v", err)
	}
	return nil
}

func rejectUnsupported(r *createRequest) error {
	if isSet(r.Prompt) {
		return apierror.BadRequest("prompt", "prompt templates are not supported: send instructions and input instead.")
	}
	if isSet(r.ContextManagement) {
		return apierror.BadRequest("context_management", "context_management (compaction) is not supported.")
	}
	if r.Truncation != nil && *r.Truncation != "disabled" {
		return apierror.BadRequest("truncation", "truncation %q is not supported; only \"disabled\" (over-long input fails with 400).", *r.Truncation)
	}
	return nil
}

func isSet(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && string(raw) != "null"
}

func parseInstructions(raw json.RawMessage) (*string, error) {
	if !isSet(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, apierror.BadRequest("instructions", "instructions must be a string or null.")
	}
	return &s, nil
}

// conversationID accepts "conv_…" or {"id":"conv_…"}.
func conversationID(raw json.RawMessage) (string, error) {
	if !isSet(raw) {
		return "", nil
	}
	raw = bytes.TrimSpace(raw)
	var id string
	var err error
	if raw[0] == '{' {
		var o struct {
			ID string `json:"id"`
		}
		err = json.Unmarshal(raw, &o)
		id = o.ID
	} else {
		err = json.Unmarshal(raw, &id)
	}
	if err != nil || id == "" {
		return "", apierror.BadRequest("conversation", "conversation must be a conversation ID or {\"id\": …}.")
	}
	return id, nil
}

func validateSampling(r *createRequest) error {
	switch {
	case r.Temperature != nil && (*r.Temperature < 0 || *r.Temperature > 2):
		return apierror.BadRequest("temperature", "temperature must be between 0 and 2.")
	case r.TopP != nil && (*r.TopP < 0 || *r.TopP > 1):
		return apierror.BadRequest("top_p", "top_p must be between 0 and 1.")
	case r.TopLogprobs != nil && (*r.TopLogprobs < 0 || *r.TopLogprobs > 20):
		return apierror.BadRequest("top_logprobs", "top_logprobs must be between 0 and 20.")
	case r.MaxOutputTokens != nil && *r.MaxOutputTokens < 16:
		return apierror.BadRequest("max_output_tokens", "max_output_tokens must be at least 16.")
	case r.MaxToolCalls != nil && *r.MaxToolCalls < 1:
		return apierror.BadRequest("max_tool_calls", "max_tool_calls must be at least 1.")
	}
	return nil
}

// validateMetadata applies OpenAI's limits: at most 16 pairs, keys up to
// 64 characters, values up to 512.
func validateMetadata(m map[string]string, param string) error {
	if len(m) > 16 {
		return apierror.BadRequest(param, "%s has %d pairs; at most 16 are allowed.", param, len(m))
	}
	for k, v := range m {
		if utf8.RuneCountInString(k) > 64 {
			return apierror.BadRequest(param, "%s keys must be at most 64 characters.", param)
		}
		if utf8.RuneCountInString(v) > 512 {
			return apierror.BadRequest(param, "%s values must be at most 512 characters.", param)
		}
	}
	return nil
}

// chatTool is a chat-completions function tool.
type chatTool struct {
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

type rawTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
	Tools       []rawTool       `json:"tools"`
}

// droppedTools are hosted tools removed from the request instead of
// refused: agent harnesses (Codex) offer web search on every request, and
// under tool_choice "auto" a model is always free not to search, so
// removing it breaks no contract. Forcing one with tool_choice is a 400.
var droppedTools = map[string]bool{"web_search": true, "web_search_preview": true, "web_search_preview_2025_03_11": true}

// namespaceSep joins a namespace and a function name into one chat tool
// name. A dot never occurs in an OpenAI function name, so the split back is
// unambiguous.
const namespaceSep = "."

func (p *params) parseTools() error {
	raw := p.raw.Tools
	p.toolsEcho = emptyArray
	if !isSet(raw) {
		return p.parseToolChoice()
	}
	var tools []rawTool
	if err := json.Unmarshal(raw, &tools); err != nil {
		return apierror.BadRequest("tools", "tools must be an array of tools: %s", jsonErrText(err))
	}
	echo := make([]json.RawMessage, 0, len(tools))
	var all []json.RawMessage
	_ = json.Unmarshal(raw, &all)
	for i, t := range tools {
		param := fmt.Sprintf("tools[%d]", i)
		switch {
		case t.Type == "function":
			ct, err := functionTool(t, "", param)
			if err != nil {
				return err
			}
			p.tools = append(p.tools, ct)
		case t.Type == "namespace":
			if t.Name == "" {
				return apierror.BadRequest(param+".name", "%s: a namespace needs a name", param)
			}
			for j, nt := range t.Tools {
				if nt.Type != "function" {
					return apierror.BadRequest(fmt.Sprintf("%s.tools[%d].type", param, j), "%s: namespaces may hold only function tools", param)
				}
				ct, err := functionTool(nt, t.Name, fmt.Sprintf("%s.tools[%d]", param, j))
				if err != nil {
					return err
				}
				p.tools = append(p.tools, ct)
			}
		case droppedTools[t.Type]:
			continue
		default:
			return apierror.BadRequest(param+".type",
				"%s.type %q is not supported: warmpath serves function tools (and namespaces of them) on self-hosted models; hosted built-in tools need OpenAI.", param, t.Type)
		}
		echo = append(echo, all[i])
	}
	p.toolsEcho, _ = chatapi.Marshal(echo)
	return p.parseToolChoice()
}

var functionNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func functionTool(t rawTool, namespace, param string) (chatTool, error) {
	if !functionNameRE.MatchString(t.Name) {
		return chatTool{}, apierror.BadRequest(param+".name", "%s.name must match ^[a-zA-Z0-9_-]{1,64}$", param)
	}
	name := t.Name
	if namespace != "" {
		name = namespace + namespaceSep + t.Name
	}
	params := t.Parameters
	if !isSet(params) {
		params = nil
	} else if bytes.TrimSpace(params)[0] != '{' {
		return chatTool{}, apierror.BadRequest(param+".parameters", "%s.parameters must be a JSON Schema object or null", param)
	}
	return chatTool{Type: "function", Function: chatFunction{Name: name, Description: t.Description, Parameters: params, Strict: t.Strict}}, nil
}

func (p *params) parseToolChoice() error {
	raw := bytes.TrimSpace(p.raw.ToolChoice)
	p.choiceEcho = json.RawMessage(`"auto"`)
	if !isSet(raw) {
		return nil
	}
	p.choiceEcho = raw
	if raw[0] == '"' {
		var mode string
		_ = json.Unmarshal(raw, &mode)
		switch mode {
		case "none", "auto":
		case "required":
			if len(p.tools) == 0 {
				return apierror.BadRequest("tool_choice", "tool_choice \"required\" needs at least one function tool.")
			}
		default:
			return apierror.BadRequest("tool_choice", "tool_choice %q is not one of none, auto, required.", mode)
		}
		p.toolChoice = mode
		return nil
	}
	var c struct {
		Type  string    `json:"type"`
		Name  string    `json:"name"`
		Mode  string    `json:"mode"`
		Tools []rawTool `json:"tools"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return apierror.BadRequest("tool_choice", "tool_choice must be a string or an object: %s", jsonErrText(err))
	}
	switch c.Type {
	case "function":
		if !p.hasTool(c.Name) {
			return apierror.BadRequest("tool_choice", "tool_choice names function %q, which is not in tools.", c.Name)
		}
		p.toolChoice = map[string]any{"type": "function", "function": map[string]string{"name": c.Name}}
	case "allowed_tools":
		return p.allowedTools(c.Mode, c.Tools)
	default:
		return apierror.BadRequest("tool_choice", "tool_choice type %q is not supported: only function tools run here.", c.Type)
	}
	return nil
}

func (p *params) hasTool(name string) bool {
	return slices.ContainsFunc(p.tools, func(t chatTool) bool { return t.Function.Name == name })
}

// allowedTools narrows the chat tools to the allowed ones; the mode
// becomes the chat tool_choice.
func (p *params) allowedTools(mode string, allowed []rawTool) error {
	if mode != "auto" && mode != "required" {
		return apierror.BadRequest("tool_choice.mode", "allowed_tools mode must be auto or required.")
	}
	var keep []chatTool
	for _, a := range allowed {
		if a.Type != "function" || !p.hasTool(a.Name) {
			return apierror.BadRequest("tool_choice.tools", "allowed_tools may name only function tools present in tools; %q is not.", a.Name)
		}
		i := slices.IndexFunc(p.tools, func(t chatTool) bool { return t.Function.Name == a.Name })
		keep = append(keep, p.tools[i])
	}
	p.tools, p.toolChoice = keep, mode
	return nil
}

var schemaNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func (p *params) parseText() error {
	p.textEcho = json.RawMessage(`{"format":{"type":"text"}}`)
	raw := p.raw.Text
	if !isSet(raw) {
		return nil
	}
	var t struct {
		Format *struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Schema      json.RawMessage `json:"schema"`
			Description string          `json:"description"`
			Strict      *bool           `json:"strict"`
		} `json:"format"`
		Verbosity *string `json:"verbosity"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return apierror.BadRequest("text", "text: %s", jsonErrText(err))
	}
	if t.Format == nil {
		echo := map[string]any{"format": map[string]string{"type": "text"}}
		if t.Verbosity != nil {
			echo["verbosity"] = *t.Verbosity
		}
		p.textEcho, _ = chatapi.Marshal(echo)
		return nil
	}
	p.textEcho = bytes.TrimSpace(raw)
	switch f := t.Format; f.Type {
	case "text":
	case "json_object":
		p.format = map[string]string{"type": "json_object"}
	case "json_schema":
		if !schemaNameRE.MatchString(f.Name) {
			return apierror.BadRequest("text.format.name", "text.format.name is required and must match ^[a-zA-Z0-9_-]{1,64}$.")
		}
		if !isSet(f.Schema) || bytes.TrimSpace(f.Schema)[0] != '{' {
			return apierror.BadRequest("text.format.schema", "text.format.schema is required and must be a JSON Schema object.")
		}
		js := map[string]any{"name": f.Name, "schema": f.Schema}
		if f.Description != "" {
			js["description"] = f.Description
		}
		if f.Strict != nil {
			js["strict"] = *f.Strict
		}
		p.format = map[string]any{"type": "json_schema", "json_schema": js}
	default:
		return apierror.BadRequest("text.format.type", "text.format.type %q is not one of text, json_object, json_schema.", f.Type)
	}
	return nil
}

// parseReasoning maps reasoning.effort onto vLLM's reasoning_effort, which
// takes only low, medium and high: minimal becomes low, xhigh and max
// become high, none sends nothing. Summaries are not produced (vLLM's
// reasoning parsers return raw reasoning text, not summaries).
func (p *params) parseReasoning() error {
	raw := p.raw.Reasoning
	if !isSet(raw) {
		return nil
	}
	var r struct {
		Effort *string `json:"effort"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return apierror.BadRequest("reasoning", "reasoning: %s", jsonErrText(err))
	}
	switch e := deref(r.Effort); e {
	case "", "none":
	case "minimal", "low":
		p.effort = "low"
	case "medium":
		p.effort = "medium"
	case "high", "xhigh", "max":
		p.effort = "high"
	default:
		return apierror.BadRequest("reasoning.effort", "reasoning.effort %q is not one of none, minimal, low, medium, high, xhigh, max.", e)
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
