package responses

import (
	"bytes"
	"strings"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
)

// chatMessage is one vLLM chat-completions message as warmpath renders it.
// The rendering is a pure function of the items, so a stored turn's
// messages are byte-identical when the next turn re-sends them.
type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"` // string, []chatPart or nil (null)
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatPart struct {
	Type     string        `json:"type"`
	Text     string        `json:"text,omitempty"`
	ImageURL *chatImageURL `json:"image_url,omitempty"`
}

type chatImageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

type chatToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function chatFunctionCall `json:"function"`
}

type chatFunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// renderItems translates one segment of items (one request's input, or one
// response's output) into chat messages, each marshalled:
//
//   - user, system and developer messages keep their role, except
//     developer, which becomes system (open-model chat templates rarely
//     know "developer"); all-text content becomes one string joined by
//     newlines (as vLLM joins text parts), images become image_url parts;
//   - an assistant message becomes {"role":"assistant","content":text};
//   - function_call items join the assistant message right before them in
//     the same segment, or start one with null content, as tool_calls
//     (call_id as id; a namespaced call as "namespace.name");
//   - function_call_output becomes {"role":"tool","tool_call_id",content};
//   - reasoning items are not sent (vLLM's templates drop earlier thinking).
//
// Merging never crosses a segment, so a stored turn renders the same way
// whatever follows it.
func renderItems(items []Item) ([][]byte, error) {
	var out [][]byte
	var pending *chatMessage
	flush := func() error {
		if pending == nil {
			return nil
		}
		b, err := chatapi.Marshal(pending)
		pending = nil
		out = append(out, b)
		return err
	}
	for _, it := range items {
		switch {
		case it.Type == ItemReasoning:
			continue
		case it.Type == ItemFunctionCall:
			if pending == nil {
				pending = &chatMessage{Role: "assistant"}
			}
			pending.ToolCalls = append(pending.ToolCalls, chatToolCall{ID: it.CallID, Type: "function",
				Function: chatFunctionCall{Name: chatToolName(it.Namespace, it.Name), Arguments: it.Arguments}})
			continue
		}
		if err := flush(); err != nil {
			return nil, err
		}
		switch {
		case it.Type == ItemFunctionCallOutput:
			text, err := outputText(it.Output)
			if err != nil {
				return nil, apierror.BadRequest("input", "function_call_output %s: %v", it.CallID, err)
			}
			pending = &chatMessage{Role: "tool", ToolCallID: it.CallID, Content: text}
			if err := flush(); err != nil {
				return nil, err
			}
		case it.Role == "assistant":
			pending = &chatMessage{Role: "assistant", Content: assistantText(it.Content)}
		default:
			role := it.Role
			if role == "developer" {
				role = "system"
			}
			pending = &chatMessage{Role: role, Content: userContent(it.Content)}
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

func chatToolName(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + namespaceSep + name
}

// splitToolName undoes chatToolName for a name the model called.
func splitToolName(name string, namespaced map[string]bool) (namespace, fn string) {
	if !namespaced[name] {
		return "", name
	}
	i := strings.LastIndex(name, namespaceSep)
	return name[:i], name[i+len(namespaceSep):]
}

// assistantText joins an assistant message's output_text (and refusal)
// parts: the upstream answered with one string, so it goes back as one.
func assistantText(parts []Part) string {
	var b strings.Builder
	for _, p := range parts {
		switch p.Type {
		case "output_text", "input_text":
			b.WriteString(p.Text)
		case "refusal":
			b.WriteString(p.Refusal)
		}
	}
	return b.String()
}

// userContent renders user, system and developer content: a string when
// every part is text, else chat content parts.
func userContent(parts []Part) any {
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type != "input_text" && p.Type != "output_text" {
			texts = nil
			break
		}
		texts = append(texts, p.Text)
	}
	if texts != nil || len(parts) == 0 {
		return strings.Join(texts, "\n")
	}
	cps := make([]chatPart, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "input_image":
			cps = append(cps, chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: p.ImageURL, Detail: p.Detail}})
		case "refusal":
			cps = append(cps, chatPart{Type: "text", Text: p.Refusal})
		default:
			cps = append(cps, chatPart{Type: "text", Text: p.Text})
		}
	}
	return cps
}

// chatRest holds every chat field after messages, in a fixed order.
type chatRest struct {
	Tools               []chatTool     `json:"tools,omitempty"`
	ToolChoice          any            `json:"tool_choice,omitempty"`
	ParallelToolCalls   *bool          `json:"parallel_tool_calls,omitempty"`
	ResponseFormat      any            `json:"response_format,omitempty"`
	Temperature         *float64       `json:"temperature,omitempty"`
	TopP                *float64       `json:"top_p,omitempty"`
	MaxCompletionTokens *int           `json:"max_completion_tokens,omitempty"`
	ReasoningEffort     string         `json:"reasoning_effort,omitempty"`
	Logprobs            bool           `json:"logprobs,omitempty"`
	TopLogprobs         *int           `json:"top_logprobs,omitempty"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatBody assembles the upstream /v1/chat/completions body: the
// instructions as a leading system message, then the history and input
// messages exactly as rendered, then the remaining fields. The upstream
// always streams, with usage in the last chunk.
func chatBody(p *params, msgs [][]byte) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	m, _ := chatapi.Marshal(p.model)
	b.Write(m)
	b.WriteString(`,"messages":[`)
	n := 0
	if p.instructions != nil {
		im, err := chatapi.Marshal(chatMessage{Role: "system", Content: *p.instructions})
		if err != nil {
			return nil, err
		}
		b.Write(im)
		n++
	}
	for _, msg := range msgs {
		if n > 0 {
			b.WriteByte(',')
		}
		b.Write(msg)
		n++
	}
	if n == 0 {
		return nil, apierror.BadRequest("input", "the request has no input: send input, or continue a previous response or a conversation that has items.")
	}
	b.WriteString("],")
	rest := chatRest{Stream: true, StreamOptions: &streamOptions{IncludeUsage: true},
		ResponseFormat: p.format, Temperature: p.raw.Temperature, TopP: p.raw.TopP,
		MaxCompletionTokens: p.raw.MaxOutputTokens, ReasoningEffort: p.effort}
	if len(p.tools) > 0 {
		rest.Tools, rest.ToolChoice, rest.ParallelToolCalls = p.tools, p.toolChoice, p.raw.ParallelToolCalls
	} else if p.toolChoice == "none" {
		rest.ToolChoice = nil
	}
	if p.logprobs {
		rest.Logprobs = true
		if p.raw.TopLogprobs != nil && *p.raw.TopLogprobs > 0 {
			rest.TopLogprobs = p.raw.TopLogprobs
		}
	}
	r, err := chatapi.Marshal(rest)
	if err != nil {
		return nil, err
	}
	b.Write(r[1:]) // drop '{': rest continues the object
	return b.Bytes(), nil
}

// joinMessages concatenates message fragments into the comma-separated
// form stored per turn.
func joinMessages(msgs [][]byte) []byte {
	return bytes.Join(msgs, []byte{','})
}
