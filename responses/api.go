package responses

import (
	"encoding/json"

	"github.com/warmpath/warmpath/internal/chatapi"
)

// Response is the Responses API object, as returned by POST /v1/responses,
// GET /v1/responses/{id} and inside stream events. Every field the spec
// marks required is always present (null when unset).
type Response struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	CompletedAt        *int64            `json:"completed_at"`
	Background         bool              `json:"background"`
	Error              *ResponseError    `json:"error"`
	IncompleteDetails  *Incomplete       `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	MaxToolCalls       *int              `json:"max_tool_calls"`
	Model              string            `json:"model"`
	Output             []Item            `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Conversation       *ConversationRef  `json:"conversation"`
	Reasoning          json.RawMessage   `json:"reasoning"`
	ServiceTier        string            `json:"service_tier"`
	Store              bool              `json:"store"`
	Temperature        float64           `json:"temperature"`
	Text               json.RawMessage   `json:"text"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              json.RawMessage   `json:"tools"`
	TopLogprobs        int               `json:"top_logprobs"`
	TopP               float64           `json:"top_p"`
	Truncation         string            `json:"truncation"`
	Usage              *Usage            `json:"usage"`
	User               *string           `json:"user"`
	SafetyIdentifier   *string           `json:"safety_identifier"`
	PromptCacheKey     *string           `json:"prompt_cache_key"`
	Metadata           map[string]string `json:"metadata"`
}

// Statuses of a Response.
const (
	StatusQueued     = "queued"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusFailed     = "failed"
	StatusCancelled  = "cancelled"
)

func terminal(status string) bool {
	switch status {
	case StatusCompleted, StatusIncomplete, StatusFailed, StatusCancelled:
		return true
	}
	return false
}

// ResponseError is Response.error: what made a response fail.
type ResponseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Incomplete is Response.incomplete_details.
type Incomplete struct {
	Reason string `json:"reason"` // "max_output_tokens" or "content_filter"
}

// ConversationRef is Response.conversation.
type ConversationRef struct {
	ID string `json:"id"`
}

// Usage is Response.usage; every subfield is always present.
type Usage struct {
	InputTokens         int          `json:"input_tokens"`
	InputTokensDetails  InputDetails `json:"input_tokens_details"`
	OutputTokens        int          `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// InputDetails is Usage.input_tokens_details.
type InputDetails struct {
	CachedTokens     int `json:"cached_tokens"`
	CacheWriteTokens int `json:"cache_write_tokens"`
}

// Item types warmpath stores and emits.
const (
	ItemMessage            = "message"
	ItemFunctionCall       = "function_call"
	ItemFunctionCallOutput = "function_call_output"
	ItemReasoning          = "reasoning"
)

// Item is one input or output item: a message, a function call, a function
// call's output or a reasoning item. Only the fields of its Type are
// marshalled, each with the shape the spec gives it.
type Item struct {
	Type   string
	ID     string
	Status string
	// Role and Content are a message's ("user", "system", "developer",
	// "assistant"); Phase is an assistant message's optional phase.
	Role    string
	Content []Part
	Phase   string
	// CallID, Name, Namespace and Arguments are a function call's; CallID
	// and Output a function call output's.
	CallID    string
	Name      string
	Namespace string
	Arguments string
	// Output is a function_call_output's output: a JSON string or an array
	// of input content parts, kept as sent.
	Output json.RawMessage
	// Summary is a reasoning item's summary; Content holds its
	// reasoning_text parts.
	Summary []Part
	// EncryptedContent is kept as the client sent it; never sent upstream.
	EncryptedContent *string
}

// Part is one content part: input_text, input_image, output_text,
// refusal, summary_text or reasoning_text.
type Part struct {
	Type     string
	Text     string
	Refusal  string
	ImageURL string
	FileID   string
	Detail   string
	// Logprobs is an output_text part's logprobs array; nil marshals as [].
	Logprobs json.RawMessage
}

var emptyArray = json.RawMessage("[]")

// MarshalJSON writes the part with the fields of its type.
func (p Part) MarshalJSON() ([]byte, error) {
	switch p.Type {
	case "output_text":
		lp := p.Logprobs
		if len(lp) == 0 {
			lp = emptyArray
		}
		return chatapi.Marshal(struct {
			Type        string          `json:"type"`
			Text        string          `json:"text"`
			Annotations json.RawMessage `json:"annotations"`
			Logprobs    json.RawMessage `json:"logprobs"`
		}{p.Type, p.Text, emptyArray, lp})
	case "refusal":
		return chatapi.Marshal(struct {
			Type    string `json:"type"`
			Refusal string `json:"refusal"`
		}{p.Type, p.Refusal})
	case "input_image":
		return chatapi.Marshal(struct {
			Type     string `json:"type"`
			ImageURL string `json:"image_url,omitempty"`
			FileID   string `json:"file_id,omitempty"`
			Detail   string `json:"detail"`
		}{p.Type, p.ImageURL, p.FileID, p.Detail})
	}
	return chatapi.Marshal(struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}{p.Type, p.Text})
}

// MarshalJSON writes the item with the fields of its type.
func (it Item) MarshalJSON() ([]byte, error) {
	content := it.Content
	if content == nil {
		content = []Part{}
	}
	switch it.Type {
	case ItemFunctionCall:
		return chatapi.Marshal(struct {
			Type      string `json:"type"`
			ID        string `json:"id"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Namespace string `json:"namespace,omitempty"`
			Arguments string `json:"arguments"`
			Status    string `json:"status"`
		}{it.Type, it.ID, it.CallID, it.Name, it.Namespace, it.Arguments, it.Status})
	case ItemFunctionCallOutput:
		out := it.Output
		if len(out) == 0 {
			out = json.RawMessage(`""`)
		}
		return chatapi.Marshal(struct {
			Type   string          `json:"type"`
			ID     string          `json:"id"`
			CallID string          `json:"call_id"`
			Output json.RawMessage `json:"output"`
			Status string          `json:"status"`
		}{it.Type, it.ID, it.CallID, out, it.Status})
	case ItemReasoning:
		summary := it.Summary
		if summary == nil {
			summary = []Part{}
		}
		return chatapi.Marshal(struct {
			Type             string  `json:"type"`
			ID               string  `json:"id"`
			Summary          []Part  `json:"summary"`
			Content          []Part  `json:"content,omitempty"`
			EncryptedContent *string `json:"encrypted_content,omitempty"`
			Status           string  `json:"status,omitempty"`
		}{it.Type, it.ID, summary, it.Content, it.EncryptedContent, it.Status})
	}
	return chatapi.Marshal(struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Status  string `json:"status"`
		Role    string `json:"role"`
		Content []Part `json:"content"`
		Phase   string `json:"phase,omitempty"`
	}{ItemMessage, it.ID, it.Status, it.Role, content, it.Phase})
}

// Conversation is the Conversations API object.
type Conversation struct {
	ID        string            `json:"id"`
	Object    string            `json:"object"`
	CreatedAt int64             `json:"created_at"`
	Metadata  map[string]string `json:"metadata"`
}

// itemList is the list envelope of input_items and conversation items.
type itemList struct {
	Object  string  `json:"object"`
	Data    []Item  `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

func newItemList(items []Item, hasMore bool) itemList {
	l := itemList{Object: "list", Data: items, HasMore: hasMore}
	if l.Data == nil {
		l.Data = []Item{}
	}
	if len(items) > 0 {
		l.FirstID, l.LastID = &items[0].ID, &items[len(items)-1].ID
	}
	return l
}
