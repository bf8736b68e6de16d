package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/internal/apierror"
)

// chatOf translates body and fails the test on an error.
func chatOf(t *testing.T, body string) gjson.Result {
	t.Helper()
	r, err := parseRequest([]byte(body), false)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	b, err := toChat(r)
	if err != nil {
		t.Fatalf("toChat: %v", err)
	}
	if !json.Valid(b) {
		t.Fatalf("toChat produced invalid JSON: %s", b)
	}
	return gjson.ParseBytes(b)
}

func TestToChat(t *testing.T) {
	tests := []struct {
		name string
		body string
		want map[string]string // gjson path → raw JSON ("" = must not exist)
	}{
		{"system string and sampling",
			`{"model":"m","max_tokens":50,"system":"Be brief.","messages":[{"role":"user","content":"hi"}],
			 "stop_sequences":["END",""],"temperature":0.2,"top_p":0.9,"top_k":40,"stream":false}`,
			map[string]string{"messages.0": `{"role":"system","content":"Be brief."}`, "messages.1": `{"role":"user","content":"hi"}`,
				"max_tokens": `50`, "stop": `["END"]`, "temperature": `0.2`, "top_p": `0.9`, "top_k": `40`,
				"stream": `true`, "stream_options": `{"include_usage":true}`}},
		{"system blocks: billing line stripped, cache_control dropped",
			`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.328.d9f; cc_entrypoint=cli; cch=1a2b3;"},
			 {"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"Rules."}],
			 "messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral","ttl":"1h"}},{"type":"text","text":"b"}]}]}`,
			map[string]string{"messages.0.content": `"You are Claude Code.\n\nRules."`, "messages.1.content": `"a\nb"`}},
		{"mid-conversation system message stays in place",
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"do it"},{"role":"system","content":[{"type":"text","text":"# Environment"}]},
			 {"role":"assistant","content":"ok"},{"role":"ctx","content":"more"}]}`,
			map[string]string{"messages.0.role": `"user"`, "messages.1": `{"role":"system","content":"# Environment"}`,
				"messages.2": `{"role":"assistant","content":"ok"}`, "messages.3.role": `"user"`}},
		{"tool round trip",
			`{"model":"m","max_tokens":5,"tools":[{"name":"Glob","description":"Find files","input_schema":{"type":"object","properties":{"pattern":{"type":"string"}},"required":["pattern"]},"cache_control":{"type":"ephemeral"}},
			   {"type":"web_search_20250305","name":"web_search","max_uses":3},{"name":"Bare","input_schema":{"properties":{}},"defer_loading":true}],
			 "tool_choice":{"type":"any","disable_parallel_tool_use":true},
			 "messages":[{"role":"user","content":"use Glob"},
			  {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"Looking."},
			    {"type":"tool_use","id":"toolu_1","name":"Glob","input":{"pattern":"*.go", "a": {"z":1,"b":2}}}]},
			  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"a.go"},{"type":"text","text":"b.go"}]},
			    {"type":"tool_result","tool_use_id":"toolu_2","is_error":true,"content":"no such file"},{"type":"text","text":"<system-reminder>go on</system-reminder>"}]}]}`,
			map[string]string{
				"tools.#":                    `2`,
				"tools.0":                    `{"type":"function","function":{"name":"Glob","description":"Find files","parameters":{"type":"object","properties":{"pattern":{"type":"string"}},"required":["pattern"]}}}`,
				"tools.1.function":           `{"name":"Bare","parameters":{"properties":{},"type":"object"}}`,
				"tool_choice":                `"required"`,
				"parallel_tool_calls":        `false`,
				"messages.1":                 `{"role":"assistant","content":"Looking.","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"Glob","arguments":"{\"pattern\":\"*.go\",\"a\":{\"z\":1,\"b\":2}}"}}]}`,
				"messages.2":                 `{"role":"tool","content":"a.go\nb.go","tool_call_id":"toolu_1"}`,
				"messages.3":                 `{"role":"tool","content":"Error: no such file","tool_call_id":"toolu_2"}`,
				"messages.4":                 `{"role":"user","content":"<system-reminder>go on</system-reminder>"}`,
				"messages.#":                 `5`,
				"messages.1.reasoning":       ``,
				"messages.1.tool_calls.#":    `1`,
				"messages.0.content":         `"use Glob"`,
				"messages.2.tool_call_id":    `"toolu_1"`,
				"messages.3.tool_call_id":    `"toolu_2"`,
				"messages.4.role":            `"user"`,
				"messages.1.content":         `"Looking."`,
				"messages.1.tool_calls.0.id": `"toolu_1"`,
			}},
		{"tool_choice tool, none, auto; a server tool's choice falls back to auto",
			`{"model":"m","max_tokens":5,"tools":[{"name":"Read","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"Read"},"messages":[{"role":"user","content":"x"}]}`,
			map[string]string{"tool_choice": `{"function":{"name":"Read"},"type":"function"}`, "parallel_tool_calls": ``}},
		{"tool_choice none",
			`{"model":"m","max_tokens":5,"tools":[{"name":"Read","input_schema":{"type":"object"}}],"tool_choice":{"type":"none"},"messages":[{"role":"user","content":"x"}]}`,
			map[string]string{"tool_choice": `"none"`}},
		{"tool_choice naming a server tool",
			`{"model":"m","max_tokens":5,"tools":[{"name":"Read","input_schema":{"type":"object"}},{"type":"web_search_20250305","name":"web_search"}],"tool_choice":{"type":"tool","name":"web_search"},"messages":[{"role":"user","content":"x"}]}`,
			map[string]string{"tool_choice": `"auto"`, "tools.#": `1`}},
		{"only server tools: no tools, no choice",
			`{"model":"m","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"x"}]}`,
			map[string]string{"tools": ``, "tool_choice": ``}},
		{"images, and images returned by a tool",
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}},{"type":"text","text":"what is it?"}]},
			  {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Shot","input":{}}]},
			  {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"shot"},{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}]}`,
			map[string]string{"messages.0.content": `[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR"}},{"type":"text","text":"what is it?"}]`,
				"messages.1.tool_calls.0.function.arguments": `"{}"`,
				"messages.2": `{"role":"tool","content":"shot","tool_call_id":"t1"}`,
				"messages.3": `{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}`}},
		{"documents and search results as text",
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","title":"Notes","source":{"type":"text","media_type":"text/plain","data":"line"}},
			  {"type":"document","source":{"type":"base64","media_type":"text/plain","data":"aGVsbG8="}},
			  {"type":"search_result","title":"T","source":"https://s","content":[{"type":"text","text":"found"}]}]}]}`,
			map[string]string{"messages.0.content": `"Notes\nline\nhello\nT\nhttps://s\nfound"`}},
		{"thinking, context_management, metadata and hosted fields dropped; effort and format mapped",
			`{"model":"m","max_tokens":5,"thinking":{"type":"adaptive","display":"omitted"},"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},
			 "output_config":{"effort":"max","format":{"type":"json_schema","schema":{"type":"object"}}},"metadata":{"user_id":"{\"session_id\":\"s\"}"},
			 "service_tier":"auto","container":"c","mcp_servers":[],"cache_control":{"type":"ephemeral"},"inference_geo":"us","speed":"fast",
			 "messages":[{"role":"user","content":"x"}]}`,
			map[string]string{"reasoning_effort": `"high"`, "response_format": `{"type":"json_schema","json_schema":{"name":"output","schema":{"type":"object"}}}`,
				"thinking": ``, "context_management": ``, "metadata": ``, "user": ``, "service_tier": ``, "container": ``, "mcp_servers": ``, "cache_control": ``}},
		{"a final assistant message is continued",
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"The answer is"}]}`,
			map[string]string{"continue_final_message": `true`, "add_generation_prompt": `false`, "messages.1.content": `"The answer is"`}},
		{"HTML is not escaped",
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"<system-reminder>a & b</system-reminder>"}]}`,
			map[string]string{"messages.0.content": `"<system-reminder>a & b</system-reminder>"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := chatOf(t, tt.body)
			for path, want := range tt.want {
				v := got.Get(path)
				if want == "" {
					if v.Exists() {
						t.Errorf("%s = %s; want it absent", path, v.Raw)
					}
					continue
				}
				if v.Raw != want {
					t.Errorf("%s = %s\n want %s", path, v.Raw, want)
				}
			}
		})
	}
}

func TestToChatRefuses(t *testing.T) {
	tests := []struct{ name, body, msg string }{
		{"empty", ``, "empty"},
		{"not an object", `[1]`, "JSON object"},
		{"bad JSON", `{"model":`, "not a valid Messages request"},
		{"wrong type", `{"model":"m","max_tokens":"5","messages":[]}`, "max_tokens"},
		{"no model", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, "model"},
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"zero max_tokens", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"no messages", `{"model":"m","max_tokens":5,"messages":[]}`, "messages"},
		{"bad role", `{"model":"m","max_tokens":5,"messages":[{"role":"robot","content":"x"}]}`, "messages.0.role"},
		{"bad content", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":5}]}`, "messages.0.content"},
		{"unknown block", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"hologram"}]}]}`, "messages.0.content.0.type"},
		{"pdf", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBER"}}]}]}`, "plain-text documents"},
		{"file image", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "base64 or url"},
		{"tool_use without id", `{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"x","input":{}}]}]}`, "id and a name"},
		{"tool_use input not an object", `{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"1","name":"x","input":[1]}]}]}`, "input"},
		{"tool_result without id", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, "tool_use_id"},
		{"tool without schema", `{"model":"m","max_tokens":5,"tools":[{"name":"x"}],"messages":[{"role":"user","content":"x"}]}`, "tools.0.input_schema"},
		{"bad tool_choice", `{"model":"m","max_tokens":5,"tool_choice":{"type":"sometimes"},"messages":[{"role":"user","content":"x"}]}`, "tool_choice.type"},
		{"bad effort", `{"model":"m","max_tokens":5,"output_config":{"effort":"extreme"},"messages":[{"role":"user","content":"x"}]}`, "effort"},
		{"system image", `{"model":"m","max_tokens":5,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]}`, "system.0.type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseRequest([]byte(tt.body), false)
			if err == nil {
				_, err = toChat(r)
			}
			he, ok := err.(*apierror.Error)
			if !ok || he.Status != 400 {
				t.Fatalf("err = %v; want a 400", err)
			}
			if !strings.Contains(he.Msg, tt.msg) {
				t.Errorf("message %q does not mention %q", he.Msg, tt.msg)
			}
		})
	}
}

// Claude Code's real second turn (recorded from 2.1.328 through warmpath:
// a Glob call and its result) renders to chat messages that begin byte for
// byte with its first turn's, although its billing line differs per
// request and its mid-conversation system message changed from blocks to
// a string; and the same request always renders the same bytes.
func TestClaudeCodeTurnsSharePrefix(t *testing.T) {
	turn1, turn2 := readTurn(t, 1), readTurn(t, 2)
	m1, m2 := messagesRaw(t, turn1), messagesRaw(t, turn2)
	n1, n2 := len(gjson.GetBytes(turn1, "messages").Array()), len(gjson.GetBytes(turn2, "messages").Array())
	if n2 <= n1 {
		t.Fatalf("turn 2 has %d messages, turn 1 %d", n2, n1)
	}
	p1 := strings.TrimSuffix(m1, "]")
	if !strings.HasPrefix(m2, p1+",") {
		t.Fatalf("turn 2's chat messages do not begin with turn 1's:\n%.300s\n%.300s", p1[max(0, len(p1)-300):], m2[max(0, len(p1)-300):])
	}
	if again := messagesRaw(t, turn2); again != m2 {
		t.Error("the same request rendered differently twice")
	}
	chat := chatOf(t, string(turn1))
	if strings.Contains(chat.Raw, "x-anthropic-billing-header") || strings.Contains(chat.Raw, "cc_version") {
		t.Error("the billing line reached the chat body")
	}
	for _, field := range []string{"thinking", "context_management", "metadata", "output_config"} {
		if chat.Get(field).Exists() {
			t.Errorf("%s reached the chat body", field)
		}
	}
	if got := chat.Get("reasoning_effort").String(); got != "high" {
		t.Errorf("reasoning_effort = %q; want high (output_config.effort)", got)
	}
	if got := len(chat.Get("tools").Array()); got != len(gjson.GetBytes(turn1, "tools").Array()) {
		t.Errorf("%d tools; want all of Claude Code's client tools", got)
	}
	if !strings.HasPrefix(chat.Get("messages.0.content").String(), "You are a Claude agent") {
		t.Errorf("system message starts %.60q", chat.Get("messages.0.content").String())
	}
}

func readTurn(t *testing.T, n int) []byte {
	t.Helper()
	b, err := readTurnFile(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readTurnFile reads turn n of the recorded Claude Code run.
func readTurnFile(n int) ([]byte, error) {
	return os.ReadFile(fmt.Sprintf("testdata/claude_code_turn%d.json", n))
}

func messagesRaw(t *testing.T, body []byte) string {
	t.Helper()
	c := chatOf(t, string(body))
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(c.Get("messages").Raw)); err != nil {
		t.Fatal(err)
	}
	if b.String() != c.Get("messages").Raw {
		t.Fatal("chat messages are not compact JSON")
	}
	return b.String()
}

func TestSessionFromUserID(t *testing.T) {
	for in, want := range map[string]string{
		`{"device_id":"d","account_uuid":"","session_id":"6dcb-43bc"}`: "6dcb-43bc",
		"user_abc_account_1234_session_5678-9":                         "5678-9",
		"plain":                                                        "",
		`{"session_id":5}`:                                             "",
		`{not json`:                                                    "",
	} {
		if got := sessionFromUserID(in); got != want {
			t.Errorf("sessionFromUserID(%q) = %q; want %q", in, got, want)
		}
	}
}
