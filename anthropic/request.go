package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// request is a Messages API request body (POST /v1/messages and
// /v1/messages/count_tokens). Fields the translation drops on purpose are
// listed in doc.go; unknown fields are ignored, as Anthropic's and vLLM's
// servers ignore them.
type request struct {
	Model         string          `json:"model"`
	MaxTokens     *int64          `json:"max_tokens"`
	Messages      []message       `json:"messages"`
	System        json.RawMessage `json:"system"`
	Tools         []tool          `json:"tools"`
	ToolChoice    *toolChoice     `json:"tool_choice"`
	StopSequences []string        `json:"stop_sequences"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int64          `json:"top_k"`
	Stream        *bool           `json:"stream"`
	Metadata      *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
	OutputConfig *struct {
		Effort string `json:"effort"`
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	} `json:"output_config"`
}

// message is one entry of messages: content is a string or an array of
// blocks.
type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// block is a content block of any type; each type uses some fields.
type block struct {
	Type string `json:"type"`
	// text, and the title of document and search_result
	Text  string `json:"text"`
	Title string `json:"title"`
	// image and document: an object (see source); search_result: a string
	Source json.RawMessage `json:"source"`
	// tool_use
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
	// tool_result (content is a string or blocks), search_result (blocks)
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// source is an image's or document's source.
type source struct {
	Type      string          `json:"type"` // base64, url, text, content, file
	MediaType string          `json:"media_type"`
	Data      string          `json:"data"`
	URL       string          `json:"url"`
	Content   json.RawMessage `json:"content"` // type content: a string or blocks
}

// tool is a tool definition: a client tool (no type, or "custom") with an
// input schema, or a server tool named by its dated type.
type tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// client reports whether t is a tool the client runs (the only kind a
// self-hosted engine can call).
func (t *tool) client() bool { return t.Type == "" || t.Type == "custom" }

type toolChoice struct {
	Type                   string `json:"type"` // auto, any, tool, none
	Name                   string `json:"name"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
}

// maxTokensCap bounds max_tokens to what any engine could use.
const maxTokensCap = 1 << 24

// parseRequest decodes and validates a request body. counting is set for
// count_tokens, which needs no max_tokens. Errors are 400s.
func parseRequest(body []byte, counting bool) (*request, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, invalid("request body is empty; expected a JSON object")
	}
	if body[0] != '{' {
		return nil, invalid("request body must be a JSON object")
	}
	var r request
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, invalid("request body is not a valid Messages request: %s", jsonError(err))
	}
	if r.Model == "" {
		return nil, invalid("model: field required")
	}
	if !counting {
		switch {
		case r.MaxTokens == nil:
			return nil, invalid("max_tokens: field required")
		case *r.MaxTokens < 1:
			return nil, invalid("max_tokens: must be greater than or equal to 1")
		case *r.MaxTokens > maxTokensCap:
			return nil, invalid("max_tokens: must be at most %d", maxTokensCap)
		}
	}
	if len(r.Messages) == 0 {
		return nil, invalid("messages: at least one message is required")
	}
	if r.ToolChoice != nil {
		switch r.ToolChoice.Type {
		case "auto", "any", "none":
		case "tool":
			if r.ToolChoice.Name == "" {
				return nil, invalid("tool_choice.name: field required when tool_choice.type is tool")
			}
		default:
			return nil, invalid("tool_choice.type: must be one of auto, any, tool, none")
		}
	}
	for i, t := range r.Tools {
		if !t.client() {
			continue
		}
		if t.Name == "" {
			return nil, invalid("tools.%d.name: field required", i)
		}
		if len(bytes.TrimSpace(t.InputSchema)) == 0 || bytes.TrimSpace(t.InputSchema)[0] != '{' {
			return nil, invalid("tools.%d.input_schema: an object is required", i)
		}
	}
	return &r, nil
}

// jsonError shortens encoding/json's messages for the client.
func jsonError(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
		return fmt.Sprintf("%s: expected %s, got %s", te.Field, te.Type, te.Value)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// blocks decodes content that is a string or an array of blocks; a string
// is one text block. Null or absent content is no block.
func blocks(raw json.RawMessage) ([]block, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []block{{Type: "text", Text: s}}, nil
	case raw[0] == '[':
		var bs []block
		if err := json.Unmarshal(raw, &bs); err != nil {
			return nil, errors.New(jsonError(err))
		}
		return bs, nil
	}
	return nil, errors.New("content must be a string or an array of content blocks")
}

// sessionFromUserID finds the session id in metadata.user_id: Claude Code
// sends a JSON string with device, account and session ids (older releases
// "user_<hash>_account_<uuid>_session_<uuid>"). It returns "" when there is
// none.
func sessionFromUserID(uid string) string {
	if strings.HasPrefix(uid, "{") {
		var v struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal([]byte(uid), &v) == nil {
			return v.SessionID
		}
		return ""
	}
	if _, s, ok := strings.Cut(uid, "_session_"); ok {
		return s
	}
	return ""
}
