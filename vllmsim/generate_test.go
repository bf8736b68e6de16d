package vllmsim

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/tokenizer/simtok"
)

func testTools() []Tool {
	return []Tool{
		{Type: "function", Function: ToolFunction{Name: "read_file", Parameters: json.RawMessage(
			`{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"}},"required":["path"]}`)}},
		{Type: "function", Function: ToolFunction{Name: "search", Parameters: json.RawMessage(`{"type":"object",
			"properties":{"mode":{"type":"string","enum":["fast","slow"]},"n":{"type":"integer"},"x":{"type":"number"},
			"ok":{"type":["boolean","null"]},"tags":{"type":"array","items":{"type":"string"}},
			"opt":{"type":"object","properties":{"deep":{"type":"boolean"}},"required":["deep"]}},
			"required":["ok","mode","n","x","tags","opt"]}`)}},
	}
}

func TestChooseTool(t *testing.T) {
	tools := testTools()
	user := func(s string) []Message { return []Message{{Role: "user", Content: s}} }
	for _, tc := range []struct {
		name   string
		choice string
		msgs   []Message
		want   string // "" = no call
		err    bool
	}{
		{"auto no mention", ``, user("hello there"), "", false},
		{"auto mention", ``, user("please use the search tool"), "search", false},
		{"auto call tool", `"auto"`, user("call tool read_file now"), "read_file", false},
		{"auto earliest", ``, user("read_file or search?"), "read_file", false},
		{"auto partial word", ``, user("research this"), "", false},
		{"auto before a trailing system message", ``, []Message{{Role: "user", Content: "use search"}, {Role: "system", Content: "# Environment"}}, "search", false},
		{"auto after tool result", ``, []Message{{Role: "user", Content: "use search"}, {Role: "tool", Content: "search results"}}, "", false},
		{"auto after tool result and reminder", ``, []Message{{Role: "tool", Content: "use search"}, {Role: "system", Content: "use search"}}, "", false},
		{"none", `"none"`, user("use search"), "", false},
		{"required default", `"required"`, user("anything"), "read_file", false},
		{"required mention", `"required"`, user("search it"), "search", false},
		{"named", `{"type":"function","function":{"name":"search"}}`, user("hi"), "search", false},
		{"named unknown", `{"type":"function","function":{"name":"nope"}}`, user("hi"), "", true},
		{"bad", `"sometimes"`, user("hi"), "", true},
	} {
		got, err := chooseTool(tools, json.RawMessage(tc.choice), tc.msgs)
		if (err != nil) != tc.err {
			t.Errorf("%s: err = %v, want error %v", tc.name, err, tc.err)
			continue
		}
		name := ""
		if got != nil {
			name = got.Function.Name
		}
		if name != tc.want {
			t.Errorf("%s: tool %q, want %q", tc.name, name, tc.want)
		}
	}
}

func TestToolArguments(t *testing.T) {
	tools := testTools()
	a := toolArguments(tools[0].Function.Parameters, 1)
	var m map[string]any
	if err := json.Unmarshal([]byte(a), &m); err != nil {
		t.Fatalf("arguments %q: %v", a, err)
	}
	if _, ok := m["path"].(string); !ok || len(m) != 1 {
		t.Errorf("read_file arguments %q: want only a string path", a)
	}
	if a != toolArguments(tools[0].Function.Parameters, 1) {
		t.Error("arguments not deterministic")
	}
	b := toolArguments(tools[1].Function.Parameters, 2)
	if !strings.HasPrefix(b, `{"ok": true, "mode": "fast", "n": 1, "x": 1.5, "tags": ["`) || !strings.HasSuffix(b, `"], "opt": {"deep": true}}`) {
		t.Errorf("search arguments = %s", b)
	}
	if got := toolArguments(nil, 0); got != "{}" {
		t.Errorf("no schema: %s", got)
	}
}

func TestPlanOutput(t *testing.T) {
	prompt := Tokenize("some prompt words")
	p := planOutput(prompt, genSpec{maxTokens: 1000, eos: IMEndToken})
	if p.finish != finishStop || p.tokens[len(p.tokens)-1] != IMEndToken || len(p.tokens) < 17 || len(p.tokens) > 64 {
		t.Errorf("natural: finish %s, %d tokens", p.finish, len(p.tokens))
	}
	q := planOutput(prompt, genSpec{maxTokens: 1000, eos: IMEndToken})
	if Detokenize(p.tokens) != Detokenize(q.tokens) {
		t.Error("output not deterministic")
	}
	p = planOutput(prompt, genSpec{maxTokens: 500, ignoreEOS: true, eos: IMEndToken})
	if p.finish != finishLength || len(p.tokens) != 500 {
		t.Errorf("ignore_eos: finish %s, %d tokens", p.finish, len(p.tokens))
	}
	p = planOutput(prompt, genSpec{maxTokens: 5, eos: IMEndToken})
	if p.finish != finishLength || len(p.tokens) != 5 {
		t.Errorf("short max: finish %s, %d tokens", p.finish, len(p.tokens))
	}
	p = planOutput(prompt, genSpec{maxTokens: 1000, minTokens: 200, eos: IMEndToken})
	if len(p.tokens) != 201 {
		t.Errorf("min_tokens: %d tokens", len(p.tokens))
	}
	full := planOutput(prompt, genSpec{maxTokens: 100, ignoreEOS: true, eos: IMEndToken})
	text := Detokenize(full.tokens)
	stop := Word(full.tokens[10])
	p = planOutput(prompt, genSpec{maxTokens: 100, ignoreEOS: true, stop: []string{"zzzz", stop}, eos: IMEndToken})
	out := string(AppendText(nil, simtok.NoPrev, p.tokens, true))
	if p.finish != finishStop || p.stopReason != stop || strings.Contains(out, stop) && strings.Index(text, stop) >= len(out) || len(p.tokens) > 10 {
		t.Errorf("stop %q: finish %s reason %q, output %q", stop, p.finish, p.stopReason, out)
	}
	tool := testTools()[0]
	p = planOutput(prompt, genSpec{maxTokens: 1000, eos: IMEndToken, tool: &tool})
	if p.finish != finishToolCalls || p.toolName != "read_file" || p.tokens[0] != ToolCallStartToken {
		t.Errorf("tool call plan: %+v", p)
	}
}

func TestGeneratedOutputRoundTrip(t *testing.T) {
	for i := 0; i < 200; i++ {
		prompt := Tokenize(strings.Repeat("word ", i+1))
		p := planOutput(prompt, genSpec{maxTokens: 300, eos: IMEndToken})
		content := p.tokens[:len(p.tokens)-1] // drop EOS
		if got := Tokenize(Detokenize(content)); !slices.Equal(got, content) {
			t.Fatalf("generated output does not round-trip: %v vs %v", got, content)
		}
	}
}

// A reply generated for one turn and sent back in the next matches the
// tokens the engine generated (and so the decode blocks it cached).
func TestGeneratedReplyIsNextTurnPrefix(t *testing.T) {
	msgs, tools := conversation()
	for _, tool := range []*Tool{nil, &tools[0]} {
		turn := msgs[:2]
		prompt := TokenizeChat(turn, tools, true)
		p := planOutput(prompt, genSpec{maxTokens: 1000, eos: IMEndToken, tool: tool, toolSeed: 7})
		reply := Message{Role: "assistant"}
		if p.toolName != "" {
			reply.ToolCalls = []ToolCall{{ID: "x", Type: "function", Function: FunctionCall{Name: p.toolName, Arguments: p.toolArgs}}}
		} else {
			reply.Content = string(AppendText(nil, simtok.NoPrev, p.tokens, true))
		}
		next := TokenizeChat(append(slices.Clone(turn), reply, Message{Role: "user", Content: "go on"}), tools, true)
		full := append(slices.Clone(prompt), p.tokens...)
		if !slices.Equal(next[:len(full)], full) {
			t.Fatalf("tool=%v: prompt+output is not a prefix of the next turn", tool != nil)
		}
	}
}

// conversation is an agent-style exchange exercising every message shape
// (a copy of simtok's test conversation).
func conversation() ([]Message, []Tool) {
	tools := []Tool{{Type: "function", Function: ToolFunction{Name: "read_file", Description: "Read a file.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)}}}
	msgs := []Message{
		{Role: "system", Content: "You are a helpful agent."},
		{Role: "user", Content: "Please use the read_file tool on main.go"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Type: "function", Function: FunctionCall{Name: "read_file", Arguments: `{"path": "main.go"}`}}}},
		{Role: "tool", ToolCallID: "call_1", Content: "package main\n\nfunc main() {}"},
		{Role: "assistant", Content: "The file defines an empty main."},
		{Role: "user", Content: "Thanks! And now?"},
		{Role: "assistant", Content: "Done.", ToolCalls: []ToolCall{{Type: "function", Function: FunctionCall{Name: "read_file", Arguments: `{"path":"a"}`}}, {Type: "function", Function: FunctionCall{Name: "read_file"}}}},
		{Role: "tool", Content: ""},
		{Role: "developer", Content: "be brief"},
	}
	return msgs, tools
}

func BenchmarkDetokenize(b *testing.B) {
	p := planOutput([]uint32{1, 2, 3}, genSpec{maxTokens: 100000, ignoreEOS: true, eos: IMEndToken})
	dst := make([]byte, 0, len(p.tokens)*6)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendText(dst[:0], simtok.NoPrev, p.tokens, true)
	}
	b.ReportMetric(float64(len(p.tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
