package responses

import (
	"testing"

	"github.com/tidwall/gjson"
)

// translate runs a body through parsing, rendering and assembly, without
// history or references.
func translate(t *testing.T, body string) []byte {
	t.Helper()
	p, err := parseCreate([]byte(body))
	if err != nil {
		t.Fatalf("parseCreate(%s): %v", body, err)
	}
	msgs, err := renderItems(p.input)
	if err != nil {
		t.Fatalf("renderItems: %v", err)
	}
	b, err := chatBody(p, msgs)
	if err != nil {
		t.Fatalf("chatBody: %v", err)
	}
	return b
}

func TestTranslateBody(t *testing.T) {
	cases := []struct {
		name, body string
		want       map[string]string // gjson path → raw JSON expected
	}{
		{"string input", `{"model":"m","input":"hi"}`, map[string]string{
			"messages": `[{"role":"user","content":"hi"}]`, "stream": `true`, "stream_options": `{"include_usage":true}`}},
		{"roles and parts", `{"model":"m","instructions":"I","input":[{"role":"developer","content":"D"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},{"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"https://x/y.png","detail":"high"}]}]}`,
			map[string]string{"messages": `[{"role":"system","content":"I"},{"role":"system","content":"D"},{"role":"user","content":"a\nb"},{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"high"}}]}]`}},
		{"assistant text then calls merge", `{"model":"m","input":[{"role":"user","content":"q"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"let me check"}]},{"type":"reasoning","id":"rs_1","summary":[]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"g","namespace":"ns","arguments":"{\"a\":1}"},{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"x"},{"type":"input_text","text":"y"}]},{"type":"function_call_output","call_id":"c2","output":"z"}]}`,
			map[string]string{"messages": `[{"role":"user","content":"q"},{"role":"assistant","content":"let me check","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"ns.g","arguments":"{\"a\":1}"}}]},{"role":"tool","content":"x\ny","tool_call_id":"c1"},{"role":"tool","content":"z","tool_call_id":"c2"}]`}},
		{"tools and required", `{"model":"m","input":"x","tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object"},"strict":true},{"type":"namespace","name":"ns","description":"n","tools":[{"type":"function","name":"g","parameters":null}]},{"type":"web_search"}],"tool_choice":"required","parallel_tool_calls":false}`,
			map[string]string{"tools": `[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"},"strict":true}},{"type":"function","function":{"name":"ns.g"}}]`,
				"tool_choice": `"required"`, "parallel_tool_calls": `false`}},
		{"named function", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}}`,
			map[string]string{"tool_choice": `{"function":{"name":"f"},"type":"function"}`}},
		{"allowed tools", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"function","name":"g"}],"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"g"}]}}`,
			map[string]string{"tools": `[{"type":"function","function":{"name":"g"}}]`, "tool_choice": `"required"`}},
		{"json schema", `{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"out","schema":{"type":"object"},"strict":true,"description":"d"},"verbosity":"low"}}`,
			map[string]string{"response_format": `{"json_schema":{"description":"d","name":"out","schema":{"type":"object"},"strict":true},"type":"json_schema"}`}},
		{"json object", `{"model":"m","input":"x","text":{"format":{"type":"json_object"}}}`,
			map[string]string{"response_format": `{"type":"json_object"}`}},
		{"sampling", `{"model":"m","input":"x","temperature":0.2,"top_p":0.5,"max_output_tokens":99,"top_logprobs":3,"reasoning":{"effort":"xhigh"}}`,
			map[string]string{"temperature": `0.2`, "top_p": `0.5`, "max_completion_tokens": `99`, "logprobs": `true`, "top_logprobs": `3`, "reasoning_effort": `"high"`}},
		{"minimal effort", `{"model":"m","input":"x","reasoning":{"effort":"minimal"}}`, map[string]string{"reasoning_effort": `"low"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := translate(t, c.body)
			for path, want := range c.want {
				if got := gjson.GetBytes(b, path).Raw; got != want {
					t.Errorf("%s = %s; want %s\nbody %s", path, got, want, b)
				}
			}
		})
	}
}

// TestTranslateDropsWhatVLLMRejects: fields vLLM does not take, or that
// belong to OpenAI, never reach the upstream body.
func TestTranslateDropsWhatVLLMRejects(t *testing.T) {
	b := string(translate(t, `{"model":"m","input":"x","store":true,"metadata":{"a":"b"},"user":"u","safety_identifier":"s","prompt_cache_key":"k","service_tier":"flex","include":["reasoning.encrypted_content"],"reasoning":{"effort":"none","summary":"auto"},"text":{},"max_tool_calls":3,"client_metadata":{"x":1},"tool_choice":"none"}`))
	for _, k := range []string{"store", "metadata", "user", "safety_identifier", "prompt_cache_key", "service_tier", "include", "reasoning", "text", "max_tool_calls", "client_metadata", "tool_choice"} {
		if gjson.Get(b, k).Exists() {
			t.Errorf("upstream body has %q: %s", k, b)
		}
	}
}
