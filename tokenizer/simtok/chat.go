package simtok

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/tidwall/gjson"
)

// Message is one chat message as accepted by /v1/chat/completions and
// /tokenize. When decoded from JSON, content may be a string, null, or an
// array of parts, whose "text" parts are joined with "\n" (as vLLM does);
// other part types are ignored.
type Message struct {
	// Role is "system", "developer", "user", "assistant" or "tool"; other
	// roles render like "user" under their own name.
	Role string `json:"role"`
	// Content is the message text; "" for null or missing content.
	Content string `json:"content"`
	// ToolCalls are an assistant message's function calls.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a "tool" message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Name is the optional participant name; not rendered.
	Name string `json:"name,omitempty"`
}

// UnmarshalJSON implements json.Unmarshaler, accepting string, null or
// array-of-parts content (see decodeMessage).
func (m *Message) UnmarshalJSON(data []byte) error {
	dm, err := decodeMessage(gjson.ParseBytes(data)) // encoding/json passes only valid JSON
	if err != nil {
		return err
	}
	*m = dm
	return nil
}

// ToolCall is a function call made by an assistant message.
type ToolCall struct {
	// ID identifies the call; tool messages answer it. Not rendered.
	ID string `json:"id,omitempty"`
	// Type is "function".
	Type string `json:"type"`
	// Function is the called function and its arguments.
	Function FunctionCall `json:"function"`
}

// FunctionCall names the called function and carries its arguments as a
// JSON text.
type FunctionCall struct {
	// Name is the function's name.
	Name string `json:"name"`
	// Arguments is a JSON object as text, rendered verbatim ("{}" when
	// empty).
	Arguments string `json:"arguments"`
}

// Tool is a tool offered to the model.
type Tool struct {
	// Type is "function".
	Type string `json:"type"`
	// Function describes the function.
	Function ToolFunction `json:"function"`
}

// ToolFunction describes a callable function; Parameters is a JSON Schema.
type ToolFunction struct {
	// Name is the function's name.
	Name string `json:"name"`
	// Description is rendered into the system part when not empty.
	Description string `json:"description,omitempty"`
	// Parameters is the JSON Schema of the arguments, rendered compacted;
	// generated calls fill its required properties.
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// Chat template strings (ChatML, Qwen style).
const (
	imStart          = "<|im_start|>"
	imEnd            = "<|im_end|>"
	generationPrompt = imStart + "assistant\n"
	toolsHeader      = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
	toolsFooter = "\n</tools>\n\nFor each function call, return a json object with function name and " +
		"arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n" +
		"{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
)

// RenderChat renders messages (and tools) with the simulator's chat
// template, a ChatML template in Qwen's style:
//
//	<|im_start|>system\n{system content}[\n\n# Tools … <tools>…</tools> …]<|im_end|>\n
//	<|im_start|>user\n{content}<|im_end|>\n
//	<|im_start|>assistant\n{content}[\n]<tool_call>\n{"name": …, "arguments": …}\n</tool_call><|im_end|>\n
//	<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n   (role "tool")
//
// Tools are rendered into the first message when it is a system message,
// else into a system message of their own placed first. Each message renders
// independently of the ones after it, so the rendering of messages[:k] is a
// prefix of the rendering of messages[:k+1], and the generation prompt
// "<|im_start|>assistant\n" (added when addGenerationPrompt is set) is
// exactly how an assistant message's rendering starts.
func RenderChat(messages []Message, tools []Tool, addGenerationPrompt bool) string {
	return string(AppendChat(nil, messages, tools, addGenerationPrompt, false))
}

// TokenizeChat returns the tokens of RenderChat(messages, tools,
// addGenerationPrompt).
func TokenizeChat(messages []Message, tools []Tool, addGenerationPrompt bool) []uint32 {
	return Tokenize(RenderChat(messages, tools, addGenerationPrompt))
}

// AppendChat appends the rendering of the conversation (RenderChat's) to
// dst and returns the extended slice. With continueFinal set, the last
// message is left open (no <|im_end|>), as vLLM's continue_final_message.
func AppendChat(dst []byte, messages []Message, tools []Tool, addGen, continueFinal bool) []byte {
	if len(tools) > 0 && (len(messages) == 0 || messages[0].Role != "system") {
		dst = append(dst, imStart+"system\n"...)
		dst = appendTools(dst, tools)
		dst = append(dst, imEnd+"\n"...)
	}
	for i := range messages {
		m := &messages[i]
		last := continueFinal && i == len(messages)-1
		switch {
		case m.Role == "tool":
			dst = append(dst, imStart+"user\n<tool_response>\n"...)
			dst = append(dst, m.Content...)
			dst = append(dst, "\n</tool_response>"...)
		case m.Role == "assistant":
			dst = append(dst, generationPrompt...)
			dst = append(dst, m.Content...)
			for j, tc := range m.ToolCalls {
				if j > 0 || m.Content != "" {
					dst = append(dst, '\n')
				}
				dst = AppendToolCallText(dst, tc.Function.Name, tc.Function.Arguments)
			}
		default:
			dst = append(dst, imStart...)
			dst = append(dst, m.Role...)
			dst = append(dst, '\n')
			dst = append(dst, m.Content...)
			if i == 0 && m.Role == "system" && len(tools) > 0 {
				if m.Content != "" {
					dst = append(dst, "\n\n"...)
				}
				dst = appendTools(dst, tools)
			}
		}
		if !last {
			dst = append(dst, imEnd+"\n"...)
		}
	}
	if addGen && !continueFinal {
		dst = append(dst, generationPrompt...)
	}
	return dst
}

func appendTools(dst []byte, tools []Tool) []byte {
	dst = append(dst, toolsHeader...)
	for _, t := range tools {
		dst = append(dst, "\n{\"type\": \"function\", \"function\": {\"name\": "...)
		dst = AppendJSONString(dst, t.Function.Name)
		if t.Function.Description != "" {
			dst = append(dst, ", \"description\": "...)
			dst = AppendJSONString(dst, t.Function.Description)
		}
		if len(t.Function.Parameters) > 0 {
			dst = append(dst, ", \"parameters\": "...)
			var buf bytes.Buffer
			if json.Compact(&buf, t.Function.Parameters) == nil {
				dst = append(dst, buf.Bytes()...)
			} else {
				dst = AppendJSONString(dst, string(t.Function.Parameters))
			}
		}
		dst = append(dst, "}}"...)
	}
	return append(dst, toolsFooter...)
}

// AppendToolCallText renders one function call the way the template shows
// it and the generator emits it.
func AppendToolCallText(dst []byte, name, args string) []byte {
	if strings.TrimSpace(args) == "" {
		args = "{}"
	}
	dst = append(dst, "<tool_call>\n{\"name\": "...)
	dst = AppendJSONString(dst, name)
	dst = append(dst, ", \"arguments\": "...)
	dst = append(dst, args...)
	return append(dst, "}\n</tool_call>"...)
}

// AppendJSONString appends s as a JSON string literal, as the template
// writes strings. Valid UTF-8 passes through; quotes, backslashes and
// control characters are escaped.
func AppendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
