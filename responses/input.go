package responses

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/warmpath/warmpath/internal/apierror"
)

// itemReference is the Type of an input item that names a stored item;
// parseInput leaves it unresolved (only its ID set).
const itemReference = "item_reference"

// maxInputItems bounds one request's input array, and maxIDLen a client
// item ID, so a hostile body cannot make us store unbounded keys.
const (
	maxInputItems = 10000
	maxIDLen      = 256
)

// rawItem is an input item as a client sends it: any of the easy message,
// typed message, function call, function call output, reasoning and item
// reference forms.
type rawItem struct {
	Type             string          `json:"type"`
	ID               string          `json:"id"`
	Status           string          `json:"status"`
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	Phase            string          `json:"phase"`
	CallID           string          `json:"call_id"`
	Name             string          `json:"name"`
	Namespace        string          `json:"namespace"`
	Arguments        json.RawMessage `json:"arguments"`
	Output           json.RawMessage `json:"output"`
	Summary          json.RawMessage `json:"summary"`
	EncryptedContent *string         `json:"encrypted_content"`
}

type rawPart struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	Refusal  string          `json:"refusal"`
	ImageURL json.RawMessage `json:"image_url"`
	FileID   string          `json:"file_id"`
	Detail   string          `json:"detail"`
	Logprobs json.RawMessage `json:"logprobs"`
}

// parseInput parses the input field (a string or an array of items) into
// items. param names the field in errors ("input", "items").
func parseInput(raw json.RawMessage, param string) ([]Item, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, apierror.BadRequest(param, "%s: %v", param, err)
		}
		return []Item{{Type: ItemMessage, Role: "user", Content: []Part{{Type: "input_text", Text: s}}}}, nil
	}
	if raw[0] != '[' {
		return nil, apierror.BadRequest(param, "%s must be a string or an array of input items", param)
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(raw, &raws); err != nil {
		return nil, apierror.BadRequest(param, "%s: %v", param, err)
	}
	if len(raws) > maxInputItems {
		return nil, apierror.BadRequest(param, "%s has %d items; at most %d are accepted", param, len(raws), maxInputItems)
	}
	items := make([]Item, 0, len(raws))
	for i, r := range raws {
		p := fmt.Sprintf("%s[%d]", param, i)
		it, err := parseItem(r, p)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

func parseItem(raw json.RawMessage, param string) (Item, error) {
	var r rawItem
	if err := json.Unmarshal(raw, &r); err != nil {
		return Item{}, apierror.BadRequest(param, "%s: %s", param, jsonErrText(err))
	}
	if len(r.ID) > maxIDLen {
		return Item{}, apierror.BadRequest(param+".id", "%s.id is longer than %d characters", param, maxIDLen)
	}
	typ := r.Type
	if typ == "" {
		switch {
		case r.Role != "":
			typ = ItemMessage
		case r.ID != "":
			typ = itemReference
		default:
			return Item{}, apierror.BadRequest(param, "%s has no type and no role", param)
		}
	}
	switch typ {
	case ItemMessage:
		return parseMessage(r, param)
	case ItemFunctionCall:
		return parseFunctionCall(r, param)
	case ItemFunctionCallOutput:
		return parseFunctionCallOutput(r, param)
	case ItemReasoning:
		return parseReasoning(r, param)
	case itemReference:
		if r.ID == "" {
			return Item{}, apierror.BadRequest(param+".id", "%s: an item_reference needs an id", param)
		}
		return Item{Type: itemReference, ID: r.ID}, nil
	}
	return Item{}, apierror.BadRequest(param+".type",
		"%s.type %q is not supported: warmpath serves messages, function_call, function_call_output, reasoning and item_reference items (hosted and custom tool calls need OpenAI's built-in tools)",
		param, typ)
}

func parseMessage(r rawItem, param string) (Item, error) {
	it := Item{Type: ItemMessage, ID: r.ID, Status: r.Status, Role: r.Role, Phase: r.Phase}
	switch r.Role {
	case "user", "system", "developer", "assistant":
	case "":
		return Item{}, apierror.BadRequest(param+".role", "%s: a message needs a role", param)
	default:
		return Item{}, apierror.BadRequest(param+".role", "%s.role %q is not one of user, system, developer, assistant", param, r.Role)
	}
	c := bytes.TrimSpace(r.Content)
	textType := "input_text"
	if r.Role == "assistant" {
		textType = "output_text"
	}
	switch {
	case len(c) == 0 || string(c) == "null":
		return Item{}, apierror.BadRequest(param+".content", "%s: a message needs content", param)
	case c[0] == '"':
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return Item{}, apierror.BadRequest(param+".content", "%s.content: %v", param, err)
		}
		it.Content = []Part{{Type: textType, Text: s}}
		return it, nil
	case c[0] != '[':
		return Item{}, apierror.BadRequest(param+".content", "%s.content must be a string or an array of content parts", param)
	}
	var parts []rawPart
	if err := json.Unmarshal(c, &parts); err != nil {
		return Item{}, apierror.BadRequest(param+".content", "%s.content: %s", param, jsonErrText(err))
	}
	for j, rp := range parts {
		p, err := parsePart(rp, fmt.Sprintf("%s.content[%d]", param, j), r.Role == "assistant")
		if err != nil {
			return Item{}, err
		}
		it.Content = append(it.Content, p)
	}
	return it, nil
}

func parsePart(rp rawPart, param string, assistant bool) (Part, error) {
	switch rp.Type {
	case "input_text", "text":
		if assistant {
			return Part{Type: "output_text", Text: rp.Text}, nil
		}
		return Part{Type: "input_text", Text: rp.Text}, nil
	case "output_text":
		return Part{Type: "output_text", Text: rp.Text, Logprobs: nonNullArray(rp.Logprobs)}, nil
	case "refusal":
		return Part{Type: "refusal", Refusal: rp.Refusal}, nil
	case "input_image":
		url, err := imageURL(rp.ImageURL)
		if err != nil {
			return Part{}, apierror.BadRequest(param+".image_url", "%s.image_url: %v", param, err)
		}
		if url == "" {
			if rp.FileID != "" {
				return Part{}, apierror.BadRequest(param+".file_id", "%s: file_id images need OpenAI's Files API; send image_url (a URL or a data: URL)", param)
			}
			return Part{}, apierror.BadRequest(param+".image_url", "%s: an input_image needs image_url", param)
		}
		detail := rp.Detail
		if detail == "" {
			detail = "auto"
		}
		return Part{Type: "input_image", ImageURL: url, Detail: detail}, nil
	case "input_file":
		return Part{}, apierror.BadRequest(param+".type", "%s: input_file content is not supported (vLLM chat completions take text and images)", param)
	}
	return Part{}, apierror.BadRequest(param+".type", "%s.type %q is not a supported content part", param, rp.Type)
}

// imageURL accepts image_url as a string or as chat's {"url": …}.
func imageURL(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if raw[0] == '{' {
		var o struct {
			URL string `json:"url"`
		}
		err := json.Unmarshal(raw, &o)
		return o.URL, err
	}
	err := json.Unmarshal(raw, &s)
	return s, err
}

func parseFunctionCall(r rawItem, param string) (Item, error) {
	if r.CallID == "" {
		return Item{}, apierror.BadRequest(param+".call_id", "%s: a function_call needs a call_id", param)
	}
	if r.Name == "" {
		return Item{}, apierror.BadRequest(param+".name", "%s: a function_call needs a name", param)
	}
	args, err := argumentsText(r.Arguments)
	if err != nil {
		return Item{}, apierror.BadRequest(param+".arguments", "%s.arguments: %v", param, err)
	}
	return Item{Type: ItemFunctionCall, ID: r.ID, Status: r.Status, CallID: r.CallID, Name: r.Name,
		Namespace: r.Namespace, Arguments: args}, nil
}

// argumentsText accepts arguments as the spec's JSON text, or (leniently)
// as a JSON object, which is kept compacted.
func argumentsText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", nil
	case raw[0] == '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case raw[0] == '{':
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			return "", err
		}
		return b.String(), nil
	}
	return "", errors.New("must be a JSON string")
}

func parseFunctionCallOutput(r rawItem, param string) (Item, error) {
	if r.CallID == "" || len(r.CallID) > 64 {
		return Item{}, apierror.BadRequest(param+".call_id", "%s: a function_call_output needs a call_id of 1 to 64 characters", param)
	}
	out := bytes.TrimSpace(r.Output)
	switch {
	case len(out) == 0 || string(out) == "null":
		return Item{}, apierror.BadRequest(param+".output", "%s: a function_call_output needs output", param)
	case out[0] == '"':
		var s string
		if err := json.Unmarshal(out, &s); err != nil {
			return Item{}, apierror.BadRequest(param+".output", "%s.output: %v", param, err)
		}
	case out[0] == '[':
		if _, err := outputText(out); err != nil {
			return Item{}, apierror.BadRequest(param+".output", "%s.output: %v", param, err)
		}
	default:
		return Item{}, apierror.BadRequest(param+".output", "%s.output must be a string or an array of content parts", param)
	}
	var b bytes.Buffer
	_ = json.Compact(&b, out) // valid: checked above
	return Item{Type: ItemFunctionCallOutput, ID: r.ID, Status: r.Status, CallID: r.CallID, Output: b.Bytes()}, nil
}

// outputText is the text a function_call_output carries: the string, or
// its text parts joined by newlines. Images in tool output are refused:
// a chat tool message is text.
func outputText(out json.RawMessage) (string, error) {
	if len(out) > 0 && out[0] == '"' {
		var s string
		err := json.Unmarshal(out, &s)
		return s, err
	}
	var parts []rawPart
	if err := json.Unmarshal(out, &parts); err != nil {
		return "", errors.New(jsonErrText(err))
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, p.Text)
		default:
			return "", fmt.Errorf("content part %q in a function_call_output is not supported (only text)", p.Type)
		}
	}
	return strings.Join(texts, "\n"), nil
}

func parseReasoning(r rawItem, param string) (Item, error) {
	it := Item{Type: ItemReasoning, ID: r.ID, Status: r.Status, EncryptedContent: r.EncryptedContent}
	for _, f := range []struct {
		raw  json.RawMessage
		dst  *[]Part
		typ  string
		name string
	}{{r.Summary, &it.Summary, "summary_text", "summary"}, {r.Content, &it.Content, "reasoning_text", "content"}} {
		raw := bytes.TrimSpace(f.raw)
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		var parts []rawPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return Item{}, apierror.BadRequest(param+"."+f.name, "%s.%s: %s", param, f.name, jsonErrText(err))
		}
		for _, p := range parts {
			*f.dst = append(*f.dst, Part{Type: f.typ, Text: p.Text})
		}
	}
	return it, nil
}

func nonNullArray(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return nil
	}
	return raw
}

// jsonErrText turns a decoding error into a message naming the field.
func jsonErrText(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
		return fmt.Sprintf("%s must be %s, not %s", te.Field, jsonTypeName(te.Type.Kind().String()), te.Value)
	}
	return err.Error()
}

func jsonTypeName(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	case "map", "struct", "ptr":
		return "an object"
	}
	return "a number"
}

// Prefixes of the IDs warmpath mints.
const (
	prefixResponse     = "resp_"
	prefixMessage      = "msg_"
	prefixFunctionCall = "fc_"
	prefixFCOutput     = "fco_"
	prefixReasoning    = "rs_"
	prefixCall         = "call_"
	prefixConversation = "conv_"
)

// newID mints an ID: prefix plus 48 hex digits (192 random bits), only
// [A-Za-z0-9_] as clients require.
func newID(prefix string) string {
	var b [24]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return prefix + hex.EncodeToString(b[:])
}

// assignIDs gives every item without an ID a fresh one and a status.
func assignIDs(items []Item) {
	for i := range items {
		it := &items[i]
		if it.ID == "" {
			it.ID = newID(idPrefix(it.Type))
		}
		if it.Status == "" && it.Type != ItemReasoning {
			it.Status = StatusCompleted
		}
	}
}

func idPrefix(typ string) string {
	switch typ {
	case ItemFunctionCall:
		return prefixFunctionCall
	case ItemFunctionCallOutput:
		return prefixFCOutput
	case ItemReasoning:
		return prefixReasoning
	}
	return prefixMessage
}
