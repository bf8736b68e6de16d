package hftok

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// corpusTexts are texts chosen to reach every branch of the pre-tokenizer
// and the added-token matcher: plain ASCII, code, Unicode (accents, CJK,
// emoji, combining marks, other scripts and digits), whitespace runs,
// contractions and special tokens typed into text.
var corpusTexts = []string{
	"Hello, world! How are you doing today?",
	"The quick brown fox jumps over the lazy dog 1234567890 times.",
	"I'm sure they'll say we've done what you'd've expected; it's THEIR'S, not OUR'S. 'Tis 'RE 'Ve 'LL 'D 'M",
	"func main() {\n\tfmt.Println(\"hi\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i*2 // comment\n\t}\n}\n",
	"def f(x):\n    return {'a': [1, 2.5, -3e10], \"b\": None}\n\n\nclass A(B):\n    pass\n",
	"<div class=\"x\">&amp; <b>bold</b></div>\r\n<script>if (a<b && c>d) {}</script>",
	"SELECT id, name FROM users WHERE created_at >= '2024-01-01' ORDER BY id DESC LIMIT 50;",
	"Café naïve résumé coöperate Ærøskøbing straße ΑΒΓ αβγ Привет мир",
	"你好，世界！这是一个测试。日本語のテキストも。한국어 텍스트.",
	"Emoji: 🎉🚀👍🏽 👨‍👩‍👧‍👦 ❤️ 🇫🇷 and math ∑∫√∞ ≠ ≤ ≥",
	"Decomposed: e\u0301 a\u0308 n\u0303 vs composed é ä ñ; Hangul jamo \u1100\u1161",
	"Digits: ١٢٣ ४५६ ¼ ½ Ⅻ 12345678901234567890 3.14159 1,000,000",
	"   leading spaces, trailing spaces   ",
	"tabs\t\tand\t \t mixed   \n\n\n   newlines\r\n\r\n  \n end",
	"                                                                  many spaces",
	"\n\n\nleading newlines and trailing\n\n\n",
	"Special tokens in text: <|im_start|>user\nhi<|im_end|> <|endoftext|> <|begin_of_text|> <|eot_id|> <think>x</think> <|start_header_id|>",
	"Partial specials: <|im_start <|im_end| |im_end|> <| |> << >> <<|im_end|>>",
	"Punctuation runs: ...!!!??? --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
	"Mixed: abc123def 456ghi jkl789 x1y2z3 A1B2 ab12cd34ef56",
	"URLs: https://example.com/path?query=1&b=2#frag user@example.org C:\\Windows\\System32",
	"Base64: SGVsbG8gV29ybGQhIFRoaXMgaXMgYSBsb25nIGJhc2U2NCBzdHJpbmcgdGhhdCBrZWVwcyBnb2luZyBhbmQgZ29pbmcgYW5kIGdvaW5n",
	"Long word: " + strings.Repeat("supercalifragilisticexpialidocious", 20),
	"Nonbreaking\u00a0space, thin\u2009space, ideographic\u3000space, en\u2002quad, line\u2028sep",
	"Quotes: “curly” ‘single’ «guillemets» „low“ 'straight' \"double\" `back`",
	"x",
	" ",
	"\n",
	"'",
	"'s",
}

// corpusBodies are vLLM /tokenize bodies: each text as a completions
// prompt, then chats that exercise the template (system, multi-turn,
// tools, tool calls, tool results, content parts, reasoning).
func corpusBodies(model string) []string {
	var out []string
	add := func(v map[string]any) {
		v["model"] = model
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		out = append(out, string(b))
	}
	for _, t := range corpusTexts {
		add(map[string]any{"prompt": t})
	}
	add(map[string]any{"prompt": "no special tokens", "add_special_tokens": false})
	for i, t := range corpusTexts {
		add(map[string]any{"messages": []any{
			map[string]any{"role": "system", "content": "You are a helpful assistant."},
			map[string]any{"role": "user", "content": t},
		}, "add_generation_prompt": true})
		if i%3 == 0 {
			add(map[string]any{"messages": []any{map[string]any{"role": "user", "content": t}}, "add_generation_prompt": false})
		}
	}
	for _, c := range chats {
		add(c)
	}
	return out
}

var weatherTool = map[string]any{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "Get the weather for a city; returns °C.",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string", "description": "城市 name"}, "days": map[string]any{"type": "integer"},
	}, "required": []any{"city"}},
}}

var chats = []map[string]any{
	{"messages": []any{
		map[string]any{"role": "system", "content": "Be terse."},
		map[string]any{"role": "user", "content": "What's 2+2?"},
		map[string]any{"role": "assistant", "content": "4."},
		map[string]any{"role": "user", "content": "And 3+3?\n\nShow work."},
	}},
	{"messages": []any{
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "part one"}, map[string]any{"type": "text", "text": "part two"}}},
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris", "days": 3}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"晴\"}"},
		map[string]any{"role": "tool", "tool_call_id": "call_2", "content": "second result"},
		map[string]any{"role": "assistant", "content": "It is 21 °C and sunny in Paris."},
		map[string]any{"role": "user", "content": "Thanks! <|im_end|> sneaky"},
	}, "tools": []any{weatherTool}},
	{"messages": []any{
		map[string]any{"role": "system", "content": "You can call tools."},
		map[string]any{"role": "user", "content": "Weather in 東京 and Zürich?"},
		map[string]any{"role": "assistant", "content": "Let me check.", "tool_calls": []any{
			map[string]any{"id": "a", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city":"東京"}`}},
			map[string]any{"id": "b", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": ""}},
		}},
		map[string]any{"role": "tool", "tool_call_id": "a", "content": []any{map[string]any{"type": "text", "text": "18"}, map[string]any{"type": "text", "text": "cloudy"}}},
	}, "tools": []any{weatherTool, map[string]any{"type": "function", "function": map[string]any{"name": "noop"}}}},
	{"messages": []any{
		map[string]any{"role": "user", "content": "Think first."},
		map[string]any{"role": "assistant", "content": "<think>\nhmm, 6*7\n</think>\n\n42"},
		map[string]any{"role": "user", "content": "Again?"},
	}},
	{"messages": []any{
		map[string]any{"role": "system", "content": "sys one"},
		map[string]any{"role": "system", "content": "sys two"},
		map[string]any{"role": "user", "content": "   spaced   \n\n"},
	}, "add_generation_prompt": true},
	{"messages": []any{map[string]any{"role": "user", "content": ""}}},
}

// longChat is a chat of about n tokens: an agent's turn with a system
// prompt, the corpus, then this repository's own Go source and docs as
// the files an agent would paste (code and prose, about 3.5 bytes a
// token).
func longChat(model string, n int) []byte {
	var sb strings.Builder
	sb.WriteString(strings.Join(corpusTexts, "\n"))
	files, _ := filepath.Glob("../../gateway/*.go")
	// testdata/corpus-readme.md is the README as it stood when the
	// TokenizeBody16k figure in docs/guides/tokenizer.md was measured
	// ("the corpus and this repository's README and gateway sources"):
	// pinned, so rewriting the README does not change the benchmark's input.
	files = append([]string{"testdata/corpus-readme.md"}, files...)
	for i := 0; sb.Len() < n*7/2 && i < len(files); i++ {
		b, err := os.ReadFile(files[i])
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(&sb, "\n\n=== %s ===\n%s", files[i], b[:min(len(b), n*7/2-sb.Len())])
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": []any{
		map[string]any{"role": "system", "content": "You are a coding agent. Follow the repository's conventions."},
		map[string]any{"role": "user", "content": sb.String()},
	}, "add_generation_prompt": true})
	return b
}
