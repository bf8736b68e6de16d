package anthropic

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/warmpath/warmpath/internal/chatapi"
)

// chatRequest is the /v1/chat/completions body a Messages request becomes.
// Its fields marshal in declaration order and every value is built from
// the request alone, so the same request always renders to the same bytes.
type chatRequest struct {
	Model                string          `json:"model"`
	Messages             []chatMessage   `json:"messages"`
	Tools                []chatTool      `json:"tools,omitempty"`
	ToolChoice           any             `json:"tool_choice,omitempty"`
	ParallelToolCalls    *bool           `json:"parallel_tool_calls,omitempty"`
	MaxTokens            int64           `json:"max_tokens,omitempty"`
	Stop                 []string        `json:"stop,omitempty"`
	Temperature          *float64        `json:"temperature,omitempty"`
	TopP                 *float64        `json:"top_p,omitempty"`
	TopK                 *int64          `json:"top_k,omitempty"`
	ReasoningEffort      string          `json:"reasoning_effort,omitempty"`
	ResponseFormat       *responseFormat `json:"response_format,omitempty"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    chatContent    `json:"content"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

// chatContent is a message's content: a string when it is only text (the
// parts joined with "\n", as vLLM joins text parts), else an array of
// text and image_url parts.
type chatContent []chatPart

type chatPart struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

func textContent(s string) chatContent { return chatContent{{Type: "text", Text: s}} }

// MarshalJSON implements json.Marshaler.
func (c chatContent) MarshalJSON() ([]byte, error) {
	texts := make([]string, 0, len(c))
	for _, p := range c {
		if p.Type != "text" {
			return chatapi.Marshal([]chatPart(c))
		}
		texts = append(texts, p.Text)
	}
	return chatapi.Marshal(strings.Join(texts, "\n"))
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string      `json:"type"`
	Function chatToolDef `json:"function"`
}

type chatToolDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// billingPrefix starts the attribution line Claude Code puts in its first
// system block; it changes on every request (a per-request hash), so it is
// never sent: it would end the cached prefix at the first token.
const billingPrefix = "x-anthropic-billing-header:"

// stripBilling removes a leading billing line from a system text.
func stripBilling(s string) string {
	if !strings.HasPrefix(s, billingPrefix) {
		return s
	}
	_, rest, _ := strings.Cut(s, "\n")
	return strings.TrimLeft(rest, "\n")
}

// toChat translates a Messages request into a streaming chat-completions
// body (with usage in the last chunk). Translation is a pure function of
// the request, and each message renders independently of the ones after
// it, so turn N+1's chat messages begin byte for byte with turn N's.
func toChat(r *request) ([]byte, error) {
	cr := chatRequest{Model: r.Model, Stream: true, StreamOptions: &streamOptions{IncludeUsage: true}}
	var err error
	if cr.Messages, err = chatMessages(r); err != nil {
		return nil, err
	}
	if r.Messages[len(r.Messages)-1].Role == "assistant" {
		// A final assistant message is a prefill the model continues.
		no := false
		cr.AddGenerationPrompt, cr.ContinueFinalMessage = &no, true
	}
	if cr.Tools, err = chatTools(r.Tools); err != nil {
		return nil, err
	}
	cr.ToolChoice, cr.ParallelToolCalls = chatToolChoice(r.ToolChoice, cr.Tools)
	if r.MaxTokens != nil {
		cr.MaxTokens = *r.MaxTokens
	}
	for _, s := range r.StopSequences {
		if s != "" {
			cr.Stop = append(cr.Stop, s)
		}
	}
	cr.Temperature, cr.TopP, cr.TopK = r.Temperature, r.TopP, r.TopK
	if err := outputConfig(r, &cr); err != nil {
		return nil, err
	}
	return chatapi.Marshal(cr)
}

// outputConfig maps output_config: effort to reasoning_effort (chat knows
// low, medium and high; xhigh and max ask for the most there is), a JSON
// schema format to response_format.
func outputConfig(r *request, cr *chatRequest) error {
	oc := r.OutputConfig
	if oc == nil {
		return nil
	}
	switch oc.Effort {
	case "":
	case "low", "medium", "high":
		cr.ReasoningEffort = oc.Effort
	case "xhigh", "max":
		cr.ReasoningEffort = "high"
	default:
		return invalid("output_config.effort: must be one of low, medium, high, xhigh, max")
	}
	if f := oc.Format; f != nil {
		if f.Type != "json_schema" || len(bytes.TrimSpace(f.Schema)) == 0 {
			return invalid("output_config.format: only {type: json_schema, schema} is supported")
		}
		rf := &responseFormat{Type: "json_schema"}
		rf.JSONSchema.Name = "output"
		rf.JSONSchema.Schema = f.Schema
		cr.ResponseFormat = rf
	}
	return nil
}

// chatMessages renders the system prompt and the messages in order.
// Mid-conversation system messages stay where they are (hoisting them
// into the first message would rewrite the prompt's head every time one
// is added, and lose the cache).
func chatMessages(r *request) ([]chatMessage, error) {
	var out []chatMessage
	sys, err := systemText(r.System, "system")
	if err != nil {
		return nil, err
	}
	if sys != "" {
		out = append(out, chatMessage{Role: "system", Content: textContent(sys)})
	}
	for i, m := range r.Messages {
		bs, err := blocks(m.Content)
		if err != nil {
			return nil, invalid("messages.%d.content: %v", i, err)
		}
		where := fmt.Sprintf("messages.%d.content", i)
		switch m.Role {
		case "user", "ctx", "msg":
			msgs, err := userMessages(bs, where)
			if err != nil {
				return nil, err
			}
			out = append(out, msgs...)
		case "assistant":
			am, err := assistantMessage(bs, where)
			if err != nil {
				return nil, err
			}
			out = append(out, am)
		case "system":
			s, err := systemText(m.Content, where)
			if err != nil {
				return nil, err
			}
			out = append(out, chatMessage{Role: "system", Content: textContent(s)})
		default:
			return nil, invalid("messages.%d.role: must be user, assistant or system, not %q", i, m.Role)
		}
	}
	return out, nil
}

// systemText joins a system prompt's text blocks with a blank line, less
// the billing line.
func systemText(raw json.RawMessage, where string) (string, error) {
	bs, err := blocks(raw)
	if err != nil {
		return "", invalid("%s: %v", where, err)
	}
	var parts []string
	for j, b := range bs {
		if b.Type != "text" {
			return "", invalid("%s.%d.type: system content must be text blocks", where, j)
		}
		if s := stripBilling(b.Text); s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "\n\n"), nil
}

// skipped are block types that carry nothing a self-hosted engine can
// use: reasoning it would only re-read (and that vLLM's templates drop),
// and the results of Anthropic's hosted tools, which this API never
// offers.
var skipped = map[string]bool{
	"thinking": true, "redacted_thinking": true, "tool_reference": true, "container_upload": true,
	"server_tool_use": true, "web_search_tool_result": true, "web_fetch_tool_result": true,
	"code_execution_tool_result": true, "bash_code_execution_tool_result": true,
	"text_editor_code_execution_tool_result": true, "tool_search_tool_result": true,
	"mcp_tool_use": true, "mcp_tool_result": true,
}

// userMessages renders a user turn: its tool results first, as tool
// messages in order, then one user message with the rest (images returned
// by tools first, then the turn's own text and images).
func userMessages(bs []block, where string) ([]chatMessage, error) {
	var out []chatMessage
	var toolImages, parts chatContent
	for j, b := range bs {
		at := fmt.Sprintf("%s.%d", where, j)
		switch {
		case b.Type == "tool_result":
			tm, imgs, err := toolMessage(b, at)
			if err != nil {
				return nil, err
			}
			out = append(out, tm)
			toolImages = append(toolImages, imgs...)
		case skipped[b.Type]:
		default:
			p, err := contentPart(b, at)
			if err != nil {
				return nil, err
			}
			parts = append(parts, p)
		}
	}
	if len(out) > 0 && len(toolImages)+len(parts) == 0 {
		return out, nil
	}
	content := append(toolImages, parts...)
	if len(content) == 0 {
		content = textContent("")
	}
	return append(out, chatMessage{Role: "user", Content: content}), nil
}

// contentPart renders a text, image, document or search_result block.
func contentPart(b block, at string) (chatPart, error) {
	switch b.Type {
	case "text":
		return chatPart{Type: "text", Text: b.Text}, nil
	case "image":
		return imagePart(b.Source, at)
	case "document":
		s, err := documentText(b, at)
		return chatPart{Type: "text", Text: s}, err
	case "search_result":
		s, err := searchResultText(b, at)
		return chatPart{Type: "text", Text: s}, err
	}
	return chatPart{}, invalid("%s.type: content block type %q is not supported", at, b.Type)
}

// imagePart renders an image source as an image_url part: base64 data as
// a data: URI, a URL as it is.
func imagePart(raw json.RawMessage, at string) (chatPart, error) {
	var s source
	if err := json.Unmarshal(raw, &s); err != nil {
		return chatPart{}, invalid("%s.source: an object is required", at)
	}
	switch s.Type {
	case "base64":
		if s.MediaType == "" || s.Data == "" {
			return chatPart{}, invalid("%s.source: base64 images need media_type and data", at)
		}
		return chatPart{Type: "image_url", ImageURL: &imageURL{URL: "data:" + s.MediaType + ";base64," + s.Data}}, nil
	case "url":
		if s.URL == "" {
			return chatPart{}, invalid("%s.source.url: field required", at)
		}
		return chatPart{Type: "image_url", ImageURL: &imageURL{URL: s.URL}}, nil
	}
	return chatPart{}, invalid("%s.source.type: image sources must be base64 or url (the Files API is not served)", at)
}

// documentText renders a plain-text document (a text source, base64
// text/plain, or content blocks) under its title. PDFs and URLs would
// need a parser the engine does not have.
func documentText(b block, at string) (string, error) {
	var s source
	if err := json.Unmarshal(b.Source, &s); err != nil {
		return "", invalid("%s.source: an object is required", at)
	}
	var text string
	switch {
	case s.Type == "text":
		text = s.Data
	case s.Type == "base64" && strings.HasPrefix(s.MediaType, "text/"):
		d, err := base64.StdEncoding.DecodeString(s.Data)
		if err != nil {
			return "", invalid("%s.source.data: not valid base64", at)
		}
		text = string(d)
	case s.Type == "content":
		bs, err := blocks(s.Content)
		if err != nil {
			return "", invalid("%s.source.content: %v", at, err)
		}
		text, err = joinText(bs, at+".source.content")
		if err != nil {
			return "", err
		}
	default:
		return "", invalid("%s.source: only plain-text documents are supported (no PDF, URL or file sources)", at)
	}
	if b.Title != "" {
		text = b.Title + "\n" + text
	}
	return text, nil
}

// searchResultText renders a search result as its title, source and text.
func searchResultText(b block, at string) (string, error) {
	var src string
	if len(b.Source) > 0 && json.Unmarshal(b.Source, &src) != nil {
		return "", invalid("%s.source: a string is required", at)
	}
	bs, err := blocks(b.Content)
	if err != nil {
		return "", invalid("%s.content: %v", at, err)
	}
	text, err := joinText(bs, at+".content")
	if err != nil {
		return "", err
	}
	return strings.Join(nonEmpty(b.Title, src, text), "\n"), nil
}

func nonEmpty(ss ...string) []string {
	out := ss[:0]
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// joinText joins text blocks with "\n"; other blocks are refused.
func joinText(bs []block, where string) (string, error) {
	texts := make([]string, 0, len(bs))
	for j, b := range bs {
		if b.Type != "text" {
			return "", invalid("%s.%d.type: only text blocks are supported here", where, j)
		}
		texts = append(texts, b.Text)
	}
	return strings.Join(texts, "\n"), nil
}

// toolMessage renders a tool_result as a tool message: its text parts
// joined with "\n" ("Error: " first when is_error is set, as chat has no
// such flag), and its images returned for the user message that follows.
func toolMessage(b block, at string) (chatMessage, chatContent, error) {
	if b.ToolUseID == "" {
		return chatMessage{}, nil, invalid("%s.tool_use_id: field required", at)
	}
	bs, err := blocks(b.Content)
	if err != nil {
		return chatMessage{}, nil, invalid("%s.content: %v", at, err)
	}
	var texts []string
	var imgs chatContent
	for k, x := range bs {
		switch {
		case x.Type == "image":
			p, err := imagePart(x.Source, fmt.Sprintf("%s.content.%d", at, k))
			if err != nil {
				return chatMessage{}, nil, err
			}
			imgs = append(imgs, p)
		case skipped[x.Type]:
		default:
			p, err := contentPart(x, fmt.Sprintf("%s.content.%d", at, k))
			if err != nil {
				return chatMessage{}, nil, err
			}
			texts = append(texts, p.Text)
		}
	}
	text := strings.Join(texts, "\n")
	if b.IsError {
		text = "Error: " + text
	}
	return chatMessage{Role: "tool", Content: textContent(text), ToolCallID: b.ToolUseID}, imgs, nil
}

// assistantMessage renders an assistant turn: its text blocks
// concatenated, its tool_use blocks as tool_calls with the input as
// compact JSON (key order kept). Thinking is not sent back.
func assistantMessage(bs []block, where string) (chatMessage, error) {
	var text strings.Builder
	var calls []chatToolCall
	for j, b := range bs {
		at := fmt.Sprintf("%s.%d", where, j)
		switch {
		case b.Type == "text":
			text.WriteString(b.Text)
		case b.Type == "tool_use":
			if b.ID == "" || b.Name == "" {
				return chatMessage{}, invalid("%s: tool_use blocks need an id and a name", at)
			}
			args, err := compactObject(b.Input)
			if err != nil {
				return chatMessage{}, invalid("%s.input: %v", at, err)
			}
			calls = append(calls, chatToolCall{ID: b.ID, Type: "function", Function: chatFunction{Name: b.Name, Arguments: args}})
		case skipped[b.Type]:
		default:
			return chatMessage{}, invalid("%s.type: content block type %q is not supported in assistant messages", at, b.Type)
		}
	}
	return chatMessage{Role: "assistant", Content: textContent(text.String()), ToolCalls: calls}, nil
}

// compactObject returns a JSON object compacted; absent input is "{}".
func compactObject(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "{}", nil
	}
	if raw[0] != '{' {
		return "", fmt.Errorf("must be an object")
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", err
	}
	return b.String(), nil
}

// chatTools renders the client tools as functions; server tools (web
// search, code execution…), which only Anthropic runs, are dropped.
func chatTools(ts []tool) ([]chatTool, error) {
	var out []chatTool
	for i, t := range ts {
		if !t.client() {
			continue
		}
		var b bytes.Buffer
		if err := json.Compact(&b, t.InputSchema); err != nil {
			return nil, invalid("tools.%d.input_schema: %v", i, err)
		}
		schema := b.Bytes()
		if !gjson.GetBytes(schema, "type").Exists() {
			schema, _ = sjson.SetRawBytes(schema, "type", []byte(`"object"`))
		}
		out = append(out, chatTool{Type: "function", Function: chatToolDef{Name: t.Name, Description: t.Description, Parameters: schema}})
	}
	return out, nil
}

// chatToolChoice maps tool_choice: auto, any (required), none, or one
// tool. A choice naming a dropped server tool leaves the choice to the
// model; without tools there is no choice at all.
func chatToolChoice(tc *toolChoice, tools []chatTool) (any, *bool) {
	if tc == nil || len(tools) == 0 {
		return nil, nil
	}
	var parallel *bool
	if tc.DisableParallelToolUse {
		no := false
		parallel = &no
	}
	switch tc.Type {
	case "any":
		return "required", parallel
	case "none":
		return "none", parallel
	case "tool":
		for _, t := range tools {
			if t.Function.Name == tc.Name {
				return map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}, parallel
			}
		}
	}
	return "auto", parallel
}
