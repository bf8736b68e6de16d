package simtok

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// refMessage decodes a message with encoding/json alone (the decoder
// before decodeMessage), the oracle decodeMessage is checked against.
func refMessage(data []byte) (Message, error) {
	var raw struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCalls  []ToolCall      `json:"tool_calls"`
		ToolCallID string          `json:"tool_call_id"`
		Name       string          `json:"name"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Message{}, err
	}
	m := Message{Role: raw.Role, ToolCalls: raw.ToolCalls, ToolCallID: raw.ToolCallID, Name: raw.Name}
	c := bytes.TrimSpace(raw.Content)
	switch {
	case len(c) == 0 || string(c) == "null":
	case c[0] == '"':
		return m, json.Unmarshal(c, &m.Content)
	case c[0] == '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(c, &parts); err != nil {
			return m, err
		}
		var texts []string
		for _, p := range parts {
			if p.Type == "text" || p.Type == "input_text" {
				texts = append(texts, p.Text)
			}
		}
		m.Content = strings.Join(texts, "\n")
	default:
		return m, json.Unmarshal([]byte(`0`), new(struct{})) // any error
	}
	return m, nil
}

var messageSeeds = []string{
	`{"role":"user","content":"hi"}`,
	`{"role":"user","content":null,"name":null}`,
	`{"ROLE":"system","Content":"a\u00e9\n\"q\"","role":"tool"}`,
	`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"input_text","text":"b"},null]}`,
	`{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}],"tool_call_id":"z"}`,
	`{"role":"user","content":5}`,
	`{"role":7}`,
	`{"role":"user","content":[{"type":"text","text":3}]}`,
	`{"role":"user","content":[5]}`,
	`{"role":"user","content":{"x":1}}`,
	`{"role":"user","content":"\xff\xfeok"}`,
	`null`,
	`"hi"`,
	`{"role":"user","content":"a","content":"b"}`,
	`{"role":"user","tool_calls":[{"function":{"name":5}}]}`,
	`{"role":"\ud800","content":"\ud83d\ude00 \udc00x \ud800\u0041 \u0000"}`,
	`{"r\u006fle":"user","content":[{"TYPE":"text","text":"k"}]}`,
}

func TestDecodeMessageAsEncodingJSON(t *testing.T) {
	for _, s := range messageSeeds {
		checkMessage(t, []byte(s))
	}
}

func checkMessage(t *testing.T, data []byte) {
	t.Helper()
	if !json.Valid(data) {
		return
	}
	want, werr := refMessage(data)
	var got Message
	gerr := json.Unmarshal(data, &got)
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("%s: error %v, encoding/json's %v", data, gerr, werr)
	}
	if werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: decoded %+v, encoding/json %+v", data, got, want)
	}
}

func FuzzDecodeMessage(f *testing.F) {
	for _, s := range messageSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkMessage(t, data)
		// Any bytes, as messages or tools the gateway did not validate: an
		// answer, never a panic.
		_, _ = TokenizeChatJSON(string(data), string(data))
		_, _ = TokenizeChatJSON("["+string(data)+"]", "")
	})
}

// TestTokenizeRequestFields: /tokenize bodies decode as encoding/json
// would decode them into TokenizeRequest.
func TestTokenizeRequestFields(t *testing.T) {
	for _, s := range []string{
		`{"model":"m","prompt":"p","return_token_strs":true}`,
		`{"Model":"m","PROMPT":null,"messages":[],"add_generation_prompt":false,"continue_final_message":true}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"add_generation_prompt":null}`,
		`{"messages":null,"prompt":"x","prompt":"y"}`,
		`null`,
	} {
		var want TokenizeRequest
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatal(err)
		}
		got, err := DecodeTokenizeRequest([]byte(s), true)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %+v, %v; encoding/json %+v", s, got, err, want)
		}
	}
	for _, s := range []string{`{"prompt":5}`, `{"messages":{}}`, `{"add_generation_prompt":"yes"}`, `[1]`, `{"model":`, `{"tools":[5]}`} {
		if _, err := DecodeTokenizeRequest([]byte(s), true); err == nil {
			t.Errorf("%s decoded", s)
		}
	}
}
